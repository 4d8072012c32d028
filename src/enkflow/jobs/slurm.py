"""The SLURM launcher: ``sbatch``, ``squeue`` and ``scancel``.

Each job is a batch script running one command. The time limit goes to
``--time``; ``--signal=TERM@margin`` asks SLURM to send SIGTERM ahead of it,
so the worker can put its member back at the front of the to-do list before
SLURM kills the job. A job that ``squeue`` no longer lists is finished; what
it achieved is read from the to-do list, not from accounting (which many
sites, and the tests' local SLURM, do not run).
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from enkflow.errors import EnkflowError
from enkflow.jobs.launcher import JobSpec, JobState

if TYPE_CHECKING:
    from enkflow.jobs.config import LauncherSection

_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"}
_RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "STOPPED", "RESIZING"}


def slurm_time(seconds: float) -> str:
    """``--time`` value for ``seconds``, rounded up to whole minutes (SLURM's resolution)."""
    minutes = max(1, math.ceil(seconds / 60.0))
    return f"{minutes // 60}:{minutes % 60:02d}:00"


class SlurmLauncher:
    """Submits each job with ``sbatch``.

    ``script_dir`` receives the batch scripts. ``partition``, ``account`` and
    ``extra`` (more ``sbatch`` options, e.g. ``["--qos=debug"]``) are passed
    through; ``signal_margin_s`` is how long before the time limit SLURM
    sends SIGTERM. ``env`` sets the environment of the programs (SLURM exports
    the submitting environment by default).
    """

    name = "slurm"
    spans_hosts = True  # jobs run on the cluster's nodes
    job_id_variable = "SLURM_JOB_ID"

    def __init__(self, script_dir: str | os.PathLike[str], *, partition: str | None = None, account: str | None = None,
                 extra: Sequence[str] = (), signal_margin_s: int = 30, bin_dir: str | None = None):
        self.script_dir = Path(script_dir)
        self.script_dir.mkdir(parents=True, exist_ok=True)
        self.partition = partition
        self.account = account
        self.extra = list(extra)
        self.signal_margin_s = signal_margin_s
        self.bin_dir = bin_dir
        self._seq = 0

    @classmethod
    def from_config(cls, section: LauncherSection, directory: Path, *, colocated: int | None = None) -> SlurmLauncher:
        """Batch scripts in ``directory``; ``colocated`` jobs need nothing special (each is a job of its own)."""
        return cls(directory, partition=section.partition, account=section.account, extra=section.extra,
                   signal_margin_s=section.signal_margin)

    def _cmd(self, name: str) -> str:
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    def _run(self, argv: list[str]) -> str:
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            raise EnkflowError(f"'{argv[0]}' not found: is SLURM installed and on PATH? (launcher.kind = 'slurm')") from None
        except subprocess.TimeoutExpired:
            raise EnkflowError(f"'{shlex.join(argv)}' did not answer within 60 s: is slurmctld running?") from None
        if res.returncode != 0:
            raise EnkflowError(f"'{shlex.join(argv)}' failed ({res.returncode}): {res.stderr.strip()}")
        return res.stdout

    def submit(self, spec: JobSpec) -> str:
        self._seq += 1
        script = self.script_dir / f"{spec.name}.{os.getpid()}.{self._seq}.sh"
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in spec.env.items())
        # exec: the worker becomes the batch step's process and receives SLURM's signals itself.
        script.write_text(f"#!/bin/sh\n{exports}exec {shlex.join(spec.argv)}\n")
        argv = [
            self._cmd("sbatch"), "--parsable", f"--job-name={spec.name}", f"--time={slurm_time(spec.time_limit_s)}",
            f"--nodes={spec.nodes}", f"--ntasks={spec.ntasks}", f"--cpus-per-task={max(1, spec.cpus // max(1, spec.ntasks))}",
            f"--signal=TERM@{self.signal_margin_s}", f"--output={spec.log or os.devnull}",
        ]
        if self.partition:
            argv.append(f"--partition={self.partition}")
        if self.account:
            argv.append(f"--account={self.account}")
        if spec.after:
            argv.append("--dependency=afterany:" + ":".join(spec.after))
        if not spec.requeue:
            argv.append("--no-requeue")
        argv += self.extra
        argv.append(str(script))
        out = self._run(argv).strip()
        # --parsable prints "jobid" or "jobid;cluster".
        return out.split(";")[0]

    def states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        result = {j: JobState.FINISHED for j in job_ids}
        if not job_ids:
            return result
        # All of this user's jobs, filtered here: `squeue -j` fails outright when one ID has left the queue.
        out = self._run([self._cmd("squeue"), "--me", "-h", "-o", "%i %T"])
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in result:
                if parts[1] in _PENDING:
                    result[parts[0]] = JobState.PENDING
                elif parts[1] in _RUNNING:
                    result[parts[0]] = JobState.RUNNING
        return result

    def exit_status(self, job_id: str) -> int | None:
        # From accounting where the site runs it (`sacct` prints "code:signal"); None where it does not.
        try:
            res = subprocess.run([self._cmd("sacct"), "-n", "-X", "-P", "-o", "ExitCode", "-j", job_id],
                                 capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        code, _, sig = res.stdout.strip().partition(":")
        if res.returncode != 0 or not (code.isdigit() and sig.isdigit()):
            return None
        return -int(sig) if int(sig) else int(code)

    def cancel(self, job_ids: Sequence[str]) -> None:
        if not job_ids:
            return
        # Pending jobs first, plainly: `scancel --signal` on a pending job retries forever
        # ("Job can not be altered now"). Running ones get SIGTERM so that the worker
        # requeues its task; --full reaches the batch shell's children too.
        for argv in ([self._cmd("scancel"), "--state=PENDING", *job_ids],
                     [self._cmd("scancel"), "--state=RUNNING", "--full", "--signal=TERM", *job_ids]):
            try:
                subprocess.run(argv, capture_output=True, timeout=30)
            except subprocess.TimeoutExpired:
                pass  # the job ends at its time limit anyway; the to-do list stays consistent

    def close(self) -> None:
        return None
