"""The local launcher: jobs are processes on this machine.

A small queue emulates a batch system: a job starts only when its
dependencies have finished and enough of the launcher's ``cpus`` slots are
free (first come, first served), so queue waits are real, if short. Jobs are
started in their own session; cancelling sends SIGTERM to the whole group
(the worker requeues its task) and SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from enkflow.errors import ConfigError
from enkflow.jobs.launcher import JobSpec, JobState
from enkflow.jobs.process import process_alive

if TYPE_CHECKING:
    from enkflow.jobs.config import LauncherSection

KILL_GRACE_S = 10.0


@dataclass
class _Job:
    spec: JobSpec
    proc: subprocess.Popen | None = None
    cancelled_at: float | None = None
    done: bool = False


class LocalLauncher:
    """Runs jobs as child processes, at most ``cpus`` CPUs' worth at a time.

    ``cpus=0`` means the machine's CPU count, and then a job asking for more
    (the one-job-for-everything strategy on a small machine) runs when it can
    have the machine to itself. With an explicit ``cpus`` such a job is an
    error at submission.
    """

    name = "local"
    spans_hosts = False
    job_id_variable = "ENKFLOW_JOB_ID"  # set by _start

    def __init__(self, cpus: int = 0):
        self.auto = cpus == 0
        self.cpus = cpus or os.cpu_count() or 1
        self._jobs: dict[str, _Job] = {}
        self._order: list[str] = []
        self._seq = 0

    @classmethod
    def from_config(cls, section: LauncherSection, directory: Path, *, colocated: int | None = None) -> LocalLauncher:
        """``[launcher] cpus`` slots, or ``colocated`` ones for jobs that must all run at once
        (they wait on each other, so oversubscribing the machine is fine). ``directory`` is unused."""
        return cls(cpus=colocated if colocated is not None else section.cpus)

    def submit(self, spec: JobSpec) -> str:
        if spec.cpus > self.cpus and not self.auto:
            raise ConfigError(f"job '{spec.name}' needs {spec.cpus} CPUs but the local launcher has {self.cpus}",
                              key="launcher.cpus")
        self._seq += 1
        jid = f"local-{os.getpid()}-{self._seq}"
        self._jobs[jid] = _Job(spec)
        self._order.append(jid)
        self._schedule()
        return jid

    def _used(self) -> int:
        return sum(j.spec.cpus for j in self._jobs.values() if j.proc is not None and not j.done)

    def _reap(self) -> None:
        now = time.time()
        for job in self._jobs.values():
            if job.proc is None or job.done:
                continue
            if job.proc.poll() is not None:
                job.done = True
            elif job.cancelled_at is not None and now - job.cancelled_at > KILL_GRACE_S:
                _signal_group(job.proc.pid, signal.SIGKILL)

    def _schedule(self) -> None:
        self._reap()
        free = self.cpus - self._used()
        for jid in self._order:
            job = self._jobs[jid]
            if job.proc is not None or job.done:
                continue
            if any(self._state(d) is not JobState.FINISHED for d in job.spec.after):
                continue
            if job.spec.cpus > free and not (self.auto and free == self.cpus):
                break  # first come, first served: no overtaking
            self._start(jid, job)
            free -= job.spec.cpus

    def _start(self, jid: str, job: _Job) -> None:
        env = dict(os.environ)
        env.update(job.spec.env)
        env[self.job_id_variable] = jid
        log = open(job.spec.log, "ab") if job.spec.log else subprocess.DEVNULL
        try:
            job.proc = subprocess.Popen(job.spec.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, start_new_session=True)
        finally:
            if job.spec.log:
                log.close()

    def _state(self, jid: str) -> JobState:
        job = self._jobs.get(jid)
        if job is None:
            # A job of an earlier driver process (resume): alive while its PID is.
            return JobState.FINISHED
        if job.done:
            return JobState.FINISHED
        if job.proc is None:
            return JobState.FINISHED if job.cancelled_at is not None else JobState.PENDING
        return JobState.RUNNING

    def states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        self._schedule()
        return {j: self._state(j) for j in job_ids}

    def cancel(self, job_ids: Sequence[str]) -> None:
        now = time.time()
        for jid in job_ids:
            job = self._jobs.get(jid)
            if job is None or job.done:
                continue
            if job.proc is None:
                job.cancelled_at = now
                job.done = True
                continue
            if job.cancelled_at is None and job.proc.poll() is None:
                job.cancelled_at = now
                _signal_group(job.proc.pid, signal.SIGTERM)
                # A stopped (SIGSTOP) job acts on the SIGTERM only once it runs again.
                _signal_group(job.proc.pid, signal.SIGCONT)
        self._schedule()

    def exit_status(self, job_id: str) -> int | None:
        job = self._jobs.get(job_id)
        return job.proc.poll() if job is not None and job.proc is not None else None

    def pid(self, job_id: str) -> int | None:
        """The process ID of a started job (tests use it to kill workers)."""
        job = self._jobs.get(job_id)
        return job.proc.pid if job and job.proc else None

    def close(self) -> None:
        # Wait briefly for cancelled jobs so that no zombie outlives the driver.
        deadline = time.time() + KILL_GRACE_S
        for job in self._jobs.values():
            if job.proc is not None and job.cancelled_at is not None:
                try:
                    job.proc.wait(timeout=max(0.0, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    _signal_group(job.proc.pid, signal.SIGKILL)
                    job.proc.wait()


def _signal_group(pid: int, sig: int) -> None:
    if process_alive(pid):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
