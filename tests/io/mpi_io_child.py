"""Run under mpiexec by test_mpi.py: read (and optionally update) an ensemble with P ranks.

usage: mpi_io_child.py FILES_DIR OUT_NPY N_IO [update-safe|update-spares|update-log|update-unsafe|read]
(update-safe: the default method, shadow files; update-spares: the same after prepare_update, rank 0 slow to
adopt the spares; update-log: the write-ahead log)
"""

import sys
import time
from pathlib import Path

import numpy as np

from enkflow.io import EnsembleFiles, IOConfig, SafeUpdateConfig, UpdateMethod, shadow
from enkflow.io.generate import land_mask_config
from enkflow.parallel import get_comm
from enkflow.state import StateLayout


def new_values(rows: np.ndarray, n_ens: int) -> np.ndarray:
    """The analysis every test writes: a function of (global row, member) only."""
    return np.asfortranarray(np.cos(rows[:, None] * 0.01) + np.arange(n_ens)[None, :] * 0.5)


def main() -> None:
    d, out, n_io, what = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    comm = get_comm()
    paths = sorted(str(p) for p in d.glob("member_*.nc"))
    lay = StateLayout.from_file(paths[0], ["var0", "var1"], mask=land_mask_config())
    mode = "r" if what == "read" else "r+"
    method = UpdateMethod.LOG if what == "update-log" else UpdateMethod.AUTO
    cfg = IOConfig(io_tasks=n_io, chunk_kb=8, safe_update=SafeUpdateConfig(method=method))
    with EnsembleFiles(paths, lay, mode=mode, comm=comm, config=cfg) as ef:
        assert ef.n_io == n_io and comm.size == 2
        X = ef.read()
        full = comm.allgather_rows(X)
        if comm.rank == 0:
            np.save(out, full)
        if what.startswith("update"):
            rows = np.arange(ef.row_start, ef.row_stop)
            if what == "update-spares":  # the spares exist, and rank 0 is slow to make them the shadows
                ef.prepare_update()
                adopt = shadow.adopt_spares

                def slow(*a):
                    time.sleep(0.5)
                    adopt(*a)

                shadow.adopt_spares = slow
            ef.update(new_values(rows, len(paths)), safe=what != "update-unsafe")


if __name__ == "__main__":
    main()
