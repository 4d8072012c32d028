"""The lease of one run of ``enkflow run`` (offline or online), from after the driver lock to the end.

At the start a new lease is written (:class:`~enkflow.jobs.lease.LeaseHolder`): the processes an
earlier run left behind (its launcher killed with -9, or its node lost) see that another launcher
holds it and stop; the run waits until they are gone (:func:`~enkflow.jobs.lease.stop_earlier`), so
that no old server still holds the port the new one binds, and no old pilot still works on a task.
At a clean end the records of this run's processes are removed, also those of processes that ended
without their exit handler (killed by mpiexec, ``os._exit``), so that a rerun does not wait for them.
Then, and again at the end, the shared-memory names of this node's killed processes are removed
(:func:`~enkflow.shm_names.remove_dead_segments`). Every job the run submits gets :attr:`RunLease.env`.
"""

from __future__ import annotations

from collections.abc import Callable

from enkflow.jobs.events import EventLog
from enkflow.jobs.lease import LeaseHolder, stop_earlier
from enkflow.jobs.lease_procs import forget_ended
from enkflow.shm_names import remove_dead_segments
from enkflow.experiment.directory import ExperimentDir


class RunLease:
    """Use as a context manager inside the driver lock; ``timeout_s``: ``[launcher] lease_timeout``."""

    def __init__(self, xdir: ExperimentDir, timeout_s: float, events: EventLog,
                 say: Callable[[str], None] | None = None):
        self.xdir, self.timeout_s, self.events, self.say = xdir, timeout_s, events, say
        self.holder: LeaseHolder | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment that puts a job under this run's lease."""
        return self.holder.env if self.holder is not None else {}

    def __enter__(self) -> RunLease:
        self.holder = LeaseHolder(self.xdir.lease, self.timeout_s)
        earlier = stop_earlier(self.holder, self.say)
        if earlier:
            self.events.emit("earlier_processes_stopped", processes=[
                {"role": r.role, "pid": r.pid, "host": r.host} for r in earlier])
        remove_dead_segments()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self.holder is not None:
            self.holder.close()
            if exc_type is None:  # a clean end: every job ended or was cancelled
                forget_ended(self.holder.directory, self.holder.holder)
        remove_dead_segments()
