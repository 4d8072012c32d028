"""``[launcher]``: where the jobs run, the job layer's own configuration section."""

from __future__ import annotations

from pydantic import Field

from enkflow.config import Strict
from enkflow.jobs.launchers import LauncherKind
from enkflow.jobs.lease import DEFAULT_TIMEOUT_S


class LauncherSection(Strict):
    """``[launcher]``: where jobs run."""

    kind: LauncherKind = Field(default=LauncherKind.LOCAL, description="'local' or 'slurm'")
    cpus: int = Field(default=0, ge=0, description="local: CPUs to share among jobs (0: this machine's count)")
    partition: str | None = None
    account: str | None = None
    nodes: int = Field(default=1, ge=1, description="slurm: nodes per job")
    extra: list[str] = Field(default_factory=list, description="slurm: more sbatch options")
    signal_margin: int = Field(default=30, ge=1, description="slurm: SIGTERM this many seconds before the time limit")
    python: str | None = Field(default=None, description="python running workers (default: this one)")
    lease_timeout: float = Field(default=DEFAULT_TIMEOUT_S, ge=1.0,
                                 description="seconds without a renewal of the launcher's lease after which the "
                                             "processes it started stop by themselves (docs/jobs.md)")
