"""Run under mpiexec by test_mpi.py: analyse a fixed problem on row blocks and
write the gathered result (rank 0) to the .npz path given as argv[1]."""

import sys

import numpy as np

from analysis_problems import grid_problem
from enkflow.analysis import ETKF, EnKF, EnKFN, LETKF, Inflation, LocalDomains, Localization
from enkflow.obs import LinearObsOperator
from enkflow.parallel import RowBlocks, get_comm

comm = get_comm()
X, _, obs, coords, where = grid_problem(nx=30, ny=17, N=16, frac=0.2)
start, stop = RowBlocks(X.shape[0], comm.size).bounds(comm.rank)
H = LinearObsOperator.selection(where, X.shape[0])
Xl = np.asfortranarray(X[start:stop])
HX = H.apply(Xl, start, comm)
infl = Inflation(prior=1.05, rtps=0.2)
loc = Localization(half_width=3.0)
out = {
    "letkf": LETKF(localization=loc, inflation=infl).analyze(Xl, HX, obs, domains=LocalDomains.per_row(coords[start:stop])),
    "etkf": ETKF(inflation=infl).analyze(Xl, HX, obs),
    "enkf": EnKF(seed=4).analyze(Xl, HX, obs),
    "enkfn": EnKFN(inflation=infl, xn=2.0, rotate=True, seed=4).analyze(Xl, HX, obs, cycle=3),
}
full = {k: comm.allgather_rows(np.ascontiguousarray(v)) for k, v in out.items()}
if comm.rank == 0:
    np.savez(sys.argv[1], size=comm.size, **full)
