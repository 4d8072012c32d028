"""Run under mpiexec by test_hx_exchange.py: every rank owns random observations whose H rows (1 to 3
entries, ascending columns) start in its own I/O block and may reach the next rank's; ``HXExchange.apply``
must equal the replicated layout's Allreduce of ``H[:, block] @ X_block`` bit for bit, with its own
pieces multiplied in blocks (a block size of 7 here). Rank 0 writes "ok <size>" to argv[1]."""

import sys

import numpy as np
import scipy.sparse as sp

from enkflow.obs import hx_exchange
from enkflow.obs.hx_exchange import HXExchange
from enkflow.parallel import get_comm

hx_exchange._OWN_BLOCK = 7

comm = get_comm()
P, me = comm.size, comm.rank
n_rows, k = 61, 5
bounds = np.array([0, 9, 20, 33, 40, 52, 61][: P] + [n_rows]) if P < 7 else np.linspace(0, n_rows, P + 1).astype(int)
rng = np.random.default_rng(11)
X = np.asfortranarray(rng.standard_normal((n_rows, k)) * 1e3 + rng.standard_normal((n_rows, k)))
rows_of = []  # every rank's H rows, the same draws on every rank
for q in range(P):
    for _ in range(int(rng.integers(0, 40))):
        first = int(rng.integers(bounds[q], bounds[q + 1]))
        cols = sorted({first, *(min(first + int(d), n_rows - 1) for d in rng.integers(0, 12, int(rng.integers(0, 3))))})
        rows_of.append((q, cols, rng.standard_normal(len(cols))))
mine = [(c, w) for q, c, w in rows_of if q == me]
indptr = np.concatenate(([0], np.cumsum([len(c) for c, _ in mine]))).astype(np.int64)
H = sp.csr_matrix((np.concatenate([w for _, w in mine]) if mine else np.zeros(0),
                   np.concatenate([c for c, _ in mine]).astype(np.int64) if mine else np.zeros(0, np.int64), indptr),
                  shape=(len(mine), n_rows))
ex = HXExchange(comm, H, bounds)
got = ex.apply(np.asfortranarray(X[bounds[me]:bounds[me + 1]]))

# The replicated layout: every rank's H rows, partial products of each block, summed by MPI.
all_rows = [(c, w) for _, c, w in rows_of]
ip = np.concatenate(([0], np.cumsum([len(c) for c, _ in all_rows]))).astype(np.int64)
H_all = sp.csr_matrix((np.concatenate([w for _, w in all_rows]), np.concatenate([c for c, _ in all_rows]), ip),
                      shape=(len(all_rows), n_rows))
block = H_all[:, bounds[me]:bounds[me + 1]]
partial = np.column_stack([block @ X[bounds[me]:bounds[me + 1], j] for j in range(k)])
total = comm.allreduce_sum(partial)
start = sum(1 for q, _, _ in rows_of if q < me)
want = total[start:start + len(mine)]
spans = [len({int(np.searchsorted(bounds, c, side="right") - 1) for c in cols}) for cols, _ in mine]
assert max(spans, default=1) <= 2
assert got.shape == want.shape and got.flags.c_contiguous, (got.shape, want.shape)
assert np.array_equal(got.view(np.uint64), want.view(np.uint64)), np.abs(got - want).max()
crossing = comm.allreduce_sum(np.array([float(sum(s > 1 for s in spans))]))[0]
if me == 0:
    assert crossing > 0, "no H row crossed a block edge: the draw tests nothing"
    with open(sys.argv[1], "w") as f:
        f.write(f"ok {P}")
