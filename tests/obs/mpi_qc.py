"""Run under mpiexec by test_qc_mpi.py: the QC problem of test_qc.py (planted gross errors, kinds with
their own radius and threshold, gross and buddy checks) analysed on this rank's row block, balanced;
rank 0 saves the gathered analysis and the diagnostics to argv[1] (.npz)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from enkflow.analysis import LETKF, Localization
from enkflow.config import Metric
from enkflow.experiment.cycling import ArrayStore
from enkflow.experiment.decomposition import LocalGeometry
from enkflow.experiment.step import AnalysisStep, analyse
from enkflow.obs.config import ObsSettingsConfig
from enkflow.obs.obsfile import ObsSettings, load_for_state
from enkflow.obs.space import FileObservations
from enkflow.parallel import RowBlocks, get_comm

sys.path.insert(0, str(Path(__file__).parent))
from test_qc import LOC, problem  # noqa: E402

comm = get_comm()
out = Path(sys.argv[1])
work = out.parent / f"{out.stem}_rank{comm.rank}"
work.mkdir(exist_ok=True)
layout, truth, X, files, bad, kinds = problem(work)
cfg = ObsSettingsConfig(interpolation="nearest", qc={"gross_sigma": 4.0, "buddy_radius": 6.0, "buddy_sigma": 3.0},
                        kinds={"buoy": {"radius": 12.0}, "ship": {"qc_sigma": 3.5, "error_factor": 1.2}})
settings = ObsSettings(cfg, LOC)
obs = FileObservations(load_for_state(files["bad"], layout, Metric.PERIODIC, settings=settings), layout.n_rows,
                       settings=settings)
blocks = RowBlocks(layout.n_rows, comm.size)
r0, r1 = blocks.start(comm.rank), blocks.stop(comm.rank)
store = ArrayStore(np.array(X[r0:r1], order="F", copy=True), comm=comm, row_start=r0, n_rows=layout.n_rows)
# The QC decision on every rank, from the full HX (an allreduce of each rank's rows).
flags = comm.allgather_obj(obs.qc.check(obs.observations(1), obs.apply(1, store.X, r0, comm)).flags.tolist())
step = AnalysisStep(LETKF(localization=Localization.from_config(LOC)), LocalGeometry(row_coords=layout.coords, balance=True),
                    truth=lambda c: truth)
Xa, analysed = analyse(step, store, obs, 1)
diag = analysed.as_dict()
full = comm.allgather_rows(np.ascontiguousarray(Xa))
if comm.rank == 0:
    np.savez(out, Xa=full, size=comm.size, flags=np.array(flags),
             **{k: v for k, v in diag.items() if k.startswith("qc") or k in ("n_obs", "rmse_analysis")})
