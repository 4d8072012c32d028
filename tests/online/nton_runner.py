"""A runner for the N-to-M tests (any number of MPI ranks): each rank owns an uneven slice of
every field and advances it element-wise, ``nsteps`` times; the carried counter counts steps.

Usage: [mpiexec -n R] python nton_runner.py DIR NAME
"""

import sys
import time
from pathlib import Path

import numpy as np

from enkflow.online import Runner
from enkflow.parallel import get_comm

sys.path.insert(0, str(Path(__file__).parent))
from nton_server import FIELDS  # noqa: E402


def slices(size: int, rank: int, ranks: int) -> tuple[int, int]:
    """Uneven cuts: rank r gets a share growing with r (the last may get zero of a small field)."""
    w = np.arange(1, ranks + 1, dtype=float)
    cuts = np.concatenate([[0], np.round(np.cumsum(w) / w.sum() * size)]).astype(int)
    return int(cuts[rank]), int(cuts[rank + 1] - cuts[rank])


def main() -> None:
    d = Path(sys.argv[1])
    comm = get_comm()
    while not (d / "address").exists():
        time.sleep(0.05)
    runner = Runner((d / "address").read_text().strip(), (d / "token").read_text().strip(), comm=comm)
    sl = {f.name: slices(f.size, comm.rank, comm.size) for f in FIELDS}
    runner.init(FIELDS, slices=sl)
    print(f"runner rank {comm.rank}: in_place={runner.in_place}", flush=True)  # shared memory for every piece
    state = {f.name: np.zeros(sl[f.name][1], dtype=f.dtype) for f in FIELDS}
    state, nsteps = runner.expose(state)
    while nsteps:
        time.sleep(0.02)  # some model time, so that every runner gets members
        for _ in range(nsteps):
            state["a"][...] = state["a"] + 0.1 * np.sin(state["a"])
            state["b"][...] = state["b"] * np.float32(0.9) + np.float32(0.05)
            state["h"] += 1
        state, nsteps = runner.expose(state)
    runner.close()


if __name__ == "__main__":
    main()
