"""The records of the processes under a launcher's lease: ``EXPDIR/lease/procs/HOST-PID.json``.

A watched process registers itself (:func:`register`) and beats its record once per look at the
lease: the beat is the record's modification time, set to a counter that grows by one each time,
so a rerun compares it only for change, by its own monotonic clock, never with a clock of another
node. A rerun (:func:`wait_gone`) waits for the records of earlier launchers' processes:

* a record whose process is on this node and dead is dropped at once;
* one on another node counts as gone when its file goes (the process ended normally) or when its
  beat has not moved for :data:`SILENT_BEATS` of its look periods (killed with -9 by mpiexec or a
  grace kill, ended by ``os._exit``, or its node lost), else at the bound the caller gives.

A process whose record cannot be beaten for that long (a shared file system stalled for four
look periods) is taken for gone although it runs: it still stops at its next look, seeing the
rerun's lease. At a clean end the launcher drops its own records (:func:`forget_ended`): its jobs
ended, and a process ended without its exit handler would otherwise leave one.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from enkflow.errors import EnkflowError
from enkflow.fsutil import read_json, write_json_atomic
from enkflow.jobs.files import hostname
from enkflow.jobs.process import process_alive

PROCS_DIR = "procs"
SILENT_BEATS = 4  # look periods without a beat after which a process on another node counts as gone


@dataclass(frozen=True)
class LeasedProcess:
    """A record: ``pid`` (created at ``ctime``, s) on ``host``, started under lease ``holder``, looking
    at the lease (and beating its record) at most every ``period_s`` seconds (0: unknown)."""

    path: Path
    host: str
    pid: int
    ctime: float
    holder: str
    role: str
    period_s: float

    @property
    def here(self) -> bool:
        return self.host == hostname()

    def alive(self) -> bool:
        """Whether it may still run (a process on another node cannot be asked: see :class:`_Beats`)."""
        return not self.here or process_alive(self.pid, self.ctime)


@dataclass
class OwnRecord:
    """This process's record; :meth:`beat` once per look at the lease."""

    path: Path
    beats: int = 0

    def beat(self) -> None:
        self.beats += 1
        try:
            os.utime(self.path, (self.beats, self.beats))
        except OSError:  # removed by the launcher at its end, or storage stalled: a missed beat
            pass

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def register(directory: Path, holder: str, role: str, period_s: float) -> OwnRecord:
    """This process's record in ``directory/procs``, removed at a normal exit, and at a SIGTERM that
    would end the process at once (no handler of its own); one that cannot be written is never beaten."""
    own = OwnRecord(directory / PROCS_DIR / f"{hostname()}-{os.getpid()}.json")
    try:
        write_json_atomic(own.path, {"host": hostname(), "pid": os.getpid(), "ctime": psutil.Process().create_time(),
                                     "holder": holder, "role": role, "period_s": period_s}, durable=False)
    except EnkflowError as exc:  # a rerun then cannot wait for this process; the watch itself still works
        print(f"enkflow {role}: cannot register under the launcher's lease: {exc}", file=sys.stderr, flush=True)
        return own
    atexit.register(own.remove)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def die(signum: int, frame: object) -> None:
            own.remove()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        signal.signal(signal.SIGTERM, die)
    return own


def records(directory: Path) -> list[LeasedProcess]:
    """The records in ``directory/procs``; one cut short or emptied by a crash (a write that was not
    durable) names nothing and is removed."""
    out = []
    for p in sorted((directory / PROCS_DIR).glob("*.json")):
        try:
            d = read_json(p) or {}
            out.append(LeasedProcess(p, str(d["host"]), int(d["pid"]), float(d["ctime"]), str(d["holder"]),
                                     str(d.get("role", "?")), float(d.get("period_s", 0.0))))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # JSONDecodeError is a ValueError
            p.unlink(missing_ok=True)
    return out


@dataclass
class _Beats:
    """Whether records on other nodes still beat, judged by this process's monotonic clock."""

    seen: dict[Path, tuple[int, float]] = field(default_factory=dict)  # path -> (mtime_ns, when it last moved)

    def silent(self, r: LeasedProcess, now: float) -> bool:
        try:
            mtime = r.path.stat().st_mtime_ns
        except OSError:
            return True  # the record went: its process ended
        last = self.seen.get(r.path)
        if last is None or last[0] != mtime:
            self.seen[r.path] = (mtime, now)
            return False
        return r.period_s > 0 and now - last[1] > SILENT_BEATS * r.period_s


def wait_gone(directory: Path, holder: str, bound_s: float,
              say: Callable[[str], None] | None = None) -> list[LeasedProcess]:
    """Wait until the processes of launchers other than ``holder`` are gone (at most ``bound_s``
    seconds), kill those of this node still there, remove their records; returns them."""
    earlier = [r for r in records(directory) if r.holder != holder]
    running = [r for r in earlier if r.alive()]
    if running and say is not None:
        say(f"stopping {len(running)} process(es) an earlier run of this experiment left running: "
            + ", ".join(f"{r.role} (pid {r.pid} on {r.host})" for r in running))
    beats = _Beats()
    deadline = time.monotonic() + bound_s
    while running and time.monotonic() < deadline:
        time.sleep(0.1)
        now = time.monotonic()
        running = [r for r in running if r.alive() and r.path.exists() and (r.here or not beats.silent(r, now))]
    for r in running:
        if r.here:
            _kill(r)
    for r in earlier:
        r.path.unlink(missing_ok=True)
    return earlier


def forget_ended(directory: Path, holder: str) -> None:
    """At the launcher's clean end (its jobs ended or cancelled): remove the records of its
    processes, but those of this node that still run (a rerun judges them itself)."""
    for r in records(directory):
        if r.holder == holder and not (r.here and r.alive()):
            r.path.unlink(missing_ok=True)


def _kill(r: LeasedProcess, wait_s: float = 5.0) -> None:
    """SIGKILL ``r`` (on this node) and wait until it is gone, so that what it held (ports) is free."""
    try:
        os.kill(r.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait_s
    while r.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
