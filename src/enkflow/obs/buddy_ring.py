"""The buddies a distributed quality control needs from other ranks.

The buddy check (:meth:`enkflow.analysis.qc.QualityControl.buddy_rejects`) compares each observation
with the median of its buddies: the observations of its kind within ``buddy_radius``. An owner's
observations near the edge of its region have buddies owned by other ranks. Every rank publishes the
cells (of the buddy radius's size, in the search's embedded coordinates) its checked observations
occupy; an observation goes to every rank that occupies a cell next to its own. A cell's key is a
hash: a collision only sends an observation that is not needed (the check finds no pair).
"""

from __future__ import annotations

import itertools

import numpy as np

from enkflow.analysis.geometry import chord_radius, embed
from enkflow.analysis.qc import BuddyPool, QualityControl
from enkflow.config import Metric
from enkflow.parallel import Comm

_PRIMES = np.array([73856093, 19349663, 83492791], dtype=np.int64)


def _cells(qc: QualityControl, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(own, near)``: each observation's cell key (n,) int64 and the keys of the cells next to it
    and its own, (n, 3**d) int64."""
    emb = embed(qc.metric, coords)
    n, d = emb.shape
    radius = qc.buddy_radius if qc.buddy_radius is not None else 0.0
    if qc.metric is Metric.PERIODIC and qc.period is not None:
        n_cells = max(1, int(qc.period // max(radius, 1e-300)))
        cell = np.floor(emb[:, 0] / (qc.period / n_cells)).astype(np.int64) % n_cells
        near = (cell[:, None] + np.array([-1, 0, 1])[None, :]) % n_cells
        return cell, near
    size = max(chord_radius(qc.metric, radius), 1e-300)
    cell = np.floor(emb / size).astype(np.int64)
    offsets = np.array(list(itertools.product((-1, 0, 1), repeat=d)), dtype=np.int64)
    own = (cell * _PRIMES[:d]).sum(axis=1)
    near = ((cell[:, None, :] + offsets[None, :, :]) * _PRIMES[:d]).sum(axis=2)
    return own, near.reshape(n, -1)


def gather_buddies(comm: Comm, qc: QualityControl, own: BuddyPool) -> BuddyPool:
    """``own`` (this rank's observations the gross check kept) followed by every other rank's kept
    observations that may lie within the buddy radius of one of them (collective)."""
    if comm.size == 1:
        return own
    keys, near = _cells(qc, own.coords) if own.z.size else (np.zeros(0, np.int64), np.zeros((0, 1), np.int64))
    published = np.unique(keys)
    sizes = np.array(comm.allgather_obj(int(published.size)), dtype=np.int64)
    every = comm.allgather_rows(published)
    ends = np.cumsum(sizes)
    dest, rows = [], []
    for q in range(comm.size):
        if q == comm.rank:
            continue
        theirs = every[ends[q] - sizes[q]:ends[q]]
        hit = np.flatnonzero(np.isin(near, theirs).any(axis=1)) if near.size else np.zeros(0, np.int64)
        dest.append(np.full(hit.size, q, np.int64))
        rows.append(hit)
    d = np.concatenate(dest)
    r = np.concatenate(rows)
    order = np.argsort(d, kind="stable")
    counts = np.bincount(d, minlength=comm.size).astype(np.int64)
    sel = r[order]
    got_coords, _ = comm.alltoallv(np.ascontiguousarray(own.coords[sel]), counts)
    got_kinds, _ = comm.alltoallv(np.ascontiguousarray(own.kinds[sel]), counts)
    got_z, _ = comm.alltoallv(np.ascontiguousarray(own.z[sel]), counts)
    return BuddyPool(np.concatenate([own.coords, got_coords.reshape(-1, own.coords.shape[1])]),
                     np.concatenate([own.kinds, got_kinds]), np.concatenate([own.z, got_z]))
