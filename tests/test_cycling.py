"""The one cycle driver (enkflow.experiment.cycling): every ensemble store, observation space and
propagator satisfies the interfaces, run_cycles on Lorenz-96 reproduces the loop it replaced, and
analyse gives the same bits whether the ensemble lives in the member files or in memory."""

from __future__ import annotations

import shutil
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.apps import l96 as l96x
from enkflow.analysis import Geometry, LocalDomains
from enkflow.analysis.factory import make_filter
from enkflow.config import AnalysisConfig, Method, Metric
from enkflow.experiment.cycling import (
    ArrayStore, EnsembleStore, NoOutput, ObservationSpace, OutputSink, Propagator, run_cycles,
)
from enkflow.experiment.decomposition import LocalGeometry
from enkflow.experiment.step import AnalysisStep, analyse
from enkflow.experiment.driver import Experiment
from enkflow.experiment.file_store import FileStore
from enkflow.io import EnsembleFiles
from enkflow.models import lorenz96 as l96
from enkflow.obs import ObsSet
from enkflow.obs.obsfile import load_for_state
from enkflow.obs.space import FileObservations
from enkflow.state import StateConfig, StateLayout

N = 6
STATE = StateConfig(variables=["soil_moisture"], coordinates=["land_lon", "land_lat"])
TIMINGS = {"analysis_s", "search_s", "kernel_s"}


@pytest.fixture(scope="module")
def land(tmp_path_factory) -> Path:
    from enkflow.models.synthetic_land_files import generate

    out = tmp_path_factory.mktemp("land")
    generate(out, size="tiny", members=N, overwrite=True)
    return out


def members(land: Path, d: Path) -> list[Path]:
    shutil.copytree(land, d)
    return [d / f"member_{m:04d}.nc" for m in range(1, N + 1)]


def analysis_config(method: str) -> AnalysisConfig:
    cfg: dict = {"method": method, "seed": 3, "inflation": {"prior": 1.05}}
    if method in ("letkf", "lestkf"):
        cfg["localization"] = {"radius": 3000.0, "convention": "cutoff", "metric": "sphere"}
    return AnalysisConfig.model_validate(cfg)


def test_stores_spaces_and_propagators_satisfy_the_interfaces(land, tmp_path):
    paths = members(land, tmp_path / "d")
    layout = StateLayout.from_config(paths[0], STATE)
    with EnsembleFiles(paths, layout, mode="r+") as ens:
        store = FileStore(ens)
        assert isinstance(store, EnsembleStore)
        assert (store.n_rows, store.n_members, store.row_start, store.row_stop) == (layout.n_rows, N, 0, layout.n_rows)
    assert isinstance(FileObservations(load_for_state(land / "obs.nc", layout, Metric.SPHERE), layout.n_rows), ObservationSpace)
    mem = ArrayStore(np.zeros((5, 3)))
    assert isinstance(mem, EnsembleStore) and (mem.n_rows, mem.n_members, mem.row_start, mem.row_stop) == (5, 3, 0, 5)
    nature = l96x.NatureRun(np.zeros(l96.N_VARS), np.random.default_rng(0), 1.0)
    assert isinstance(nature, ObservationSpace)
    assert isinstance(l96x.Forecast(nature, ArrayStore(np.zeros((l96.N_VARS, 3)))), Propagator)
    assert issubclass(Experiment, Propagator)  # the offline job scheme's forecast
    assert isinstance(NoOutput(), OutputSink)
    assert not isinstance(object(), EnsembleStore)


