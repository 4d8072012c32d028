"""The observation-space diagnostics file (obs_diag.nc), written whole or from the observations each
rank owns, and the adaptive inflation field carried between offline analysis tasks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest
from test_analysis_step import STATE, N, analysis, copy, synth

from enkflow.config import AnalysisConfig, Metric
from enkflow.errors import InputError
from enkflow.experiment.analysis_step import AnalysisFiles, analyse_files
from enkflow.io.inflation_field import FILE_NAME as INFL_FILE
from enkflow.io.inflation_field import read_field
from enkflow.io import EnsembleFiles
from enkflow.obs.diagnostics import FILE_NAME
from enkflow.obs.obsfile import load_for_state
from enkflow.parallel import SerialComm
from enkflow.report.scores import kind_scores
from enkflow.state import StateLayout


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return synth(tmp_path_factory.mktemp("synth_diag"), "tiny", N)


def _ensemble(paths: list[Path]) -> np.ndarray:
    layout = StateLayout.from_config(paths[0], STATE)
    ens = EnsembleFiles(paths, layout, mode="r")
    try:
        return ens.read()
    finally:
        ens.close()


def test_omb_oma_equal_a_recomputation_from_the_saved_ensembles(synth_dir, tmp_path):
    paths = copy(synth_dir, tmp_path / "d")
    saved = tmp_path / "forecast"
    shutil.copytree(tmp_path / "d", saved)  # the forecast ensemble, kept before the in-place update
    out = tmp_path / "cycle"
    res = analyse_files(paths, tmp_path / "d" / "obs.nc", STATE, analysis("letkf"), cycle=3,
                        files=AnalysisFiles(cycle_dir=lambda c: out))
    assert res["obs_diag_s"] >= 0
    Xf = _ensemble([saved / p.name for p in paths])
    Xa = _ensemble(paths)
    layout = StateLayout.from_config(paths[0], STATE)
    of = load_for_state(tmp_path / "d" / "obs.nc", layout, Metric.SPHERE)
    H = of.operator_for(layout.n_rows)
    HXf, HXa = H.apply(Xf, 0, SerialComm()), H.apply(Xa, 0, SerialComm())
    y = of.obs.values
    with netCDF4.Dataset(out / FILE_NAME) as ds:
        ds.set_auto_mask(False)
        g = {k: np.asarray(ds[k][:]) for k in ds.variables}
        assert ds.Conventions == "CF-1.8" and ds.featureType == "point" and int(ds.cycle) == 3
        assert ds["lon"].units == "degrees_east" and ds["qc"].flag_meanings.startswith("used")
    np.testing.assert_array_equal(g["obs_value"], y)
    np.testing.assert_array_equal(g["obs_error_variance"], of.obs.error_var)
    np.testing.assert_array_equal(g["lon"], of.obs.coords[:, 0])
    assert (g["qc"] == 0).all()
    for key, ref in (("prior_mean", HXf.mean(axis=1)), ("prior_spread", HXf.std(axis=1, ddof=1)),
                     ("posterior_mean", HXa.mean(axis=1)), ("posterior_spread", HXa.std(axis=1, ddof=1)),
                     ("omb", y - HXf.mean(axis=1)), ("oma", y - HXa.mean(axis=1))):
        np.testing.assert_allclose(g[key], ref, rtol=0, atol=1e-12, err_msg=key)
    _check_crps_and_rank(g, HXf, HXa, y, of.obs.error_var, cycle=3)
    # The statistics of the run (the analysis's own) and those of the file agree to 1e-12.
    (s,) = kind_scores(out / FILE_NAME).values()  # one kind
    omb, oma = y - HXf.mean(axis=1), y - HXa.mean(axis=1)
    assert s.n_used == y.size and s.n_gross == s.n_buddy == 0
    assert abs(s.omb_rms - np.sqrt(np.mean(omb**2))) < 1e-12 and abs(s.oma_rms - np.sqrt(np.mean(oma**2))) < 1e-12
    assert abs(s.omb_bias - omb.mean()) < 1e-12 and abs(s.oma_bias - oma.mean()) < 1e-12
    assert abs(s.omb_rms - res["omb_rms"]) < 1e-12 and abs(s.oma_rms - res["oma_rms"]) < 1e-12
    xr = pytest.importorskip("xarray")
    with xr.open_dataset(out / FILE_NAME) as ds:
        assert ds["omb"].sizes["obs"] == y.size


def _check_crps_and_rank(g: dict[str, np.ndarray], HX: np.ndarray, HXa: np.ndarray, y: np.ndarray,
                         error_var: np.ndarray, cycle: int) -> None:
    """obs_diag.nc's CRPS equals properscoring's to 1e-12, and its prior rank the count recomputed here from
    the generator the file's ``prior_rank:comment`` documents."""
    ps = pytest.importorskip("properscoring")
    np.testing.assert_allclose(g["prior_crps"], ps.crps_ensemble(y, HX), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g["posterior_crps"], ps.crps_ensemble(y, HXa), rtol=1e-12, atol=1e-12)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([0x656E6B66, cycle])))
    perturbed = HX + rng.standard_normal(HX.shape) * np.sqrt(error_var)[:, None]
    rank = np.array([sum(1 for j in range(HX.shape[1]) if perturbed[i, j] < y[i]) for i in range(y.size)])
    np.testing.assert_array_equal(g["prior_rank"], rank)
    assert g["prior_rank"].dtype == np.int32 and 0 <= rank.min() and rank.max() <= HX.shape[1]


