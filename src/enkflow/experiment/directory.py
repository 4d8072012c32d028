"""The experiment directory (``[experiment] directory``, EXPDIR): every path in it, in one place.

:class:`~enkflow.experiment.config.ExperimentConfig` is the schema; :class:`ExperimentDir` is the
layout of the directory a run keeps its state in. Layers below the experiment get plain paths from
it (a cycle directory, a checkpoint directory), never the configuration::

    EXPDIR/
      config.json  state.json  events.jsonl  restarts.txt  driver.lock  board.json
      restarts/NNNN/<restart>          experiment.initial = "copy"
      cycles/NNNN/                     one cycle (CycleDir): the job scheme's files, the analysis's
      output_service/                  the offline study's output service (address, token)
      archive/staging/  archive/archiver.log
      online/                          the online server (OnlineDir)
      lease/lease.json  lease/procs/   the launcher's lease and the processes under it (enkflow.jobs.lease)
      slurm/                           a launcher's own files (batch scripts), named by its kind
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from enkflow.jobs.launchers import LauncherKind
from enkflow.jobs.tasks import TASKS_FILE, done_marker, logs_dir
from enkflow.obs.diagnostics import FILE_NAME as OBS_DIAG
from enkflow.output.analysis_output import service_dir
from enkflow.output.mean_spread_files import MEAN, SPREAD

CONFIG = "config.json"
EVENTS = "events.jsonl"


@dataclass(frozen=True)
class CycleDir:
    """``EXPDIR/cycles/NNNN``: the files of one cycle (the job scheme's ones are the jobs layer's)."""

    path: Path

    @property
    def tasks(self) -> Path:
        """The task table the driver writes and the workers read."""
        return self.path / TASKS_FILE

    @property
    def digests(self) -> Path:
        """The settings' digests the cycle started with (a resume compares them)."""
        return self.path / "digests.json"

    @property
    def settings(self) -> Path:
        """The configuration the cycle started with (JSON), to name what a refused resume changed."""
        return self.path / "settings.json"

    @property
    def logs(self) -> Path:
        return logs_dir(self.path)

    def done(self, task: int) -> Path:
        """The marker a worker writes once ``task`` (a member, or the analysis at N_e + 1) is done."""
        return done_marker(self.path, task)

    def work(self, member: int) -> Path:
        """The working directory of ``member``'s model run (``{workdir}``)."""
        return self.path / "work" / f"member_{member:03d}"

    @property
    def applied(self) -> Path:
        """The record, committed with the analysis's in-place update, that the analysis was applied."""
        return self.path / "analysis_applied.json"

    @property
    def mean(self) -> Path:
        return self.path / MEAN

    @property
    def spread(self) -> Path:
        return self.path / SPREAD

    @property
    def obs_diag(self) -> Path:
        return self.path / OBS_DIAG


@dataclass(frozen=True)
class OnlineDir:
    """``EXPDIR/online``: the online server's files."""

    path: Path

    @property
    def token(self) -> Path:
        return self.path / "token"

    @property
    def curve_public(self) -> Path:
        return self.path / "curve.pub"

    @property
    def curve_secret(self) -> Path:
        return self.path / "curve.key"

    @property
    def launch(self) -> Path:
        """The port the server binds, kept over its restarts."""
        return self.path / "launch.json"

    @property
    def address(self) -> Path:
        """Where the server writes the address runners connect to."""
        return self.path / "address"

    @property
    def status(self) -> Path:
        """The server's verdict: done, or failed with the error."""
        return self.path / "status.json"

    @property
    def stopping(self) -> Path:
        """Written when the study is over: runners that end now are not replaced."""
        return self.path / "stopping.json"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def alive(self) -> Path:
        """The server ranks' signs of life, which the launcher watches (:mod:`enkflow.online.liveness`)."""
        return self.path / "alive"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"


@dataclass(frozen=True)
class ExperimentDir:
    """The experiment directory ``root`` (absolute) and every path in it."""

    root: Path

    @property
    def config(self) -> Path:
        """The configuration the run was made with (JSON), for the analysis task and external programs."""
        return self.root / CONFIG

    @property
    def state(self) -> Path:
        """The resume state (:mod:`enkflow.experiment.state`)."""
        return self.root / "state.json"

    @property
    def events(self) -> Path:
        return self.root / EVENTS

    @property
    def restarts_list(self) -> Path:
        """The restarts the cycles advance, one per line, member 1 first (for external analysis programs)."""
        return self.root / "restarts.txt"

    @property
    def lease(self) -> Path:
        """The launcher's lease and its processes' records (:mod:`enkflow.jobs.lease`)."""
        return self.root / "lease"

    @property
    def board(self) -> Path:
        """The cycle whose tasks pilots that span cycles work on (:mod:`enkflow.jobs.pilot`)."""
        return self.root / "board.json"

    @property
    def lock(self) -> Path:
        """The driver's lock (:mod:`enkflow.experiment.lock`)."""
        return self.root / "driver.lock"

    @property
    def restarts(self) -> Path:
        """The experiment's own copy of the ensemble (``experiment.initial = "copy"``)."""
        return self.root / "restarts"

    def restart_copy(self, member: int, name: str) -> Path:
        """Where ``member``'s copy of its restart (file name ``name``) lives."""
        return self.restarts / f"{member:04d}" / name

    @property
    def cycles(self) -> Path:
        return self.root / "cycles"

    def cycle(self, cycle: int) -> CycleDir:
        return CycleDir(self.cycles / f"{cycle:04d}")

    @property
    def output_service(self) -> Path:
        """The offline study's output service (its address and token files)."""
        return service_dir(self.root)

    @property
    def archive(self) -> Path:
        return self.root / "archive"

    @property
    def archive_staging(self) -> Path:
        """Cycles staged for the background archiver."""
        return self.archive / "staging"

    @property
    def archiver_log(self) -> Path:
        return self.archive / "archiver.log"

    @property
    def online(self) -> OnlineDir:
        return OnlineDir(self.root / "online")

    def launcher(self, kind: LauncherKind) -> Path:
        """A launcher's own files (the SLURM launcher's batch scripts)."""
        return self.root / kind.value
