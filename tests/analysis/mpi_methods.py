"""Run under mpiexec by test_methods_mpi.py: two cycles of each method of :data:`CONFIGS` on the member
files in ``argv[1]/<method>`` (updated in place), the rows balanced over the ranks (so moved between
them); the test runs :func:`analyse` in process too."""

import sys
from pathlib import Path

from enkflow.config import AnalysisConfig
from enkflow.experiment.analysis_step import analyse_files
from enkflow.parallel import Comm, get_comm
from enkflow.state import StateConfig

CONFIGS = {
    # the serial filter: every rank assimilates every observation into its own rows (Anderson & Collins 2007)
    "ensrf": {"method": "ensrf", "inflation": {"prior": 1.05, "rtps": 0.3},
              "localization": {"radius": 3000.0, "metric": "sphere"}},
    # the LNETF: the rotation drawn from (seed, cycle), each domain's analysis from its rows and observations
    "lnetf": {"method": "lnetf", "localization": {"radius": 1500.0, "metric": "sphere"}, "seed": 11,
              "lnetf": {"rs": 2.0, "rotate": True}, "inflation": {"posterior": 1.05}},
}


def analyse(src: Path, method: str, comm: Comm) -> None:
    cfg = AnalysisConfig.model_validate(CONFIGS[method])
    state = StateConfig(variables=["soil_moisture"], coordinates=["land_lon", "land_lat"])
    paths = sorted(src.glob("member_*.nc"))
    for k in (1, 2):
        analyse_files(paths, src / "obs.nc", state, cfg, comm=comm, cycle=k, balance=True)


if __name__ == "__main__":
    for name in CONFIGS:
        analyse(Path(sys.argv[1]) / name, name, get_comm())
