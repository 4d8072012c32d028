"""Run under mpiexec by test_barrier.py: the last rank arrives at ``Comm.barrier`` 1.5 s after the
others; no rank may leave before it arrives, and the waiting ranks must give their core back (a
spinning wait costs about one CPU second per second waited). Rank 0 writes
"ok <size> <the waiters' largest CPU seconds>" to argv[1]."""

import sys
import time

from enkflow.parallel import get_comm

LATE_S = 1.5

comm = get_comm()
comm.barrier()
if comm.rank == comm.size - 1:
    time.sleep(LATE_S)
c0, entered = time.process_time(), time.time()
comm.barrier()
left, cpu = time.time(), time.process_time() - c0
every = comm.allgather_obj((entered, left, cpu))
if comm.rank == 0:
    last_arrival = every[-1][0]
    early = [r for r, (_, leave, _) in enumerate(every) if leave < last_arrival]
    assert not early, f"ranks {early} left the barrier before the last rank arrived"
    waited_cpu = max(c for _, _, c in every[:-1])
    assert waited_cpu < 0.3 * LATE_S, f"a waiting rank spent {waited_cpu:.2f} CPU seconds in a {LATE_S} s wait"
    with open(sys.argv[1], "w") as f:
        f.write(f"ok {comm.size} {waited_cpu:.3f}")
