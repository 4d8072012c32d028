"""``kill -9`` of ``enkflow run`` alone, at a chosen moment, and what it leaves behind.

A :class:`StudyProcesses` follows every process of one study (the launcher's descendants, seen
every ``poll_s`` seconds while it runs), so that a test can tell, by the study's own pids, whether
any of them (or a ``/dev/shm`` segment one of them made) outlives the study. Used by
``tests/online/test_online_orphans.py``; importable by benchmarks that put ``testing/`` on ``sys.path``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from enkflow.shm_names import maker_pid, shm_dir


def enkflow_run(toml: Path, log: Path) -> subprocess.Popen:
    """``python -m enkflow run TOML --quiet`` in its own session (a kill of it reaches only it), stderr to ``log``."""
    with open(log, "ab") as err:
        return subprocess.Popen([sys.executable, "-m", "enkflow", "run", str(toml), "--quiet"], cwd=toml.parent,
                                stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)


@dataclass
class StudyProcesses:
    """Every process seen under the launchers followed (pid -> psutil handle, creation time checked)."""

    seen: dict[int, psutil.Process] = field(default_factory=dict)

    def look(self, launcher: subprocess.Popen) -> None:
        try:
            for p in [psutil.Process(launcher.pid), *psutil.Process(launcher.pid).children(recursive=True)]:
                self.seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass

    def follow(self, launcher: subprocess.Popen, *, for_s: float | None = None, poll_s: float = 0.05) -> int | None:
        """Watch ``launcher``'s descendants until it exits (its status) or ``for_s`` seconds pass (None)."""
        t_end = None if for_s is None else time.monotonic() + for_s
        while launcher.poll() is None:
            self.look(launcher)
            if t_end is not None and time.monotonic() >= t_end:
                return None
            time.sleep(poll_s)
        return launcher.returncode

    def alive(self) -> list[psutil.Process]:
        """The processes seen that still run (a zombie does not count)."""
        out = []
        for p in self.seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out

    def wait_gone(self, limit_s: float) -> list[psutil.Process]:
        """Wait until none runs, at most ``limit_s`` seconds; those still running."""
        t_end = time.monotonic() + limit_s
        while (alive := self.alive()) and time.monotonic() < t_end:
            time.sleep(0.1)
        return alive

    def segments(self) -> list[Path]:
        """The shared-memory segments one of these processes made that still exist."""
        return [p for p in shm_dir().glob("enkflow-output-*") if maker_pid(p.name) in self.seen]

    def kill_all(self) -> None:
        """SIGKILL what still runs (a failed test's cleanup)."""
        for p in self.alive():
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
