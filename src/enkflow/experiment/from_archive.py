"""``enkflow run EXPERIMENT.toml --from-archive CYCLE``: restart an offline experiment from an archived cycle.

The archive of cycle C (:mod:`enkflow.output.archive`) holds every member's
restart as it was after C's analysis. Restoring it:

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
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from enkflow.errors import ConfigError
from enkflow.experiment import provenance
from enkflow.experiment.config import ExperimentConfig
from enkflow.experiment.state import ExperimentState
from enkflow.io import wal
from enkflow.jobs.events import EventLog
from enkflow.output import archive as _archive

_PROTECTED = re.compile(r"\.enkflow-c(\d+)\.orig")


def restore_offline(cfg: ExperimentConfig, cycle: int, events: EventLog,
                    progress: Callable[[str], None] | None = None) -> dict:
    """Restore the restarts archived after ``cycle`` and make the experiment resume at the next cycle
    (the caller holds the driver lock). Returns the archive's manifest."""
    if cfg.archive.dir is None:
        raise ConfigError("--from-archive needs the archive directory: set [archive] dir", key="archive.dir")
    if cycle not in cfg.cycle_numbers:
        raise ConfigError(f"cycle {cycle} is not a cycle of this experiment ({cfg.cycle_numbers[0]}-"
                          f"{cfg.cycle_numbers[-1]})", key="experiment.cycles")
    t0 = time.perf_counter()
    root = cfg.path(cfg.archive.dir)
    expdir = cfg.expdir
    digests = cfg.digests()
    state = ExperimentState.load(expdir)
    if state is not None:
        state.check_finished(digests)
    n = cfg.experiment.members
    restarts = [cfg.restart_path(m) for m in range(1, n + 1)]
    targets = {f"member:{m}": p for m, p in enumerate(restarts, start=1)}

    def check(manifest: dict) -> None:
        meta = manifest.get("meta", {})
        where = str(_archive.cycle_dir(root, cycle) / _archive.MANIFEST)
        if meta.get("mode") != "offline" or int(meta.get("members", -1)) != n:
            raise _archive.ArchiveError(f"this archive is of a {meta.get('mode')} experiment with {meta.get('members')} "
                                        f"members; this one is offline with {n}", path=where)

    def clear_later() -> None:
        for marker in wal.pending_markers([str(p) for p in restarts]):
            body = json.loads(marker.read_text())
            for log in body.get("logs", []):
                Path(log).unlink(missing_ok=True)
            marker.unlink()
        for p in restarts:
            for prot in glob.glob(os.path.join(glob.escape(str(p.parent)), f".{glob.escape(p.name)}.enkflow-c*.orig*")):
                m = _PROTECTED.search(prot)
                if m and int(m.group(1)) > cycle:
                    Path(prot).unlink(missing_ok=True)
        for k in cfg.cycle_numbers:
            if k > cycle:
                shutil.rmtree(cfg.cycle_dir(k), ignore_errors=True)
        staging = expdir / "archive" / "staging"
        for k in _archive.staged_cycles(staging):
            if k > cycle:
                shutil.rmtree(_archive.cycle_dir(staging, k), ignore_errors=True)

    expdir.mkdir(parents=True, exist_ok=True)
    manifest = _archive.restore(root, cycle, targets, check=check, before_write=clear_later)
    if state is None:
        state = ExperimentState.create(expdir, digests, {})
    state.cycles_done = sorted({k for k in state.cycles_done if k <= cycle} | {k for k in cfg.cycle_numbers if k <= cycle})
    state.digests = dict(digests)
    state.save()
    provenance.mark(restarts, expdir, cycle, "analysed")
    dt = time.perf_counter() - t0
    events.emit("archive_restore", cycle=cycle, dir=str(_archive.cycle_dir(root, cycle)), files=len(manifest["files"]),
                restore_s=dt)
    if progress is not None:
        progress(f"restored the restarts of cycle {cycle} from {_archive.cycle_dir(root, cycle)} "
                 f"({len(manifest['files'])} files, checksums verified, {dt:.1f} s)")
    return manifest
