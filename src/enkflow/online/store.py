"""The server's in-memory ensemble: this rank's share of every field of every member.

Field ``f``'s share is an array ``(hi - lo, N)`` in Fortran order (member ``m``'s
elements contiguous, so a member goes to and comes from a runner without a
copy), in the field's own dtype; with shared memory they live in the rank's store
segment (:mod:`enkflow.online.segments`), from which runners on the node copy a
member's state themselves. The assimilated shares, stacked in field
order, are this rank's rows ``row_start:row_stop`` of the state vector: an
:class:`~enkflow.experiment.cycling.EnsembleStore`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from enkflow.online.checkpoint import Checkpointer
from enkflow.online.fields import Ownership
from enkflow.online.segments import STORE_MAGIC, Segment
from enkflow.parallel import Comm


class MemoryStore:
    """This rank's shares; ``checkpointer`` (None: none) writes the analysis checkpoints, from which
    a restarted server resumes (:meth:`checkpoint`). ``shm`` (nonce, epoch): the shares live in a new
    store segment (:attr:`segment`; OSError when it cannot be made), else in private memory."""

    def __init__(self, own: Ownership, comm: Comm, n_members: int, *, checkpointer: Checkpointer | None = None,
                 shm: tuple[bytes, int] | None = None):
        self.checkpointer = checkpointer
        self.own = own
        self.comm = comm
        self.n_members = n_members
        self.n_rows = own.n_rows
        self.row_start, self.row_stop = own.rows(comm.rank)
        self.ranges = [own.range(comm.rank, k) for k in range(len(own.fields))]
        self.segment: Segment | None = None
        if shm is None:
            self.parts = [np.zeros((hi - lo, n_members), dtype=f.dtype, order="F")
                          for f, (lo, hi) in zip(own.fields, self.ranges)]
        else:
            nbytes = [(hi - lo) * n_members * f.itemsize for f, (lo, hi) in zip(own.fields, self.ranges)]
            seg = self.segment = Segment.create(STORE_MAGIC, nbytes, *shm)
            self.parts = [seg.array(k, f.dtype, (hi - lo, n_members)) for k, (f, (lo, hi)) in
                          enumerate(zip(own.fields, self.ranges))]
        self._assim = [k for k, f in enumerate(own.fields) if f.assimilated]

    def offset(self, field: int, member: int, element: int) -> int:
        """Byte offset in the store segment of element ``element`` (of the whole field) of member ``member``."""
        assert self.segment is not None, "the store has no segment"
        lo, hi = self.ranges[field]
        return self.segment.regions[field] + ((member - 1) * (hi - lo) + element - lo) * self.own.fields[field].itemsize

    def close(self) -> None:
        """Unlink and unmap the store segment, if there is one."""
        if self.segment is not None:
            self.segment.close()

    def column(self, field: int, member: int) -> np.ndarray:
        """Member ``member``'s (1-based) share of field ``field``: a contiguous view, (hi - lo,)."""
        return self.parts[field][:, member - 1]

    def _single(self) -> np.ndarray | None:
        """The one float64 share that holds every row of this rank, if there is one (no copy needed)."""
        parts = [self.parts[k] for k in self._assim if self.parts[k].shape[0]]
        if len(parts) == 1 and parts[0].dtype == np.float64 and parts[0].shape[0] == self.row_stop - self.row_start:
            return parts[0]
        return None

    def gather(self, cycle: int) -> np.ndarray:
        """This rank's rows of the forecast ensemble, (row_stop - row_start, N) float64 F-order; the
        share itself when a single float64 field holds them (the analysis then runs in place)."""
        one = self._single()
        if one is not None:
            return one
        X = np.empty((self.row_stop - self.row_start, self.n_members), order="F")
        r = 0
        for k in self._assim:
            p = self.parts[k]
            X[r:r + p.shape[0]] = p
            r += p.shape[0]
        return X

    def scatter(self, cycle: int, Xa: np.ndarray, record: Mapping[str, float] | None = None) -> None:
        one = self._single()
        if one is not None:
            if Xa is not one:
                one[...] = Xa
            return
        r = 0
        for k in self._assim:
            p = self.parts[k]
            p[...] = Xa[r:r + p.shape[0]]
            r += p.shape[0]

    def checkpoint(self, cycle: int, after: Callable[[], None] | None = None) -> None:
        """Queue the checkpoint of every share (the analysis of ``cycle``), written in the background;
        it exists once ``after()`` has returned (:meth:`Checkpointer.analysis`)."""
        if self.checkpointer is not None:
            self.checkpointer.analysis(cycle, self.parts, after=after)
