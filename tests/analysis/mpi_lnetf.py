"""Run under mpiexec by test_lnetf_mpi.py: two cycles of LNETF (rotation on) on the member files in
argv[1], the rows balanced over the ranks when argv[2] is "balance", in blocks otherwise."""

import sys
from pathlib import Path

from enkflow.config import AnalysisConfig
from enkflow.experiment.analysis_step import analyse_files
from enkflow.parallel import get_comm
from enkflow.state import StateConfig

comm = get_comm()
src = Path(sys.argv[1])
paths = sorted(src.glob("member_*.nc"))
cfg = AnalysisConfig.model_validate({"method": "lnetf", "localization": {"radius": 1500.0, "metric": "sphere"},
                                     "seed": 11, "lnetf": {"rs": 2.0, "rotate": True},
                                     "inflation": {"posterior": 1.05}})
state = StateConfig(variables=["soil_moisture"], coordinates=["land_lon", "land_lat"])
for k in (1, 2):
    analyse_files(paths, src / "obs.nc", state, cfg, comm=comm, cycle=k, balance=sys.argv[2] == "balance")
