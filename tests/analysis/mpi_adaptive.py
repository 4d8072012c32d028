"""Run under mpiexec by test_adaptive_inflation_mpi.py: two cycles of the built-in analysis of the
member files in argv[1] with adaptive inflation (argv[3]: [analysis.inflation] keys as JSON), rows
balanced over the ranks; the inflation and obs_diag files go to argv[2]/c1, argv[2]/c2."""

import json
import sys
from pathlib import Path

from enkflow.config import AnalysisConfig
from enkflow.experiment.analysis_step import AnalysisFiles, analyse_files
from enkflow.parallel import get_comm
from enkflow.state import StateConfig

comm = get_comm()
src, out = Path(sys.argv[1]), Path(sys.argv[2])
paths = sorted(src.glob("member_*.nc"))
cfg = AnalysisConfig.model_validate({"method": "letkf", "localization": {"radius": 3000.0, "metric": "sphere"},
                                     "inflation": json.loads(sys.argv[3])})
state = StateConfig(variables=["soil_moisture"], coordinates=["land_lon", "land_lat"])
files = AnalysisFiles(cycle_dir=lambda c: out / f"c{c}", first_cycle=1)
for k in (1, 2):
    analyse_files(paths, src / "obs.nc", state, cfg, comm=comm, cycle=k, balance=True, files=files)
