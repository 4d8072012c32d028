"""Run under mpiexec by test_balance_mpi.py: analyse copies of a synthetic land problem
(argv[1]) from its restart files, with the I/O row blocks (balance None) and balanced
(True), and write the analysed members (rank 0) and diagnostics to argv[2] (.npz)."""

import json
import shutil
import sys
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.config import AnalysisConfig
from enkflow.experiment.analysis_step import analyse_files
from enkflow.parallel import get_comm
from enkflow.state import StateConfig

src, out, radius = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
comm = get_comm()
state = StateConfig(variables=["soil_moisture"], coordinates=["land_lon", "land_lat"])
cfg = AnalysisConfig.model_validate(
    {"method": "lestkf", "localization": {"radius": radius, "convention": "cutoff", "metric": "sphere"}})
members = sorted(p.name for p in src.glob("member_*.nc"))
res = {}
for name, bal in (("none", None), ("off", False), ("on", True)):
    d = out.parent / f"{out.stem}_{name}"
    if comm.rank == 0:
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
    comm.barrier()
    diag = analyse_files([d / m for m in members], d / "obs.nc", state, cfg, comm=comm, balance=bal)
    comm.barrier()
    if comm.rank == 0:
        cols = []
        for m in members:
            with netCDF4.Dataset(d / m) as ds:
                cols.append(np.asarray(ds["soil_moisture"][:], dtype=np.float64))
        res[name] = np.stack(cols, axis=1)
        res[f"diag_{name}"] = json.dumps(diag)
if comm.rank == 0:
    np.savez(out, size=comm.size, **res)
