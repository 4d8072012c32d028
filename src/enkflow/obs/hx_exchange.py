"""H(x) of the observations a rank owns, from the state rows of the ranks that hold them.

The replicated layout sums every rank's partial product ``H[:, block] X_block`` with one Allreduce of
n_obs x N numbers. Here an observation's owner sends each rank whose I/O row block holds some of its
H row's entries (a *piece*: those entries, in H's CSR order) once per cycle; that rank multiplies its
pieces by its rows, exactly as ``H[:, block] @ X_block`` would (the same entries in the same order:
the same bits), and returns the partial values. The owner adds them to 0.0 in ascending rank order:
for an observation whose entries lie in one or two ranks' blocks that is today's Allreduce sum to the
last bit (x + 0 and a + b do not depend on the order); only an H row spread over three or more ranks
could differ in its last bit from the reduction MPI chose.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from enkflow.parallel import Comm

_ENTRY = np.dtype([("piece", np.int64), ("col", np.int64), ("w", np.float64)])
_OWN_BLOCK = 1 << 16  # own pieces multiplied at a time (with 40 members: 20 MB of products)


class HXExchange:
    """H(x) of this rank's ``H`` (n_own, n_rows) rows; collective construction over ``comm`` with the
    ranks' I/O row blocks ``io_bounds`` (P + 1,) (rank q holds state rows ``io_bounds[q]:io_bounds[q+1]``).

    ``bytes_moved``: bytes this rank sent to and received from other ranks, setup and products, so far."""

    def __init__(self, comm: Comm, H: sp.csr_matrix, io_bounds: np.ndarray):
        self.comm = comm
        self.n_own = int(H.shape[0])
        bounds = np.asarray(io_bounds, dtype=np.int64)
        per_row = np.diff(H.indptr)
        e_row = np.repeat(np.arange(self.n_own, dtype=np.int64), per_row)
        e_rank = np.searchsorted(bounds, H.indices, side="right") - 1
        starts = np.ones(e_row.size, bool)
        starts[1:] = (e_row[1:] != e_row[:-1]) | (e_rank[1:] != e_rank[:-1])
        piece_of_entry = np.cumsum(starts) - 1
        p_rank = e_rank[starts]
        order = np.argsort(p_rank, kind="stable")  # pieces grouped by rank, each rank's in row order
        position = np.empty_like(order)
        position[order] = np.arange(order.size)
        self._rows = e_row[starts][order]  # my row of each piece, in the order the products come back
        self._pieces_to = np.bincount(p_rank, minlength=comm.size).astype(np.int64)
        first_piece = np.concatenate(([0], np.cumsum(self._pieces_to)[:-1]))
        e_pos = position[piece_of_entry]
        e_order = np.argsort(e_pos, kind="stable")
        dest = e_rank[e_order]
        entries = np.empty(e_order.size, _ENTRY)
        entries["piece"] = e_pos[e_order] - first_piece[dest]
        entries["col"] = H.indices[e_order] - bounds[dest]
        entries["w"] = H.data[e_order]
        sent_entries = np.bincount(dest, minlength=comm.size).astype(np.int64)
        got, got_counts = comm.alltoallv(entries, sent_entries)
        self._pieces_from = self._count_pieces(got, got_counts)
        first = np.repeat(np.concatenate(([0], np.cumsum(self._pieces_from)[:-1])), got_counts)
        row_of = first + got["piece"]
        n_pieces = int(self._pieces_from.sum())
        indptr = np.concatenate(([0], np.cumsum(np.bincount(row_of, minlength=n_pieces)))).astype(np.int64)
        n_local = int(bounds[comm.rank + 1] - bounds[comm.rank])
        pieces = sp.csr_matrix((got["w"], got["col"], indptr), shape=(n_pieces, n_local))
        me = comm.rank
        # This rank's own pieces (most of them: an observation's owner holds its H row's first state row)
        # are multiplied where they are added, not sent to itself: no copy of them crosses the exchange.
        own0 = int(self._pieces_from[:me].sum())
        own1 = own0 + int(self._pieces_from[me])
        self._own = pieces[own0:own1]
        self._others = pieces[np.r_[0:own0, own1:n_pieces]]  # row indexing keeps each row's entry order
        self._others_from = np.where(np.arange(comm.size) == me, 0, self._pieces_from)
        # Where each rank's products start in what the exchange returns (none from this rank itself).
        self._back_at = np.concatenate(([0], np.cumsum(np.where(np.arange(comm.size) == me, 0, self._pieces_to))))
        self.bytes_moved = int(entries.nbytes - sent_entries[me] * _ENTRY.itemsize
                               + got.nbytes - got_counts[me] * _ENTRY.itemsize)

    @staticmethod
    def _count_pieces(got: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Pieces from each source rank: one more than the largest piece number it sent (0 if none)."""
        out = np.zeros(counts.size, np.int64)
        ends = np.cumsum(counts)
        for q, (a, b) in enumerate(zip(ends - counts, ends)):
            if b > a:
                out[q] = int(got["piece"][a:b].max()) + 1
        return out

    def pieces_bytes(self, k: int) -> int:
        """Bytes of the partial products an :meth:`apply` of ``k`` columns holds at once: those made for
        and received from the other ranks, and one block of this rank's own."""
        n_other = self._others.shape[0] + int(self._back_at[-1])
        return int(8 * k * (n_other + min(_OWN_BLOCK, self._own.shape[0])))

    def apply(self, X_local: np.ndarray) -> np.ndarray:
        """H X of the owned observations, (n_own, k) float64 C-order, from this rank's rows ``X_local``
        (n_local_rows, k) of its I/O block (F-order keeps each column contiguous); collective."""
        k = X_local.shape[1]
        back, _ = self.comm.alltoallv(_products(self._others, X_local), self._others_from)
        me = self.comm.rank
        row_bytes = 8 * k
        self.bytes_moved += int((self._others.shape[0] + back.shape[0]) * row_bytes)
        out = np.zeros((self.n_own, k))
        end = np.cumsum(self._pieces_to)
        for q, (a, b) in enumerate(zip(end - self._pieces_to, end)):
            if q != me:
                out[self._rows[a:b]] += back[self._back_at[q]:self._back_at[q + 1]]
                continue
            for c in range(0, b - a, _OWN_BLOCK):
                d = min(c + _OWN_BLOCK, b - a)
                out[self._rows[a + c:a + d]] += _products(self._own[c:d], X_local)
        return out


def _products(pieces: sp.csr_matrix, X_local: np.ndarray) -> np.ndarray:
    """``pieces @ X_local`` (n_pieces, k) C-order, one column at a time: each value the sum of its row's
    entries in CSR order, whichever rows the matrix holds (so the same bits for a block of rows)."""
    out = np.empty((pieces.shape[0], X_local.shape[1]))
    for j in range(X_local.shape[1]):
        out[:, j] = pieces @ X_local[:, j]
    return out
