"""Progress: a tqdm bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import io

from enkflow.progress import Counter, progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_off_a_terminal():
    out = io.StringIO()
    assert list(progress(range(3), desc="work", stream=out)) == [0, 1, 2]
    assert out.getvalue().splitlines() == ["work: 1/3", "work: 2/3", "work: 3/3"]
    c = Counter("cycle", stream=out)
    c(10, 20)
    assert out.getvalue().splitlines()[-1] == "cycle: 10/20"


def test_a_bar_on_a_terminal():
    out = Tty()
    assert list(progress(range(4), desc="work", stream=out)) == [0, 1, 2, 3]
    assert "\r" in out.getvalue() and "0/4 [" in out.getvalue() and "work: 1/4\n" not in out.getvalue()  # tqdm
    c = Counter("cycle", stream=out)
    c(5, 10)
    c.close()
    assert "/10 [" in out.getvalue()