def old_loop(s: l96x.L96Setup) -> tuple[np.ndarray, list[np.ndarray]]:
    """The Lorenz-96 cycle loop before run_cycles (enkflow.models.l96_experiment.run as of aa86e57),
    returning the summed scores and the analysis ensemble of every cycle."""
    nature = np.random.default_rng([s.seed, 0])
    fil_rng = np.random.default_rng([s.seed, 1])
    n = l96.N_VARS
    truth = l96.spin_up(nature)
    E = np.asfortranarray(truth[:, None] + fil_rng.standard_normal((n, s.members)))
    coords = np.arange(n, dtype=float)
    obs_err = np.full(n, s.obs_std**2)
    f = make_filter(l96x.analysis_config(s))
    kw: dict = {}
    if s.method.is_local:
        k = s.domain_size
        groups = np.arange(n) // k
        centres = (np.arange(n // k) * k + 0.5 * (k - 1)).astype(float)
        kw = {"domains": LocalDomains.from_groups(groups, centres), "geometry": Geometry(Metric.PERIODIC, coords, float(n))}
    sums = np.zeros(3)
    ensembles = []
    for c in range(s.burn_in + s.cycles):
        truth = l96.step(truth)
        E = l96.step(E)
        y = truth + s.obs_std * nature.standard_normal(n)
        obs = ObsSet(y, obs_err, coords)
        xf = E.mean(axis=1)
        E = f.analyze(E, E, obs, cycle=c, **kw)
        ensembles.append(E.copy())
        if c >= s.burn_in:
            xa = E.mean(axis=1)
            sums += (
                np.sqrt(np.mean((xa - truth) ** 2)),
                np.sqrt(np.mean(E.var(axis=1, ddof=1))),
                np.sqrt(np.mean((xf - truth) ** 2)),
            )
    return sums, ensembles


@pytest.mark.parametrize("method", [Method.LETKF, Method.ETKF, Method.ENKF, Method.DENKF])
def test_run_cycles_on_lorenz96_equals_the_loop_it_replaced(method):
    s = l96x.L96Setup(method=method, members=12, inflation=1.05, cycles=40, burn_in=10, seed=2)
    sums, ensembles = old_loop(s)
    # The pieces, cycle by cycle: the same analysis ensembles, bit for bit.
    nature_rng = np.random.default_rng([s.seed, 0])
    fil_rng = np.random.default_rng([s.seed, 1])
    nature = l96x.NatureRun(l96.spin_up(nature_rng), nature_rng, s.obs_std)
    store = ArrayStore(nature.truth[:, None] + fil_rng.standard_normal((l96.N_VARS, s.members)))
    f = make_filter(l96x.analysis_config(s))
    local = None
    if method.is_local:
        n, k = l96.N_VARS, s.domain_size
        centres = (np.arange(n // k) * k + 0.5 * (k - 1)).astype(float)
        local = LocalGeometry(LocalDomains.from_groups(np.arange(n) // k, centres), Geometry(Metric.PERIODIC, nature.coords, float(n)))
    got = []
    step = AnalysisStep(f, local)
    done = run_cycles(range(s.burn_in + s.cycles), l96x.Forecast(nature, store),
                      lambda c: analyse(step, store, nature, c)[1],
                      on_cycle_end=lambda c, diag: got.append(store.X.copy()))
    assert done == list(range(s.burn_in + s.cycles))
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, ensembles, strict=True))
    # And the scores of enkflow l96.
    res = l96x.run(s)
    assert (res.rmse_a, res.spread_a, res.rmse_f) == tuple(float(x) for x in sums / s.cycles)


@pytest.mark.parametrize("method", ["letkf", "etkf", "enkf"])
def test_analyse_on_the_member_files_equals_analyse_in_memory(land, tmp_path, method):
    paths = members(land, tmp_path / "d")
    layout = StateLayout.from_config(paths[0], STATE)
    cfg = analysis_config(method)
    obs = FileObservations(load_for_state(land / "obs.nc", layout, Metric.SPHERE, cycle=4), layout.n_rows)
    local = LocalGeometry(LocalDomains.by_location(layout.coords)) if cfg.method.is_local else None
    with netCDF4.Dataset(land / "truth.nc") as ds:
        truth = np.asarray(ds["soil_moisture"][:], dtype=np.float64).ravel()
    with EnsembleFiles(paths, layout) as ens:
        mem = ArrayStore(ens.read())
    Xm, dm = analyse(AnalysisStep(make_filter(cfg), local, truth=lambda c: truth), mem, obs, 4)
    with EnsembleFiles(paths, layout, mode="r+") as ens:
        Xf, df = analyse(AnalysisStep(make_filter(cfg), local, truth=lambda c: truth), FileStore(ens), obs, 4)
    assert Xf.tobytes() == Xm.tobytes() and mem.X is Xm
    assert ({k: v for k, v in df.as_dict().items() if k not in TIMINGS}
            == {k: v for k, v in dm.as_dict().items() if k not in TIMINGS})
    assert dm.oma_rms < dm.omb_rms and dm.rmse_analysis is not None
    with EnsembleFiles(paths, layout) as ens:  # the files hold the analysis
        assert ens.read().tobytes() == Xm.tobytes()
