"""Progress of long work: a tqdm bar on a terminal, plain lines otherwise (logs, pipes, CI)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sized
from typing import TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress(items: Iterable[T], *, total: int | None = None, desc: str = "", stream: TextIO | None = None,
             every: int = 1) -> Iterator[T]:
    """Yield ``items``, showing progress on ``stream`` (default stderr): a tqdm bar when the
    stream is a terminal, else one line ``desc: i/total`` every ``every`` items and at the end."""
    stream = stream or sys.stderr
    if total is None and isinstance(items, Sized):
        total = len(items)
    if getattr(stream, "isatty", lambda: False)():
        yield from tqdm(items, total=total, desc=desc, file=stream, leave=False)
        return
    i = 0
    for i, item in enumerate(items, 1):
        yield item
        if i % every == 0 or i == total:
            print(f"{desc}: {i}/{total if total is not None else '?'}", file=stream, flush=True)


class Counter:
    """A progress callback ``counter(done, total)`` for work that reports its own count (the
    Lorenz-96 cycles): a tqdm bar on a terminal, else a line ``desc: done/total`` per call.
    :meth:`close` ends the bar."""

    def __init__(self, desc: str = "", stream: TextIO | None = None):
        self.desc, self.stream = desc, stream or sys.stderr
        self._bar: tqdm | None = None
        self._tty = getattr(self.stream, "isatty", lambda: False)()

    def __call__(self, done: int, total: int, note: str = "") -> None:
        """``done`` of ``total``; ``note`` (e.g. the workers alive) after the count."""
        if not self._tty:
            print(f"{self.desc}: {done}/{total}" + (f", {note}" if note else ""), file=self.stream, flush=True)
            return
        if self._bar is None:
            self._bar = tqdm(total=total, desc=self.desc, file=self.stream, leave=False)
        self._bar.update(done - self._bar.n)
        if note:
            self._bar.set_postfix_str(note)

    def clear(self) -> None:
        """Take the bar off its line for a moment, so that a message printed next is not drawn through it."""
        if self._bar is not None:
            self._bar.clear()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
