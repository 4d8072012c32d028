"""Run under mpiexec by test_output_mpi.py: every rank adds its row block of every member and time."""

from __future__ import annotations

import sys

import numpy as np

from enkflow.output import Output
from enkflow.parallel import get_comm

NY, NX, N, T = 12, 10, 3, 2


def full(t: int, m: int) -> np.ndarray:
    return np.random.default_rng(100 * t + m).standard_normal((NY, NX))


def main(directory: str) -> None:
    comm = get_comm()
    rows = np.array_split(np.arange(NY), comm.size)[comm.rank]
    cfg = {"directory": directory, "members": N, "dims": {"y": {"size": NY}, "x": {"size": NX}},
           "fields": {"u": {"dims": ["y", "x"], "dtype": "float64"}}}
    with Output(cfg, comm=comm) as out:
        for t in range(T):
            for m in range(1, N + 1):
                out.add("u", full(t, m)[rows], time=float(t), member=m, region=(int(rows[0]), 0))
        out.sync()
    print(f"rank {comm.rank} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