def test_adaptive_inflation_field_carried_between_analysis_tasks(synth_dir, tmp_path):
    paths = copy(synth_dir, tmp_path / "d")
    cfg = AnalysisConfig.model_validate({"method": "letkf", "localization": {"radius": 3000.0, "metric": "sphere"},
                                         "inflation": {"adaptive": "miyoshi2011", "adaptive_sd": 0.3}})
    files = AnalysisFiles(cycle_dir=lambda c: tmp_path / f"c{c}", first_cycle=1)
    f1, f2 = tmp_path / "c1" / INFL_FILE, tmp_path / "c2" / INFL_FILE
    r1 = analyse_files(paths, tmp_path / "d" / "obs.nc", STATE, cfg, files=files, cycle=1)
    a = read_field(f1, StateLayout.from_config(paths[0], STATE).n_rows)
    assert a.min() >= 1.0 and a.max() > 1.0 and r1["inflation_mean"] == pytest.approx(a.mean())
    analyse_files(paths, tmp_path / "d" / "obs.nc", STATE, cfg, files=files, cycle=2)
    b = read_field(f2, a.size)
    assert not np.array_equal(a, b)
    # A missing previous field is an error before anything is written.
    before = _ensemble(paths)
    with pytest.raises(InputError, match="previous cycle's adaptive inflation field"):
        analyse_files(paths, tmp_path / "d" / "obs.nc", STATE, cfg, files=files, cycle=4)
    np.testing.assert_array_equal(_ensemble(paths), before)


def test_summary_per_kind_leaves_rejected_observations_out(tmp_path):
    from enkflow.analysis.obsset import ObsSet
    from enkflow.obs.diagnostics import ObsSpaceStats, write_obs_diagnostics

    rng = np.random.default_rng(1)
    n, m = 50, 6
    kinds = np.repeat([3, 7], 25)
    y = ObsSet(rng.standard_normal(n), np.full(n, 0.25), rng.uniform(-50, 50, (n, 2)), kinds)
    HX, HXa = rng.standard_normal((n, m)), 0.5 * rng.standard_normal((n, m))
    flags = np.zeros(n, np.int8)
    flags[[0, 30, 31]] = [1, 1, 2]
    write_obs_diagnostics(tmp_path / "d.nc", y, ObsSpaceStats.from_ensembles(HX, HXa, y, 5), cycle=5, n_members=m,
                          qc_flags=flags, metric="sphere", kind_names={3: "sst", 7: "t2m"})
    s = kind_scores(tmp_path / "d.nc")
    assert set(s) == {"sst", "t2m"}
    for name, sel in (("sst", kinds == 3), ("t2m", kinds == 7)):
        used = sel & (flags == 0)
        omb, oma = y.values[used] - HX[used].mean(axis=1), y.values[used] - HXa[used].mean(axis=1)
        assert s[name].n_used == used.sum() and s[name].n_gross + s[name].n_buddy == (sel & (flags > 0)).sum()
        assert abs(s[name].omb_bias - omb.mean()) < 1e-12 and abs(s[name].oma_rms - np.sqrt(np.mean(oma**2))) < 1e-12
    with netCDF4.Dataset(tmp_path / "d.nc") as ds:
        assert ds["kind"].flag_meanings == "sst t2m" and list(ds["qc"][:][[0, 30, 31]]) == [1, 1, 2]
        ds.set_auto_mask(False)
        g = {k: np.asarray(ds[k][:]) for k in ds.variables}
        assert "Hamill" in ds["prior_rank"].comment and list(ds["prior_rank"].valid_range) == [0, m]
    _check_crps_and_rank(g, HX, HXa, y.values, y.error_var, cycle=5)


