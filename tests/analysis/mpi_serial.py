"""Run under mpiexec by test_serial_filter_mpi.py: the serial filter's analysis of the member files
in argv[1] (updated in place) on this run's ranks; the test runs :func:`analyse` in process too."""

import sys
from pathlib import Path

from enkflow.config import AnalysisConfig
from enkflow.experiment.analysis_step import analyse_files
from enkflow.parallel import Comm, get_comm
from enkflow.state import StateConfig


def analyse(src: Path, comm: Comm) -> None:
    cfg = AnalysisConfig.model_validate({"method": "ensrf", "inflation": {"prior": 1.05, "rtps": 0.3},
                                         "localization": {"radius": 3000.0, "metric": "sphere"}})
    state = StateConfig(variables=["soil_moisture"], coordinates=["land_lon", "land_lat"])
    analyse_files(sorted(src.glob("member_*.nc")), src / "obs.nc", state, cfg, comm=comm)


if __name__ == "__main__":
    analyse(Path(sys.argv[1]), get_comm())
