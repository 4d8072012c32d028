"""Shared-memory segment names: a process tree killed at once leaves its rings' and progress pages'
names in /dev/shm; the next segment made on the node removes them, and only them."""

from __future__ import annotations

import os
import subprocess
import sys

from enkflow.output.heartbeat import Heartbeat
from enkflow.shm_names import new_segment, shm_dir


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)


def test_a_new_segment_removes_the_names_whose_maker_is_dead_and_no_other() -> None:
    pid, d = _dead_pid(), shm_dir()
    stale = [d / f"enkflow-output-{pid}-0123abcd", d / f"enkflow-output-beat-{pid}-4567cdef"]
    kept = [d / f"enkflow-output-beat-{os.getpid()}-89abcdef",  # a live maker's
            d / f"enkflow-output-{pid}-notahexx", d / f"enkflow-outputx-{pid}-0123abcd"]  # not a segment's name
    for p in stale + kept:
        p.write_bytes(b"")
    try:
        path = new_segment("output-beat")
        assert [p.exists() for p in stale] == [False, False]
        assert [p.exists() for p in kept] == [True, True, True]
        assert path.parent == d and path.name.startswith(f"enkflow-output-beat-{os.getpid()}-") and not path.exists()
    finally:
        for p in stale + kept:
            p.unlink(missing_ok=True)


def test_a_progress_page_is_made_under_that_rule() -> None:
    pid = _dead_pid()
    stale = shm_dir() / f"enkflow-output-{pid}-0123abcd"
    stale.write_bytes(b"")
    hb = Heartbeat.create()
    try:
        assert not stale.exists() and hb.path.exists()
    finally:
        stale.unlink(missing_ok=True)
        hb.unlink()
        hb.close()
