"""The member restart files as an :class:`~enkflow.experiment.cycling.EnsembleStore`.

:class:`FileStore` reads this rank's rows of every member (:meth:`EnsembleFiles.read`)
and writes the analysis back in place with the crash-safe update; with a completion
record (``applied``) the record commits together with the update, which makes the
analysis of a cycle idempotent (see :func:`enkflow.experiment.analysis_step.analyse_files`):
the update is the store's checkpoint.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from enkflow.errors import RecoveryError
from enkflow.fsutil import read_json, write_json_atomic
from enkflow.io import EnsembleFiles
from enkflow.parallel import Comm


def _started_flag(applied: Path) -> Path:
    return applied.with_name(applied.name + ".started")


class FileStore:
    """The ensemble in the member files ``ens`` (opened ``r+``), seen by one rank of ``ens.comm``.

    :meth:`gather` reads the rows and starts allocating the update's write-ahead log on
    a thread, overlapping the analysis; :meth:`scatter` updates the files in place and,
    where they round to their dtype, re-reads the analysis from them into ``Xa`` (what a
    rerun after a kill, which can only read the files, would see). ``applied``: the path
    of the completion record committed with the update, holding the diagnostics handed
    to :meth:`scatter` (its seconds of analysis excepted). ``read_s`` and ``update_s`` time
    the last gather and scatter.
    """

    def __init__(self, ens: EnsembleFiles, *, applied: str | Path | None = None):
        self.ens = ens
        self.comm: Comm = ens.comm
        self.n_rows = ens.layout.n_rows
        self.n_members = ens.n_members
        self.row_start, self.row_stop = ens.row_start, ens.row_stop
        self.applied = None if applied is None else Path(applied)
        self.read_s = self.update_s = 0.0
        self._prep: threading.Thread | None = None

    def gather(self, cycle: int) -> np.ndarray:
        t0 = time.perf_counter()
        X = self.ens.read()
        self.read_s = time.perf_counter() - t0
        # Allocate the crash-safe update's log while the analysis computes.
        self._prep = threading.Thread(target=self.ens.prepare_update, daemon=True)
        self._prep.start()
        return X

    def scatter(self, cycle: int, Xa: np.ndarray, record: Mapping[str, float] | None = None) -> None:
        if self._prep is not None:
            self._prep.join()
            self._prep = None
        t0 = time.perf_counter()
        self._update(cycle, Xa, {k: v for k, v in (record or {}).items() if k != "analysis_s"})
        if not self.ens.lossless:
            self.ens.read(Xa)
        self.update_s = time.perf_counter() - t0

    def checkpoint(self, cycle: int, after: Callable[[], None] | None = None) -> None:
        return None  # the update in place is durable (crash-safe) when scatter returns

    def _update(self, cycle: int, Xa: np.ndarray, diagnostics: dict[str, float]) -> None:
        """Update the files in place; with ``applied``, commit the record of it with the update."""
        if self.applied is None:
            self.ens.update(Xa)
            return
        p, rank0 = self.applied, self.comm.rank == 0
        safe = self.ens.config.safe_update.enabled
        if not safe and rank0:
            write_json_atomic(_started_flag(p), {"cycle": cycle, "t": time.time()})
        self.ens.update(Xa, completion={"path": str(p), "body": {"cycle": cycle, "t": time.time(), "diagnostics": diagnostics}})
        if not safe and rank0:
            _started_flag(p).unlink(missing_ok=True)

    def applied_record(self, cycle: int) -> dict | None:
        """The completion record of an update of ``cycle`` already applied, or None (rank 0
        decides, every rank gets it; collective). Call it after the files were opened: the
        open finished any interrupted update, which writes the record."""
        if self.applied is None:
            return None
        err: RecoveryError | None = None
        rec: dict | None = None
        if self.comm.rank == 0:
            p = self.applied
            rec = read_json(p)
            if rec is not None and int(rec.get("cycle", -1)) != cycle:
                err = RecoveryError(f"records the analysis of cycle {rec.get('cycle')}, not of cycle {cycle}", path=str(p))
            elif rec is None and _started_flag(p).exists():
                err = RecoveryError(
                    f"the in-place update of cycle {cycle} was interrupted while the write-ahead log was off "
                    "([io.safe_update] enabled = false): the member restarts are partly analysed and cannot be "
                    "repaired; restore them from a copy of the cycle's forecast and delete this flag",
                    path=str(_started_flag(p)))
        err, rec = self.comm.bcast((err, rec), root=0)
        if err is not None:
            raise err
        return rec
