"""Run under mpiexec by test_obs_layout_mpi.py: every case of ``cases`` in the JSON file argv[2] analysed on copies of
the land problem argv[1] (its member files), once with ``[analysis] observations = "replicated"`` and once
``"distributed"``; each run leaves in ``argv[3]/<case>_<layout>/``: ``members.npy`` (n_rows, N) the analysed
members, ``diag.json`` the diagnostics and ``c0/`` the cycle directory (obs_diag.nc, an inflation field).
Then each case of ``bad`` (an observation file with an error) is analysed distributed on ``argv[3]/bad/``
(the member files copied once); ``argv[3]/<case>_errors.json``: each rank's error, ``"Type: message"``.

A case: ``name``, ``obs`` (the observation file), ``analysis`` (``[analysis]`` keys), ``observations``
(``[observations]`` keys), ``hx`` (None, or the operator stage's H(x) files, member 1 first) and
``balance`` (None, true or false: :func:`~enkflow.experiment.analysis_step.analyse_files`)."""

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import netCDF4
import numpy as np

import enkflow.experiment.step as step_module
from enkflow.config import AnalysisConfig
from enkflow.errors import EnkflowError
from enkflow.experiment.analysis_step import AnalysisFiles, analyse_files
from enkflow.obs.config import ObsSettingsConfig
from enkflow.obs.obsfile import ObsSettings
from enkflow.parallel import get_comm
from enkflow.state import StateConfig

src, spec, out = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])
comm = get_comm()
# Small chunks, so that a rank's domains make several windows of the distributed analysis
# (obs_distributed.WINDOW_CHUNKS chunks each) on this small problem, as on a large one.
_make_filter = step_module.make_filter
step_module.make_filter = lambda analysis: dataclasses.replace(_make_filter(analysis), chunk=16)
state = StateConfig(variables=["soil_moisture"], coordinates=["land_lon", "land_lat"])
members = sorted(src.glob("member_*.nc"))


def copy_members(d: Path) -> list[Path]:
    """Copies of the member files in ``d`` (made by rank 0)."""
    copies = [d / p.name for p in members]
    if comm.rank == 0:
        d.mkdir(parents=True)
        for p, q in zip(members, copies):
            shutil.copyfile(p, q)
    comm.barrier()
    return copies


def analyse(case: dict, layout: str, copies: list[Path], d: Path) -> dict:
    cfg = AnalysisConfig.model_validate({**case["analysis"], "observations": layout})
    settings = ObsSettings(ObsSettingsConfig.model_validate(case["observations"]), cfg.localization)
    hx = [Path(p) for p in case["hx"]] if case["hx"] else None
    files = AnalysisFiles(cycle_dir=lambda c: d / f"c{c}")
    return analyse_files(copies, case["obs"], state, cfg, comm=comm, files=files, hx_files=hx, obs_settings=settings,
                         balance=case["balance"])


def run(case: dict, layout: str) -> None:
    d = out / f"{case['name']}_{layout}"
    copies = copy_members(d / "members")
    diag = analyse(case, layout, copies, d)
    comm.barrier()
    if comm.rank == 0:
        cols = []
        for q in copies:
            with netCDF4.Dataset(q) as ds:
                cols.append(np.asarray(ds["soil_moisture"][:], dtype=np.float64))
        np.save(d / "members.npy", np.stack(cols, axis=1))
        (d / "diag.json").write_text(json.dumps(diag))
        shutil.rmtree(d / "members")


def refused(case: dict, copies: list[Path]) -> None:
    try:
        analyse(case, "distributed", copies, out / "bad")
        said = None
    except EnkflowError as exc:
        said = f"{type(exc).__name__}: {exc}"
    every = comm.allgather_obj(said)
    if comm.rank == 0:
        (out / f"{case['name']}_errors.json").write_text(json.dumps(every))


for case in spec["cases"]:
    for layout in ("replicated", "distributed"):
        run(case, layout)
bad_copies = copy_members(out / "bad")
for case in spec["bad"]:
    refused(case, bad_copies)
