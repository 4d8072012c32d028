"""Per-observation values that their owners hold, put in the order of the cycle's observation file on
rank 0, so that statistics over all observations count each once and keep the bits of the replicated
layout (where every rank held every observation in file order).

An observation's global id is its index in the cycle's observation file; each rank passes the sorted ids
of the observations it owns, and every id in ``0..n_total-1`` must be owned by exactly one rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enkflow.errors import InputError
from enkflow.parallel import Comm

ROOT = 0

# What _ownership_problem found, broadcast as two int64 (kind, id) so that every rank raises the same error.
_OK, _OUT_OF_RANGE, _MISSING, _DUPLICATE = 0, 1, 2, 3


def rms(d: np.ndarray) -> float:
    """Root mean square of the departures ``d`` (n,), in their units; 0.0 for none. ``np.mean`` sums
    pairwise, so the bits depend on the order of ``d``."""
    return float(np.sqrt(np.mean(d ** 2))) if d.size else 0.0


def sorted_ids(ids: np.ndarray, n_total: int) -> np.ndarray:
    """``ids`` as (n,) int64, checked to be global ids of a cycle's ``n_total`` observations in
    strictly ascending order (InputError naming the first that is not)."""
    sel = np.asarray(ids)
    if sel.ndim != 1 or not np.issubdtype(sel.dtype, np.integer):
        raise InputError(f"observation ids must be a 1-D integer array, got shape {sel.shape} dtype {sel.dtype}",
                         item="ids")
    sel = sel.astype(np.int64)
    bad = np.flatnonzero(np.diff(sel) <= 0)
    if bad.size:
        raise InputError(f"observation ids must increase strictly; position {bad[0] + 1} has {sel[bad[0] + 1]} "
                         f"after {sel[bad[0]]}", item="ids", index=int(bad[0]) + 1)
    if sel.size and (sel[0] < 0 or sel[-1] >= n_total):
        raise InputError(f"observation ids must lie in [0, {n_total}); they span [{sel[0]}, {sel[-1]}]", item="ids")
    return sel


@dataclass(frozen=True)
class RootOrder:
    """Where the rows that each rank owns go on rank 0: made once per set of owned ids (collective),
    then used for any number of per-observation arrays."""

    comm: Comm
    own: np.ndarray  # (n_own,) int64: the sorted global ids of the rows this rank owns
    n_total: int  # observations over all ranks
    ids: np.ndarray | None  # rank 0: the global id of each row it receives, in rank order; others None

    @property
    def n_own(self) -> int:
        """Rows this rank owns."""
        return int(self.own.size)

    @classmethod
    def of(cls, comm: Comm, ids: np.ndarray, n_total: int) -> "RootOrder":
        """Collective: ``ids`` (n_own,) int, this rank's global ids. Raises ValueError on every rank
        naming the first id (lowest) that no rank or more than one rank owns, or one out of range."""
        own = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        got, _ = comm.alltoallv(own, _to_root(comm, own.size))
        found = np.zeros(2, dtype=np.int64)
        if comm.rank == ROOT:
            found[:] = _ownership_problem(got, n_total)
        found = comm.bcast(found, root=ROOT)
        kind, i = int(found[0]), int(found[1])
        if kind == _OUT_OF_RANGE:
            raise ValueError(f"observation id {i} is outside 0..{n_total - 1} (the cycle's {n_total} observations)")
        if kind == _MISSING:
            raise ValueError(f"observation {i} of the cycle's {n_total} is owned by no rank")
        if kind == _DUPLICATE:
            raise ValueError(f"observation {i} of the cycle's {n_total} is owned by more than one rank")
        return cls(comm, own, n_total, got if comm.rank == ROOT else None)

    def gather(self, values: np.ndarray) -> np.ndarray | None:
        """Collective: this rank's ``values`` (n_own, ...) for its ids, any dtype (the same on every
        rank); rank 0 gets them all in global order, (n_total, ...) of rank 0's dtype; others None."""
        v = np.ascontiguousarray(values)
        if v.ndim == 0 or v.shape[0] != self.n_own:
            raise ValueError(f"values have shape {v.shape}, expected {self.n_own} rows (the observations this rank owns)")
        got, _ = self.comm.alltoallv(v, _to_root(self.comm, self.n_own))
        if self.ids is None:
            return None
        out = np.empty((self.n_total,) + v.shape[1:], dtype=v.dtype)
        out[self.ids] = got
        return out

    def rms(self, departures: np.ndarray, keep: np.ndarray | None = None) -> float:
        """Collective: :func:`rms` of every rank's ``departures`` (n_own,) in global order, of those where
        ``keep`` (n_own,) bool is true (None: all), computed on rank 0 and broadcast, so every rank has the
        bits of the replicated layout's RMS over its array of the kept observations."""
        d = self.gather(np.asarray(departures, dtype=np.float64).reshape(-1))
        kept = None if keep is None else self.gather(np.asarray(keep, dtype=bool).reshape(-1))
        out = np.array([0.0 if d is None else rms(d if kept is None else d[kept])])
        return float(self.comm.bcast(out, root=ROOT)[0])


def _to_root(comm: Comm, n: int) -> np.ndarray:
    """Send counts (P,) that send all ``n`` rows to the root."""
    counts = np.zeros(comm.size, dtype=np.int64)
    counts[ROOT] = n
    return counts


def _ownership_problem(ids: np.ndarray, n_total: int) -> tuple[int, int]:
    """(kind, id) of the first problem of the owned ``ids`` of all ranks, or (_OK, 0)."""
    outside = (ids < 0) | (ids >= n_total)
    if outside.any():
        return _OUT_OF_RANGE, int(ids[np.argmax(outside)])
    owners = np.bincount(ids, minlength=n_total)
    if (owners == 1).all():
        return _OK, 0
    first = int(np.argmax(owners != 1))
    return (_MISSING if owners[first] == 0 else _DUPLICATE), first
