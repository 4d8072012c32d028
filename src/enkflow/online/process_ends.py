"""How the supervisor of an online study reports a runner process that ended before the study did.

A runner's exit is reported at once, with its exit status and the tail of its own log
(``EXPDIR/online/logs/runner-K.log``), not when the server misses its heartbeats. Two exits stop the
study, as a :class:`StudyFailed`, because every runner started the same way would end the same way:
one whose HELLO the server refused (fields that do not match, a wrong token: an ``online_reject``
event with the runner's id), and, before any runner joined, one that exited with an error status (not
a signal) before it greeted the server (its script missing, an import error; :mod:`enkflow.online.contact`).
Any other exit (a signal, an unknown status, a server that did not answer) is replaced. A runner that
ended because the server told it to stop is neither reported nor taken for a failure. Later errors name
the log that holds the cause: that of the runner whose failure the server named, else of the first
runner that exited with an error, not of the last one restarted.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from enkflow.errors import EnkflowError
from enkflow.jobs.files import log_tail

TAIL_LINES = 15
SIGNALLED = 128  # a shell's exit status for a child ended by signal N is 128 + N


class StudyFailed(EnkflowError):
    """The study stopped for a cause a rerun would meet again (``enkflow run`` exits 65, not retried)."""


@dataclass(frozen=True)
class RunnerExit:
    """Runner ``runner`` (the K of ``runner-K.log``), job ``job``, ended with ``status``: its exit code,
    -N for signal N, None where the launcher cannot tell. ``greeted``: the ids it greeted the server
    with (none: it never reached the server); ``told_to_stop``: it ended without an error once the server
    had told it to stop."""

    runner: int
    job: str
    status: int | None
    log: Path
    greeted: frozenset[int] = frozenset()
    told_to_stop: bool = False

    @property
    def failed(self) -> bool:
        return self.status != 0

    @property
    def killed(self) -> bool:
        """Ended by a signal (cancelled, its node lost, out of memory), also as a shell or mpiexec in
        front of it reports one (128 + N): nothing says a restart would fail too."""
        return self.status is not None and (self.status < 0 or self.status > SIGNALLED)

    def describe(self) -> str:
        if self.status is None:
            how = "exited (the launcher cannot tell its exit status)"
        elif self.status < 0:
            how = f"was killed by signal {-self.status} ({_signal_name(-self.status)})"
        elif self.killed:
            n = self.status - SIGNALLED
            how = f"exited with status {self.status} (128 + {n}: signal {n}, {_signal_name(n)}, as a shell reports it)"
        else:
            how = f"exited with status {self.status}"
        told = " when the server told it to stop" if self.told_to_stop else ""
        return f"runner {self.runner} (job {self.job}) {how}{told}"

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


@dataclass(frozen=True)
class Culprit:
    """The runner whose failure made the server fail a member for good: runner ``runner``, job ``job``."""

    runner: int
    job: str
    log: Path


@dataclass
class RunnerExits:
    """Every runner exit of one ``enkflow run``, in the order seen."""

    exits: list[RunnerExit] = field(default_factory=list)

    def add(self, ended: RunnerExit, *, any_joined: bool, refused: Mapping[int, str]) -> None:
        """Record ``ended``; raises :class:`StudyFailed` when the server refused it (``refused``: runner id ->
        why), or when it exited with an error status before it greeted the server and before any runner
        joined it (``any_joined``): a failed start, that a restart would repeat."""
        self.note(ended)
        why = next((refused[i] for i in sorted(ended.greeted) if i in refused), None)
        if why is not None:
            raise StudyFailed(f"{ended.describe()}: the server refused it ({why}), as it would refuse every runner "
                              f"started the same way, so it is not restarted ([online] runner){ended.tail()}")
        if not any_joined and not ended.greeted and ended.failed and not ended.killed and ended.status is not None:
            raise StudyFailed(f"{ended.describe()} before it reached the server: every runner started the same way "
                              "would fail the same way (a runner program or script that is missing or fails at its "
                              f"start), so it is not restarted ([online] runner){ended.tail()}")

    def note(self, ended: RunnerExit) -> None:
        """Record ``ended`` without judging it: the server has stopped the study."""
        self.exits.append(ended)

    @property
    def reported(self) -> int:
        """How many runners ended other than when told to stop."""
        return sum(not e.told_to_stop for e in self.exits)

    def first_failed(self, culprit: Culprit | None = None) -> RunnerExit | None:
        """The exit of ``culprit`` (the runner whose failure the server named), else of the first runner that
        exited with an error: its log most likely holds the cause; None when there is neither."""
        named = [e for e in self.exits if culprit is not None and e.runner == culprit.runner]
        failed = named or [e for e in self.exits if e.failed]
        return failed[0] if failed else None

    def log_or(self, default: Path, culprit: Culprit | None = None) -> Path:
        """The log of ``culprit``, else of :meth:`first_failed`, else ``default``."""
        first = self.first_failed()
        return culprit.log if culprit is not None else default if first is None else first.log

    def cause(self, culprit: Culprit | None = None) -> str:
        """A line to add to an error: ``culprit``, else :meth:`first_failed`, and the tail of its log; else
        that no runner exited with an error ('' when no runner ended)."""
        first = self.first_failed(culprit)
        if culprit is not None:
            how = first.describe() if first is not None else f"runner {culprit.runner} (job {culprit.job}), still running"
            return f"\nthe runner whose failure ended the study: {how}{tail_of(culprit.log)}"
        if first is None:
            return "\nno runner exited with an error" if self.exits else ""
        return f"\nthe first runner to fail: {first.describe()}{first.tail()}"
