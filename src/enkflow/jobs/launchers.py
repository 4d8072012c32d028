"""The launchers, one per module, registered by ``[launcher] kind``.

A new launcher is a module with a class offering :class:`~enkflow.jobs.launcher.Launcher` and
:class:`LauncherType` (its ``from_config``, ``spans_hosts`` and ``job_id_variable``), plus its
member of :class:`LauncherKind` and its line in :data:`LAUNCHERS` below. The experiment driver and
the online supervisor ask the registry; they never name a launcher.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from enkflow.jobs.launcher import Launcher
from enkflow.jobs.local import LocalLauncher
from enkflow.jobs.slurm import SlurmLauncher

if TYPE_CHECKING:
    from enkflow.jobs.config import LauncherSection


class LauncherKind(StrEnum):
    """``[launcher] kind``: the TOML strings."""

    LOCAL = "local"
    SLURM = "slurm"


class LauncherType(Protocol):
    """What a launcher class tells the layers above without being named.

    ``spans_hosts``: jobs may run on other hosts, so a service they reach (the output service, the
    online server) listens on TCP on every interface instead of an ipc socket.
    ``job_id_variable``: the environment variable in which a job finds its own job ID.
    """

    spans_hosts: bool
    job_id_variable: str

    def from_config(self, section: LauncherSection, directory: Path, *, colocated: int | None = None) -> Launcher:
        """The launcher ``section`` describes; its own files go under ``directory``. ``colocated``:
        jobs that wait on each other and must all run at once (the online server and its runners),
        so that a launcher sharing one machine makes room for this many CPUs whatever its ``cpus``."""
        ...


LAUNCHERS: dict[LauncherKind, LauncherType] = {
    LauncherKind.LOCAL: LocalLauncher,
    LauncherKind.SLURM: SlurmLauncher,
}

# Where a worker looks for its job ID, in this order.
JOB_ID_VARIABLES: tuple[str, ...] = tuple(dict.fromkeys(cls.job_id_variable for cls in LAUNCHERS.values()))


def make_launcher(section: LauncherSection, directory: Path, *, colocated: int | None = None) -> Launcher:
    """The launcher of ``[launcher]``; ``directory`` receives its files (e.g. batch scripts)."""
    return LAUNCHERS[section.kind].from_config(section, directory, colocated=colocated)
