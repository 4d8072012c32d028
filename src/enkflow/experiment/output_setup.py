"""What the output layer's background writers get of an experiment: each a small record of exactly what it
needs (paths, the ``[state]`` table, settings), built here from the configuration and the experiment
directory, so that :mod:`enkflow.output` never reads an :class:`ExperimentConfig`. The offline driver and the
online server both build theirs here."""

from __future__ import annotations

from collections.abc import Callable

from enkflow.errors import ConfigError
from enkflow.experiment.config import ExperimentConfig
from enkflow.jobs.events import EventLog
from enkflow.output.archive_background import ArchiveSetup, BackgroundArchiver
from enkflow.output.mean_spread_files import MeanSpreadSetup


def mean_spread_setup(cfg: ExperimentConfig) -> MeanSpreadSetup:
    """The mean and spread files' record of ``cfg`` (which has a ``[state]`` table)."""
    if cfg.state is None:
        raise ConfigError("the mean and spread files need the [state] table", key="state")
    return MeanSpreadSetup(source=cfg.restart_path(1), state=cfg.state, members=cfg.experiment.members,
                           cycle_dir=cfg.cycle_dir, service_dir=cfg.dir.output_service,
                           writer_timeout=cfg.analysis_output.writer_timeout)


def archive_setup(cfg: ExperimentConfig) -> ArchiveSetup | None:
    """The archiver's record of ``cfg`` (None without ``[archive] dir``)."""
    a = cfg.archive
    if a.dir is None:
        return None
    d = cfg.dir
    return ArchiveSetup(root=cfg.path(a.dir), staging=d.archive_staging, log=d.archiver_log,
                        keep_last=a.keep_last, keep_every=a.keep_every, compression=a.compression, level=a.level,
                        on_failure=a.on_failure, timeout=a.timeout, python=cfg.launcher.python)


def background_archiver(cfg: ExperimentConfig, events: EventLog,
                        progress: Callable[[str], None] | None = None) -> BackgroundArchiver | None:
    """The background archiver of ``cfg`` (None without ``[archive] dir``)."""
    setup = archive_setup(cfg)
    return None if setup is None else BackgroundArchiver(setup, events, progress)