def test_ranks_of_a_subset_are_the_rows_of_the_whole(monkeypatch):
    from enkflow.obs import ensemble_scores

    rng = np.random.default_rng(4)
    n, m = 300, 5
    HX, y, err = rng.standard_normal((n, m)), rng.standard_normal(n), rng.uniform(0.1, 3.0, n)
    whole = ensemble_scores.prior_ranks(HX, y, err, 9)
    e_whole = ensemble_scores.observation_perturbations(9, err, m)
    monkeypatch.setattr(ensemble_scores, "DRAW_ROWS", 64)  # drawn in 5 blocks: the same stream
    for ids in (np.arange(n), np.array([0, 63, 64, 65, 299]), np.array([128]), np.array([], np.int64)):
        sub = ensemble_scores.prior_ranks(HX[ids], y[ids], err[ids], 9, ids, n)
        assert sub.dtype == np.int32 and np.array_equal(sub, whole[ids])
        e = ensemble_scores.observation_perturbations(9, err[ids], m, ids, n)
        assert e.tobytes() == e_whole[ids].tobytes()
    with pytest.raises(ValueError, match="increase strictly"):
        ensemble_scores.prior_ranks(HX[:2], y[:2], err[:2], 9, np.array([3, 3]), n)
    with pytest.raises(ValueError, match="need n_total"):
        ensemble_scores.prior_ranks(HX[:2], y[:2], err[:2], 9, np.array([1, 3]))


@pytest.mark.mpi
def test_distributed_file_equals_the_whole_one(mpiexec, subprocess_env, tmp_path):
    """At 1 and 3 ranks with a random ownership: every variable and attribute as write's."""
    script = Path(__file__).parent / "mpi_obs_diag.py"
    for n in (1, 3):
        out = tmp_path / f"p{n}"
        out.mkdir()
        cmd = [sys.executable, str(script), str(out)]
        proc = subprocess.run(([mpiexec, "-n", "3"] + cmd) if n > 1 else cmd, env=subprocess_env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (out / "ok.txt").read_text() == f"ok {n}"


def test_crps_keeps_its_precision_far_from_zero():
    """Values near 300 (a temperature in K) with a spread of 0.1: the sorted departures keep 1e-12."""
    from enkflow.obs.ensemble_scores import ensemble_crps

    ps = pytest.importorskip("properscoring")
    rng = np.random.default_rng(7)
    HX = 300.0 + 0.1 * rng.standard_normal((200, 40))
    y = 300.0 + 0.1 * rng.standard_normal(200)
    np.testing.assert_allclose(ensemble_crps(HX, y), ps.crps_ensemble(y, HX), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(ensemble_crps(HX[:, :1], y), np.abs(HX[:, 0] - y), rtol=0, atol=1e-13)


@pytest.mark.parametrize("n_total", [1, 5, 8, 9, 2155])
@pytest.mark.parametrize("members", [3, 8, 40])
def test_crps_of_the_observations_a_rank_owns_has_the_whole_cycles_bits(n_total, members):
    """BLAS rounds a row of the pair sum by its place in the matrix: any subset (an owner's observations)
    scores each observation to the bits of the whole cycle's call, the last rows of the file included."""
    from enkflow.obs.ensemble_scores import ensemble_crps

    rng = np.random.default_rng(n_total + members)
    HX = rng.standard_normal((n_total, members)) * 10.0 ** rng.uniform(-3, 3, (n_total, 1))
    y = rng.standard_normal(n_total)
    whole = ensemble_crps(HX, y)
    for size in (0, 1, n_total // 3, n_total - 1, n_total):
        ids = np.sort(rng.choice(n_total, size, replace=False))
        assert ensemble_crps(HX[ids], y[ids], ids, n_total).tobytes() == whole[ids].tobytes(), size
    tail = np.arange(max(0, n_total - 3), n_total)
    assert ensemble_crps(HX[tail], y[tail], tail, n_total).tobytes() == whole[tail].tobytes()
