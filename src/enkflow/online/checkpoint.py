"""The server's checkpoints: each forecast as it arrives, the analysis ensemble after each analysis.

HDF5 files written by a background thread, each atomically (a temporary
name, fsync, rename), one per server rank so that no rank waits for another::

    DIR/forecast_CCCC/member_MMMM.rank_RRRR.h5   a member's forecast of cycle C (this rank's share)
    DIR/analysis_CCCC.rank_RRRR.h5               the analysis ensemble of cycle C (this rank's share)

A file exists only once complete, so a restarted server resumes from the newest
analysis that every rank wrote, plus every forecast of the next cycle that every
rank wrote: no forecast that arrived before a crash is run again. Writing
analysis C deletes the forecasts of cycle C - 1 and the analysis of C - 2,
which a crash before analysis C is complete on every rank cannot need.
"""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

from enkflow.errors import ConfigError, StorageError
from enkflow.fsutil import atomic_output
from enkflow.job_thread import JobThread
from enkflow.online.fields import Field


def forecast_path(directory: Path, cycle: int, member: int, rank: int) -> Path:
    return directory / f"forecast_{cycle:04d}" / f"member_{member:04d}.rank_{rank:04d}.h5"


def analysis_path(directory: Path, cycle: int, rank: int) -> Path:
    return directory / f"analysis_{cycle:04d}.rank_{rank:04d}.h5"


def _write_h5(path: Path, fields: tuple[Field, ...], arrays: list[np.ndarray], attrs: dict,
              written: Callable[[], None] | None = None) -> None:
    """``written()``: called once the file holds the arrays, before it is renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_output(path) as tmp:
            with h5py.File(tmp, "w") as h:
                for f, a in zip(fields, arrays):
                    h.create_dataset(f.name, data=a)
                for k, v in attrs.items():
                    h.attrs[k] = v
            if written is not None:
                written()
    except OSError as exc:
        raise StorageError.from_os_error(exc, path=str(path)) from None


def read_h5(path: Path, fields: tuple[Field, ...], shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The datasets of a checkpoint file, checked against the expected shapes and dtypes."""
    out = []
    with h5py.File(path, "r") as h:
        for f, shape in zip(fields, shapes):
            if f.name not in h:
                raise StorageError(f"checkpoint lacks field {f.name!r}", path=str(path))
            d = h[f.name]
            if tuple(d.shape) != tuple(shape) or d.dtype != np.dtype(f.dtype):
                raise StorageError(f"checkpoint field {f.name!r} is {d.dtype}{tuple(d.shape)}, expected "
                                   f"{f.dtype}{tuple(shape)} (another configuration or server rank count?)", path=str(path))
            out.append(d[...])
    return out


class Checkpointer:
    """This rank's background checkpoint writer. A write error stops the server at the next call."""

    def __init__(self, directory: Path, rank: int, fields: tuple[Field, ...], n_ranks: int = 1):
        self.dir = directory
        self.rank = rank
        self.n_ranks = n_ranks
        self.fields = fields
        self._jobs = JobThread(f"enkflow-checkpoint-{rank}")
        self._analysis_done = threading.Event()
        self._analysis_done.set()

    def forecast(self, cycle: int, member: int, columns: list[np.ndarray]) -> None:
        """Queue member ``member``'s forecast (views of the store, left untouched until :meth:`flush`)."""
        path = forecast_path(self.dir, cycle, member, self.rank)
        self._jobs.submit(lambda: _write_h5(path, self.fields, columns, {"cycle": cycle, "member": member, "rank": self.rank, "ranks": self.n_ranks}))

    def analysis(self, cycle: int, parts: list[np.ndarray], after: Callable[[], None] | None = None) -> None:
        """Queue the analysis ensemble; :meth:`wait_analysis` before the shares change again.
        ``after``: what must be done before the checkpoint exists (called on the checkpoint thread
        once the shares are copied, so :meth:`wait_analysis` does not wait for it; its error fails
        the checkpoint)."""
        self._jobs.check()
        self._analysis_done.clear()
        path = analysis_path(self.dir, cycle, self.rank)

        def written() -> None:
            self._analysis_done.set()
            if after is not None:
                after()

        def job() -> None:
            try:
                _write_h5(path, self.fields, parts, {"cycle": cycle, "rank": self.rank, "ranks": self.n_ranks}, written)
                self._prune(cycle)
            finally:
                self._analysis_done.set()

        self._jobs.submit(job)

    def _prune(self, cycle: int) -> None:
        old = self.dir / f"forecast_{cycle - 1:04d}"
        for p in old.glob(f"member_*.rank_{self.rank:04d}.h5"):
            p.unlink(missing_ok=True)
        analysis_path(self.dir, cycle - 2, self.rank).unlink(missing_ok=True)
        if old.exists() and not any(old.iterdir()):
            shutil.rmtree(old, ignore_errors=True)

    def wait_analysis(self, tick: Callable[[], None]) -> None:
        """Wait until the queued analysis checkpoint is written, calling ``tick()`` every 0.1 s meanwhile
        (the caller's heartbeats)."""
        # A job skipped after an earlier failure never sets the event: that failure is raised instead.
        while not self._analysis_done.wait(0.1):
            self._jobs.check()
            tick()
        self._jobs.check()

    def flush(self) -> None:
        """Wait until every queued checkpoint is on disk."""
        self._jobs.wait()

    def close(self) -> None:
        self._jobs.close()


def recoverable(directory: Path, n_ranks: int, n_members: int) -> tuple[int | None, dict[int, set[int]]]:
    """The newest cycle whose analysis every rank checkpointed (None: none) and, per cycle,
    the members whose forecast every rank checkpointed."""
    if not directory.is_dir():
        return None, {}
    for p in sorted(directory.glob("analysis_*.rank_*.h5")) + sorted(directory.glob("forecast_*/member_*.rank_*.h5")):
        try:
            with h5py.File(p, "r") as h:
                written = int(h.attrs.get("ranks", n_ranks))
        except OSError as exc:
            raise StorageError(f"cannot read the checkpoint: {exc}", path=str(p)) from None
        if written != n_ranks:
            raise ConfigError(f"the checkpoints in {directory} were written by a server of {written} ranks, this one "
                              f"has {n_ranks}: resume with [online] ranks = {written}, or delete that directory to start "
                              "the study over", key="online.ranks")
        break
    analyses: dict[int, set[int]] = {}
    for p in directory.glob("analysis_*.rank_*.h5"):
        m = re.fullmatch(r"analysis_(\d+)\.rank_(\d+)\.h5", p.name)
        if m:
            analyses.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    full = [c for c, ranks in analyses.items() if ranks >= set(range(n_ranks))]
    forecasts: dict[int, set[int]] = {}
    for d in directory.glob("forecast_*"):
        m = re.fullmatch(r"forecast_(\d+)", d.name)
        if not m:
            continue
        c = int(m.group(1))
        have: dict[int, set[int]] = {}
        for p in d.glob("member_*.rank_*.h5"):
            mm = re.fullmatch(r"member_(\d+)\.rank_(\d+)\.h5", p.name)
            if mm:
                have.setdefault(int(mm.group(1)), set()).add(int(mm.group(2)))
        forecasts[c] = {mem for mem, ranks in have.items() if ranks >= set(range(n_ranks)) and 1 <= mem <= n_members}
    return (max(full) if full else None), forecasts
