"""A lease on the launcher: the processes ``enkflow run`` starts stop by themselves once it is gone.

The launcher (:class:`LeaseHolder`) rewrites ``EXPDIR/lease/lease.json`` every ``period_s`` seconds
with its own id and a counter it increases by one each time. The file is on the experiment's
(shared) storage, so a job on any node reads it. A process the launcher started finds the lease in
its environment (:class:`LeaseVariable`) and watches it (:func:`watch_from_environment`): the lease
*lapses* when the counter has not moved for ``timeout_s`` seconds of the watcher's own monotonic
clock, or at once when the file names another launcher (a rerun took over) or says the launcher
ended. No wall clock is compared with another node's, so clock skew cannot make a lease lapse or
last. A lapsed watcher stops its process as a cancel would (SIGTERM, or the process's own stop), and
kills it ``grace_s`` later if it is still there; the process therefore ends at most
``timeout_s + 1.25 period_s + grace_s`` after its launcher's last renewal (a watcher looks every
``period_s`` to ``1.25 period_s``, drawn at random, so that thousands of them do not look at once).

Every watcher registers its process (``EXPDIR/lease/procs/HOST-PID.json``) and beats that record at
each look (:mod:`enkflow.jobs.lease_procs`), so that a rerun finds the processes of an earlier
launcher (killed with -9, or its node lost) and waits for them to be gone before it starts its own
(:func:`stop_earlier`), and tells a dead process on another node by its silent record. A process started by hand has no lease in its
environment and watches nothing.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from enkflow.errors import EnkflowError
from enkflow.fsutil import read_json, write_json_atomic
from enkflow.jobs.files import hostname
from enkflow.jobs.lease_procs import PROCS_DIR, LeasedProcess, register, wait_gone

LEASE_FILE = "lease.json"
# Long enough for a shared file system's failover (a Lustre one stalls writes for more than 30 s):
# a shorter lease stops every process of a study whose launcher is alive. A rerun after a lost node
# waits about half of it for the records of processes that no longer beat (enkflow.jobs.lease_procs).
DEFAULT_TIMEOUT_S = 120.0
JITTER = 0.25  # a watcher's look period is drawn in [period, (1 + JITTER) * period]: no look in step


class LeaseVariable(StrEnum):
    """The environment variables that hand a started process its lease."""

    DIRECTORY = "ENKFLOW_LEASE_DIR"  # EXPDIR/lease
    ID = "ENKFLOW_LEASE_ID"  # the launcher's id: a lease naming another one has lapsed
    TIMEOUT = "ENKFLOW_LEASE_TIMEOUT"  # seconds without a renewal before the lease lapses


def period_for(timeout_s: float) -> float:
    """Seconds between renewals (and between a watcher's looks, less its jitter) for a lease of
    ``timeout_s`` seconds: eight renewals per timeout, so a slow write or two on shared storage does
    not lapse it. Every watcher opens the lease once per look and beats its record: N processes
    make about ``2 N / period`` metadata operations per second (16,384 at the default 120 s: 2,200/s)."""
    return timeout_s / 8.0


@dataclass(frozen=True)
class LeaseRecord:
    """What ``lease.json`` says: the launcher ``holder`` (its id), its ``counter``, whether it ``ended``."""

    holder: str
    counter: int
    ended: bool

    @classmethod
    def read(cls, directory: Path) -> LeaseRecord | None:
        """The lease in ``directory``, or None while it cannot be read (missing, being replaced)."""
        try:
            d = read_json(directory / LEASE_FILE)
            return None if d is None else cls(str(d["holder"]), int(d["counter"]), bool(d.get("ended", False)))
        except (EnkflowError, OSError, ValueError, KeyError, TypeError):
            return None


class LeaseHolder:
    """The launcher's side: renews the lease in ``directory`` on a thread until :meth:`close`."""

    def __init__(self, directory: Path, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.directory = Path(directory)
        self.timeout_s = timeout_s
        self.period_s = period_for(timeout_s)
        self.holder = secrets.token_hex(8)
        self._counter = 0
        self._stop = threading.Event()
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / PROCS_DIR).mkdir(exist_ok=True)
        self._write(ended=False)
        self._thread = threading.Thread(target=self._renew, name="enkflow-lease", daemon=True)
        self._thread.start()

    @property
    def env(self) -> dict[str, str]:
        """The environment a started process needs to watch this lease."""
        return {LeaseVariable.DIRECTORY.value: str(self.directory), LeaseVariable.ID.value: self.holder,
                LeaseVariable.TIMEOUT.value: f"{self.timeout_s:g}"}

    def _write(self, *, ended: bool) -> None:
        write_json_atomic(self.directory / LEASE_FILE, {"holder": self.holder, "counter": self._counter, "ended": ended,
                                                        "host": hostname(), "pid": os.getpid(),
                                                        "period_s": self.period_s, "timeout_s": self.timeout_s},
                          durable=False)

    def _renew(self) -> None:
        while not self._stop.wait(self.period_s):
            self._counter += 1
            try:
                self._write(ended=False)
            except EnkflowError as exc:  # a missed renewal is harmless; enough of them lapse the lease
                print(f"enkflow: cannot renew the lease: {exc}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Stop renewing and say the launcher ended: every watcher stops at its next look."""
        self._stop.set()
        self._thread.join()
        try:
            self._write(ended=True)
        except EnkflowError as exc:  # the watchers then stop on the timeout instead
            print(f"enkflow: cannot end the lease: {exc}", file=sys.stderr, flush=True)


class Verdict(StrEnum):
    """What a watcher's look at the lease found."""

    HELD = "held"
    SILENT = "silent"  # no renewal for the timeout
    TAKEN = "taken"  # another launcher holds it (a rerun)
    ENDED = "ended"  # the launcher ended


class LeaseWatch:
    """A process's side: judges the lease by its own monotonic clock (``now`` in seconds)."""

    def __init__(self, directory: Path, holder: str, timeout_s: float, now: float):
        self.directory, self.holder, self.timeout_s = Path(directory), holder, timeout_s
        self._counter: int | None = None
        self._moved = now

    def look(self, now: float) -> Verdict:
        rec = LeaseRecord.read(self.directory)
        if rec is not None and rec.holder != self.holder:
            return Verdict.TAKEN
        if rec is not None and rec.ended:
            return Verdict.ENDED
        if rec is not None and rec.counter != self._counter:
            self._counter, self._moved = rec.counter, now
        return Verdict.SILENT if now - self._moved > self.timeout_s else Verdict.HELD


def _terminate_self(reason: str) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


_watching = False  # one watcher per process


def watch_from_environment(role: str, on_lapse: Callable[[str], None] = _terminate_self,
                           grace_s: float = 15.0) -> bool:
    """Watch the lease named in this process's environment, if there is one (returns whether).

    On a lapse ``on_lapse(reason)`` stops the process (default: SIGTERM to itself); if it still
    runs ``grace_s`` seconds later it is killed. ``role`` names the process in its record."""
    global _watching
    directory = os.environ.get(LeaseVariable.DIRECTORY.value)
    holder = os.environ.get(LeaseVariable.ID.value)
    if not directory or not holder or _watching:
        return _watching
    _watching = True
    timeout = float(os.environ.get(LeaseVariable.TIMEOUT.value) or DEFAULT_TIMEOUT_S)
    period = period_for(timeout)
    own = register(Path(directory), holder, role, period * (1 + JITTER))
    watch = LeaseWatch(Path(directory), holder, timeout, time.monotonic())

    def run() -> None:
        while (verdict := watch.look(time.monotonic())) is Verdict.HELD:
            own.beat()
            time.sleep(period * random.uniform(1.0, 1.0 + JITTER))
        reason = {Verdict.SILENT: f"its launcher did not renew the lease for {timeout:g} s",
                  Verdict.TAKEN: "a new launcher of the experiment took the lease over",
                  Verdict.ENDED: "its launcher ended"}[verdict]
        print(f"enkflow {role} (pid {os.getpid()}): {reason} ({directory}); stopping", file=sys.stderr, flush=True)
        on_lapse(reason)
        # Beating on while the process stops: a rerun waits for it rather than take it for gone.
        end = time.monotonic() + grace_s
        while (left := end - time.monotonic()) > 0:
            own.beat()
            time.sleep(min(period, left))
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=run, name="enkflow-lease-watch", daemon=True).start()
    return True


def stop_earlier(lease: LeaseHolder, say: Callable[[str], None] | None = None) -> list[LeasedProcess]:
    """The processes of earlier launchers of the experiment, gone once this returns; returns them.

    ``lease`` (this launcher's, already written) tells them to stop: each stops by itself at its
    next look. The wait (:func:`~enkflow.jobs.lease_procs.wait_gone`) is bounded by a lease timeout
    and two periods: by then one that still runs has stopped by itself, or its node is lost."""
    return wait_gone(lease.directory, lease.holder, lease.timeout_s + 2 * period_for(lease.timeout_s), say)
