"""How the supervisor of an online study reports a runner process that ended before the study did.

A runner's exit is reported at once, with its exit status and the tail of its own log
(``EXPDIR/online/logs/runner-K.log``), not when the server misses its heartbeats. A runner that
exits before any runner joined the server failed to start, and every runner started the same way
would fail the same way (its script missing, an import error, fields or a token the server
refuses): the study stops at the first one, as a :class:`StudyFailed`. Later errors name the log
that holds the cause: that of the first runner that failed, not of the last one restarted.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path

from enkflow.errors import EnkflowError
from enkflow.jobs.files import log_tail

TAIL_LINES = 15


class StudyFailed(EnkflowError):
    """The study stopped for a cause a rerun would meet again (``enkflow run`` exits 65, not retried)."""


@dataclass(frozen=True)
class RunnerExit:
    """Runner ``runner`` (the K of ``runner-K.log``), job ``job``, ended with ``status``: its exit code,
    -N for signal N, None where the launcher cannot tell."""

    runner: int
    job: str
    status: int | None
    log: Path

    @property
    def failed(self) -> bool:
        return self.status != 0

    @property
    def killed(self) -> bool:
        """Ended by a signal (cancelled, its node lost, out of memory): nothing says a restart would fail too."""
        return self.status is not None and self.status < 0

    def describe(self) -> str:
        if self.status is None:
            how = "exited (the launcher cannot tell its exit status)"
        elif self.killed:
            how = f"was killed by signal {-self.status} ({_signal_name(-self.status)})"
        else:
            how = f"exited with status {self.status}"
        return f"runner {self.runner} (job {self.job}) {how}"

    def tail(self) -> str:
        return tail_of(self.log)


def tail_of(log: Path) -> str:
    """For an error message: ``; LOG ends with:`` and its last lines, or that the log is empty or missing."""
    try:
        text = log_tail(log, TAIL_LINES)
    except OSError:
        return f"; its log {log} is missing"
    return f"; {log} ends with:\n{text}" if text.strip() else f"; its log {log} is empty"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


@dataclass
class RunnerExits:
    """Every runner exit of one ``enkflow run``, in the order seen."""

    exits: list[RunnerExit] = field(default_factory=list)

    def add(self, ended: RunnerExit, *, any_joined: bool) -> None:
        """Record ``ended``; raises :class:`StudyFailed` when it exited (not killed) before any runner
        joined the server (``any_joined``): a failed start, that a restart would repeat."""
        self.exits.append(ended)
        if not any_joined and not ended.killed:
            raise StudyFailed(f"{ended.describe()} before any runner joined the server: every runner started the same way "
                              "would fail the same way (a runner program or script that is missing or fails at its "
                              "start, fields or a token the server refuses), so it is not restarted ([online] runner)"
                              f"{ended.tail()}")

    def first_failed(self) -> RunnerExit | None:
        """The first runner that failed (else the first that ended): its log most likely holds the cause."""
        failed = [e for e in self.exits if e.failed] or self.exits
        return failed[0] if failed else None

    def log_or(self, default: Path) -> Path:
        """The log of :meth:`first_failed`, else ``default``."""
        first = self.first_failed()
        return default if first is None else first.log

    def cause(self) -> str:
        """A line to add to an error: :meth:`first_failed` and the tail of its log; '' when no runner ended."""
        first = self.first_failed()
        return "" if first is None else f"\nthe first runner to fail: {first.describe()}{first.tail()}"
