"""What a rank waiting for slower ones costs them where processes outnumber cores (docs/analysis.md,
the windows' rounds): ``--workers`` ranks multiply matrices while the others wait, either in MPICH's
blocking ``MPI_Barrier`` (it spins) or in ``Comm.barrier`` (an ``MPI_Ibarrier`` tested between naps).

    mpiexec -n 8 python benchmarks/spinning_wait.py [--workers 2] [--repeats 3]

Run it with more ranks than cores (8 on the 2-core development machine). Rank 0 prints, per way and
repeat, the workers' slowest wall seconds and the waiters' largest CPU seconds, then a JSON line of the
medians and ``workers_slowdown`` (spinning / napping wall seconds of the workers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from enkflow.parallel import get_comm
from enkflow.parallel.comm import MPIComm


def _work(seed: int) -> None:
    a = np.random.default_rng(seed).random((600, 600))
    for _ in range(60):
        a = a @ a
        a /= np.abs(a).max()


def _one(comm: MPIComm, workers: int, spin: bool) -> tuple[float, float]:
    comm.barrier()
    w0, c0 = time.perf_counter(), time.process_time()
    if comm.rank < workers:
        _work(comm.rank)
    if spin:
        comm.comm.Barrier()
    else:
        comm.barrier()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    every = comm.allgather_obj((wall, cpu))
    return max(w for w, _ in every[:workers]), max(c for _, c in every[workers:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    comm = get_comm()
    if not isinstance(comm, MPIComm) or comm.size <= a.workers:
        raise SystemExit(f"run under mpiexec with more than --workers {a.workers} ranks")
    got: dict[str, list[tuple[float, float]]] = {"spinning": [], "napping": []}
    for _ in range(a.repeats):
        for way in got:
            got[way].append(_one(comm, a.workers, way == "spinning"))
            if comm.rank == 0:
                wall, cpu = got[way][-1]
                print(f"{way:9s} workers {wall:6.2f} s wall, waiters {cpu:6.2f} s CPU", flush=True)
    if comm.rank == 0:
        med = {f"{way}_{k}": statistics.median(r[i] for r in runs) for way, runs in got.items()
               for i, k in enumerate(("workers_wall_s", "waiters_cpu_s"))}
        med["workers_slowdown"] = med["spinning_workers_wall_s"] / med["napping_workers_wall_s"]
        print(json.dumps({"ranks": comm.size, "workers": a.workers, **med}))


if __name__ == "__main__":
    main()
