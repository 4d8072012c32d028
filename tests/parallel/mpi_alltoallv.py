"""Run under mpiexec by test_alltoallv.py: every rank sends rows of a known global
array to other ranks with ``alltoallv_rows`` and checks what it receives; rank 0
writes "ok <size>" to argv[1]."""

import sys

import numpy as np

from enkflow.parallel import get_comm

comm = get_comm()
P, r = comm.size, comm.rank
N = 5
n_rows = 23
G = np.arange(n_rows * N, dtype=np.float64).reshape(n_rows, N) * 1.5 + 0.25
# Source blocks: uneven (rank r holds rows src[r]:src[r+1]); destination blocks: another split.
src = np.array([0] + sorted(np.random.default_rng(1).integers(0, n_rows, P - 1).tolist()) + [n_rows])
dst = np.array([0] + sorted(np.random.default_rng(2).integers(0, n_rows, P - 1).tolist()) + [n_rows])


def overlap(a0, a1, b0, b1):
    return max(0, min(a1, b1) - max(a0, b0))


send_counts = [overlap(src[r], src[r + 1], dst[q], dst[q + 1]) for q in range(P)]
recv_counts = [overlap(src[q], src[q + 1], dst[r], dst[r + 1]) for q in range(P)]
mine = np.asfortranarray(G[src[r]:src[r + 1]])
got = comm.alltoallv_rows(mine, send_counts, recv_counts)
assert got.flags.f_contiguous and got.shape == (dst[r + 1] - dst[r], N), got.shape
assert np.array_equal(got, G[dst[r]:dst[r + 1]])
# And back.
back = comm.alltoallv_rows(got, recv_counts, send_counts)
assert np.array_equal(back, mine)
ok = comm.allgather_obj(True)
if r == 0 and all(ok):
    with open(sys.argv[1], "w") as f:
        f.write(f"ok {P}")
