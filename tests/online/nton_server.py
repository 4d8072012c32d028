"""A server (any number of MPI ranks) for the N-to-M tests: three fields of three dtypes, two of them
assimilated, one carried; writes the final ensemble of every field to OUT.npz from rank 0.

Usage: [mpiexec -n P] python nton_server.py DIR MIN_RUNNERS [BIND]  (DIR/token is read; DIR/address is
written, and DIR/bus, the ranks' bus address, with several ranks)
"""

import sys
from pathlib import Path

import numpy as np

from enkflow.analysis.factory import make_filter
from enkflow.config import AnalysisConfig
from enkflow.experiment.cycling import ObservationSpace
from enkflow.experiment.step import AnalysisStep
from enkflow.obs import ObsSet
from enkflow.obs.operators import LinearObsOperator
from enkflow.online import Field, Problem, Server, ServerConfig
from enkflow.parallel import get_comm

FIELDS = (Field("a", "float64", (37,)), Field("b", "float32", (5, 3)), Field("h", "int32", (11,), assimilated=False))
N_MEMBERS = 5
N_ROWS = 37 + 15
OBS_ROWS = np.arange(0, N_ROWS, 3)


def initial_member(m: int) -> list[np.ndarray]:
    rng = np.random.default_rng(m)
    return [rng.standard_normal(37), rng.standard_normal(15).astype(np.float32), np.arange(11, dtype=np.int32) * m]


class Obs(ObservationSpace):
    def __init__(self):
        self.H = LinearObsOperator.selection(OBS_ROWS, N_ROWS)

    def observations(self, cycle):
        y = np.sin(OBS_ROWS + cycle) * 0.5
        return ObsSet(y, np.full(y.size, 0.3), OBS_ROWS[:, None].astype(float))

    def apply(self, cycle, X, row_start, comm):
        return self.H.apply(X, row_start, comm)

    def apply_analysis(self, cycle, Xa, row_start, comm):
        return self.H.apply(Xa, row_start, comm)


def initial(store):
    for m in range(1, N_MEMBERS + 1):
        for k, full in enumerate(initial_member(m)):
            lo, hi = store.ranges[k]
            store.column(k, m)[...] = full.reshape(-1)[lo:hi]


def main() -> None:
    d = Path(sys.argv[1])
    min_runners = int(sys.argv[2])
    comm = get_comm()
    flt = make_filter(AnalysisConfig.model_validate({"method": "etkf", "inflation": {"prior": 1.02}}))
    problem = Problem(FIELDS, N_MEMBERS, initial, lambda c: 2, Obs(), AnalysisStep(flt))
    server = Server(problem, ServerConfig(token=(d / "token").read_text().strip(), heartbeat_s=0.2,
                                          heartbeat_timeout_s=20, address_file=d / "address",
                                          min_runners=min_runners, bind=sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"),
                    comm=comm)
    if comm.rank == 0 and server.bus is not None:
        (d / "bus").write_text(server.bus.address)
    server.run([1, 2, 3])
    parts = comm.allgather_obj([p.copy() for p in server.store.parts])
    if comm.rank == 0:
        out = {f.name: np.concatenate([p[k] for p in parts], axis=0) for k, f in enumerate(FIELDS)}
        np.savez(d / "out.npz", **out)


if __name__ == "__main__":
    main()
