"""Observations as they travel between the ranks of a distributed analysis (:mod:`enkflow.obs.distributed_space`).

An :class:`ObsRecords` is a set of a cycle's observations with their global numbers (positions in the
observation file), everything the analysis needs of each (values, error variances, coordinates, kinds,
per-kind half-widths, vertical coordinate, time, gross-error threshold), its row of H (the state rows
and weights of its entries, in H's canonical CSR order, padded to a common width) and, once known, its
H(x). :meth:`ObsRecords.route` sends each record to the ranks that need it (one Alltoallv per field).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from enkflow.analysis.obsset import ObsSet
from enkflow.errors import InputError
from enkflow.obs.fileformat import ObsFile
from enkflow.parallel import Comm

#: An H row's padding: no state row.
NO_COLUMN = -1


@dataclass(frozen=True, eq=False)
class ObsRecords:
    """``n`` observations of one cycle, every array with ``n`` rows.

    ``ids`` (n,) int64: positions in the observation file; ``obs``: their :class:`ObsSet`; ``time`` and
    ``qc_sigma`` (n,) float64 or None (the file has no times / no gross-error thresholds); ``h_cols`` (n, K)
    int64 and ``h_wts`` (n, K) float64: the state rows and weights of each row of H in CSR order, padded with
    :data:`NO_COLUMN` and 0.0; ``hx`` (n, N) float64 C-order: H(x) of the forecast members where known."""

    ids: np.ndarray
    obs: ObsSet
    time: np.ndarray | None
    qc_sigma: np.ndarray | None
    h_cols: np.ndarray
    h_wts: np.ndarray
    hx: np.ndarray | None = None

    @classmethod
    def from_file(cls, of: ObsFile, start: int, H: sp.csr_matrix, width: int) -> "ObsRecords":
        """The observations of ``of`` (observations ``start, start + 1, ...`` of the file) whose H is ``H``
        (n, n_rows; ``of.operator_for(n_rows).H``), padded to ``width`` entries per row."""
        n = of.n_obs
        per_row = np.diff(H.indptr)
        if n and int(per_row.max()) > width:
            raise InputError(f"an H row has {int(per_row.max())} entries, more than the {width} agreed", item="H")
        cols = np.full((n, width), NO_COLUMN, np.int64)
        wts = np.zeros((n, width))
        slot = np.arange(H.indices.size) - np.repeat(H.indptr[:-1], per_row)
        row = np.repeat(np.arange(n), per_row)
        cols[row, slot] = H.indices
        wts[row, slot] = H.data
        return cls(np.arange(start, start + n, dtype=np.int64), of.obs, of.time, of.qc_sigma, cols, wts)

    @property
    def n(self) -> int:
        return int(self.ids.size)

    @property
    def first_column(self) -> np.ndarray:
        """(n,) int64: the lowest state row of each observation's H row (its entries are in column order)."""
        return self.h_cols[:, 0] if self.h_cols.shape[1] else np.zeros(self.n, np.int64)

    def h_matrix(self, n_rows: int) -> sp.csr_matrix:
        """H of these observations, (n, n_rows), with the entries in the order they came."""
        used = self.h_cols != NO_COLUMN
        indptr = np.concatenate(([0], np.cumsum(used.sum(axis=1)))).astype(np.int64)
        return sp.csr_matrix((self.h_wts[used], self.h_cols[used], indptr), shape=(self.n, n_rows))

    def _arrays(self) -> dict[str, np.ndarray | None]:
        o = self.obs
        return {"ids": self.ids, "values": o.values, "error_var": o.error_var, "coords": o.coords, "kinds": o.kinds,
                "half_width": o.half_width, "vcoord": o.vcoord, "time": self.time, "qc_sigma": self.qc_sigma,
                "h_cols": self.h_cols, "h_wts": self.h_wts, "hx": self.hx}

    @classmethod
    def _of_arrays(cls, a: dict[str, np.ndarray | None]) -> "ObsRecords":
        obs = ObsSet(a["values"], a["error_var"], a["coords"], a["kinds"], a["half_width"], a["vcoord"])
        hx = a["hx"]
        return cls(a["ids"], obs, a["time"], a["qc_sigma"], a["h_cols"], a["h_wts"],
                   None if hx is None else np.ascontiguousarray(hx))

    def take(self, idx: np.ndarray) -> "ObsRecords":
        """The records at positions ``idx`` (n_idx,), in that order (a position may repeat)."""
        return self._of_arrays(self.map(lambda a: a[idx]))

    def map(self, f: Callable[[np.ndarray], np.ndarray]) -> dict[str, np.ndarray | None]:
        return {k: None if a is None else f(a) for k, a in self._arrays().items()}

    def sorted(self) -> "ObsRecords":
        """These records in ascending ``ids``."""
        order = np.argsort(self.ids, kind="stable")
        return self if np.array_equal(order, np.arange(self.n)) else self.take(order)

    def for_analysis(self, hx: np.ndarray) -> "ObsRecords":
        """These records with their H(x) ``hx`` (n, N) and only what a local analysis reads (no H row, time
        or gross-error threshold: less to send and to hold)."""
        n = self.n
        return replace(self, time=None, qc_sigma=None, h_cols=np.zeros((n, 0), np.int64), h_wts=np.zeros((n, 0)),
                       hx=np.ascontiguousarray(hx, dtype=np.float64))

    def with_hx(self, hx: np.ndarray) -> "ObsRecords":
        return replace(self, hx=np.ascontiguousarray(hx, dtype=np.float64))

    def route(self, comm: Comm, dest: np.ndarray, rows: np.ndarray) -> "ObsRecords":
        """Send record ``rows[i]`` to rank ``dest[i]`` (both (n_copies,)); returns the records this rank
        received, sorted by ``ids`` (collective)."""
        order = np.argsort(dest, kind="stable")
        counts = np.bincount(dest, minlength=comm.size).astype(np.int64)
        sent = self.take(rows[order])
        recv = {}
        for k, a in sent._arrays().items():
            recv[k] = None if a is None else comm.alltoallv(np.ascontiguousarray(a), counts)[0]
        return self._of_arrays(recv).sorted()

    @property
    def nbytes(self) -> int:
        """Bytes of every array of these records but ``hx``."""
        return int(sum(a.nbytes for k, a in self._arrays().items() if a is not None and k != "hx"))
