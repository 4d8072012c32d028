"""Run under mpiexec by test_alltoallv.py: every rank sends rows of a known global
array to other ranks with ``alltoallv_rows`` and checks what it receives; then
``alltoallv`` of float (n, 40), int64, a structured dtype, uneven and empty sends, and
a mismatch of row sizes; rank 0 writes "ok <size>" to argv[1]."""

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


def rows_for(src_rank, dst_rank, dtype, trailing):
    """The rows ``src_rank`` sends ``dst_rank``: a count that depends on both (0 for some pairs)."""
    n = (3 * src_rank + 5 * dst_rank) % 4
    base = np.arange(n * int(np.prod(trailing, dtype=np.int64)), dtype=np.float64).reshape((n,) + trailing)
    return (base + 1000 * src_rank + 100 * dst_rank).astype(dtype)


rec = np.dtype([("value", "f8"), ("kind", "i4"), ("id", "i8"), ("tag", "S3")])
for dtype, trailing in ((np.dtype(np.float64), (40,)), (np.dtype(np.int64), ()), (np.dtype(np.int8), (2, 3))):
    blocks = [rows_for(r, q, dtype, trailing) for q in range(P)]
    got, counts = comm.alltoallv(np.concatenate(blocks), [len(b) for b in blocks])
    want = np.concatenate([rows_for(q, r, dtype, trailing) for q in range(P)])
    assert got.dtype == dtype and got.flags.c_contiguous and np.array_equal(got, want), (dtype, trailing)
    assert counts.dtype == np.int64 and counts.tolist() == [(3 * q + 5 * r) % 4 for q in range(P)]

# A structured record per row; rank 0 sends nothing, and nobody sends to rank 0.
n_rec = [0] + [q + r for q in range(1, P)] if r else [0] * P
recs = np.zeros(sum(n_rec), dtype=rec)
recs["id"] = np.arange(recs.size) + 10_000 * r
recs["value"] = recs["id"] * 0.5
recs["kind"] = r
recs["tag"] = b"r%d" % r
got, counts = comm.alltoallv(recs, n_rec)
assert got.dtype == rec and counts[0] == 0
for q in range(1, P):
    part = got[int(counts[:q].sum()):int(counts[:q + 1].sum())]
    assert len(part) == (q + r if r else 0) and (part["kind"] == q).all() and (part["tag"] == b"r%d" % q).all()
    assert np.array_equal(part["value"], part["id"] * 0.5)

# Every rank empty.
got, counts = comm.alltoallv(np.empty((0, 7), np.float32), [0] * P)
assert got.shape == (0, 7) and got.dtype == np.float32 and counts.tolist() == [0] * P
# Rows of different sizes: every rank raises, none hangs.
try:
    comm.alltoallv(np.zeros((0, 2 + (r == P - 1))), [0] * P)
    raise AssertionError("a mismatch of row sizes passed")
except ValueError as e:
    assert "differ in size" in str(e)
ok = comm.allgather_obj(True)
if r == 0 and all(ok):
    with open(sys.argv[1], "w") as f:
        f.write(f"ok {P}")
