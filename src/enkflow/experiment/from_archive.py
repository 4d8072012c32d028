"""``enkflow run EXPERIMENT.toml --from-archive CYCLE``: restart an experiment from an archived cycle.

Offline, the archive of cycle C (:mod:`enkflow.output.archive`) holds every member's
restart as it was after C's analysis. Restoring it (:func:`restore_offline`):

1. checks the settings against the experiment's recorded ones, that C is one of
   its cycles, and that the archive is of this ensemble;
2. verifies every checksum (the compressed files, then their decompressed
   content into temporary siblings of the restarts): an error names the file,
   and nothing of the experiment has been changed;
3. drops what the later cycles left behind: an interrupted in-place update's
   commit marker (it would be redone over the restored files), the protected
   copies and directories of cycles after C, their staged archives;
4. renames the restored restarts into place, records cycles up to C as done
   (``state.json``) and marks the restarts analysed in C (provenance);

then the driver continues from cycle C + 1 as after any resume.

Online, it holds the server's analysis checkpoints of cycle C (one per server
rank: the whole in-memory ensemble, carried variables included).
:func:`enkflow.online.launch.restore_online` verifies them the same way with the
helpers below, replaces every checkpoint with them, drops the later cycles'
directories and the study's final status, and the server then resumes from
cycle C's analysis.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from enkflow.errors import ConfigError
from enkflow.experiment import provenance
from enkflow.experiment.provenance import RestartState
from enkflow.experiment.config import ExperimentConfig
from enkflow.experiment.state import ExperimentState
from enkflow.io import wal
from enkflow.jobs.events import EventLog
from enkflow.output import archive as _archive

_PROTECTED = re.compile(r"\.enkflow-c(\d+)\.orig")


def archive_root(cfg: ExperimentConfig, cycle: int) -> Path:
    if cfg.archive.dir is None:
        raise ConfigError("--from-archive needs the archive directory: set [archive] dir", key="archive.dir")
    if cycle not in cfg.cycle_numbers:
        raise ConfigError(f"cycle {cycle} is not a cycle of this experiment ({cfg.cycle_numbers[0]}-"
                          f"{cfg.cycle_numbers[-1]})", key="experiment.cycles")
    return cfg.path(cfg.archive.dir)


def archive_checker(root: Path, cycle: int, want: dict) -> Callable[[dict], None]:
    """Refuse an archive whose ``meta`` differs from ``want`` (another mode, ensemble size, rank count)."""
    def check(manifest: dict) -> None:
        meta = manifest.get("meta", {})
        if any(meta.get(k) != v for k, v in want.items()):
            have = ", ".join(f"{k} = {meta.get(k)}" for k in want)
            need = ", ".join(f"{k} = {v}" for k, v in want.items())
            raise _archive.ArchiveError(f"this archive is of an experiment with {have}; this one has {need}",
                                        path=str(_archive.cycle_dir(root, cycle) / _archive.MANIFEST))
    return check


def drop_later(cfg: ExperimentConfig, cycle: int) -> None:
    """The directories and staged archives of the cycles after ``cycle``."""
    for k in cfg.cycle_numbers:
        if k > cycle:
            shutil.rmtree(cfg.dir.cycle(k).path, ignore_errors=True)
    staging = cfg.dir.archive_staging
    for k in _archive.staged_cycles(staging):
        if k > cycle:
            shutil.rmtree(_archive.cycle_dir(staging, k), ignore_errors=True)


def report_restored(events: EventLog, root: Path, cycle: int, manifest: dict, t0: float,
          progress: Callable[[str], None] | None, what: str) -> None:
    dt = time.perf_counter() - t0
    events.emit("archive_restore", cycle=cycle, dir=str(_archive.cycle_dir(root, cycle)), files=len(manifest["files"]),
                restore_s=dt)
    if progress is not None:
        progress(f"restored {what} of cycle {cycle} from {_archive.cycle_dir(root, cycle)} "
                 f"({len(manifest['files'])} files, checksums verified, {dt:.1f} s)")


def restore_offline(cfg: ExperimentConfig, cycle: int, events: EventLog,
                    progress: Callable[[str], None] | None = None) -> dict:
    """Restore the restarts archived after ``cycle`` and make the experiment resume at the next cycle
    (the caller holds the driver lock). Returns the archive's manifest."""
    root = archive_root(cfg, cycle)
    t0 = time.perf_counter()
    xdir = cfg.dir
    digests = cfg.digests()
    state = ExperimentState.load(xdir.state)
    if state is not None:
        state.check_finished(cfg)
    n = cfg.experiment.members
    restarts = [cfg.restart_path(m) for m in range(1, n + 1)]
    targets = {f"member:{m}": p for m, p in enumerate(restarts, start=1)}
    check = archive_checker(root, cycle, {"mode": "offline", "members": n})

    def clear_later() -> None:
        for marker in wal.pending_markers([str(p) for p in restarts]):
            wal.discard(marker)
        for p in restarts:
            for prot in glob.glob(os.path.join(glob.escape(str(p.parent)), f".{glob.escape(p.name)}.enkflow-c*.orig*")):
                m = _PROTECTED.search(prot)
                if m and int(m.group(1)) > cycle:
                    Path(prot).unlink(missing_ok=True)
        drop_later(cfg, cycle)

    xdir.root.mkdir(parents=True, exist_ok=True)
    manifest = _archive.restore(root, cycle, targets, check=check, before_write=clear_later)
    if state is None:
        state = ExperimentState.create(xdir.state, digests, {})
    state.cycles_done = sorted({k for k in state.cycles_done if k <= cycle} | {k for k in cfg.cycle_numbers if k <= cycle})
    state.digests = dict(digests)
    state.save()
    provenance.mark(restarts, xdir.root, cycle, RestartState.ANALYSED)
    report_restored(events, root, cycle, manifest, t0, progress, "the restarts")
    return manifest
