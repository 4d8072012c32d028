"""Run under mpiexec by test_adaptive_inflation_mpi.py: for each case of argv[1] (a JSON list of
[members' directory, output directory, [analysis.inflation] keys]), two cycles of the built-in analysis
of the member files with that adaptive inflation, rows balanced over the ranks; the inflation and
obs_diag files go to <output>/c1, <output>/c2."""

import json
import sys
from pathlib import Path

from enkflow.config import AnalysisConfig
from enkflow.experiment.analysis_step import AnalysisFiles, analyse_files
from enkflow.parallel import get_comm
from enkflow.state import StateConfig

comm = get_comm()
state = StateConfig(variables=["soil_moisture"], coordinates=["land_lon", "land_lat"])
for src_dir, out_dir, inflation in json.loads(sys.argv[1]):
    src, out = Path(src_dir), Path(out_dir)
    paths = sorted(src.glob("member_*.nc"))
    cfg = AnalysisConfig.model_validate({"method": "letkf", "localization": {"radius": 3000.0, "metric": "sphere"},
                                         "inflation": inflation})
    files = AnalysisFiles(cycle_dir=lambda c, out=out: out / f"c{c}", first_cycle=1)
    for k in (1, 2):
        analyse_files(paths, src / "obs.nc", state, cfg, comm=comm, cycle=k, balance=True, files=files)
