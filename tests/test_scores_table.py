"""The typed scores of an experiment (enkflow.report.scores) against an independent computation, the tidy
scores table read back with xarray and the csv module, and the ``[verification]`` section's checks."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.analysis.obsset import ObsSet
from enkflow.errors import ConfigError, FileFormatError
from enkflow.experiment.verification import VerificationSection, check_verification_files, TruthFile
from enkflow.obs.diagnostics import ObsSpaceStats, write_obs_diagnostics
from enkflow.report.scores import collect_scores
from enkflow.report.scores_table import write_scores_table
from enkflow.report.settings import settings_summary
from enkflow.state import StateConfig, StateLayout

NY, NX, N = 4, 5, 6
FILL = 9.969209968386869e36


def _field(path: Path, name: str, values: np.ndarray, dims: tuple[str, ...] = ("y", "x")) -> None:
    """One variable (``dims``, masked where NaN) in a NetCDF file of its own."""
    with netCDF4.Dataset(path, "w") as ds:
        for d, n in zip(dims, values.shape):
            ds.createDimension(d, n)
        v = ds.createVariable(name, "f8", dims, fill_value=FILL)
        v.units = "K"
        v.cell_methods = "member: mean"
        v[:] = np.ma.masked_invalid(values)


def _experiment(tmp: Path, rng: np.random.Generator) -> dict:
    """Cycles 1 and 2 (and the initial ensemble's 0) of a made-up run: mean/spread files, forecast
    statistics, obs_diag.nc with two kinds and QC flags, truth files; what the scores must be."""
    exp = tmp / "run"
    cfg = {"state": {"variables": ["t"]}, "experiment": {"first_cycle": 1, "members": N},
           "observations": {"qc": {"gross_sigma": 3.0}}, "verification": {"truth": "truth/t_{cycle}.nc"},
           "base_dir": str(tmp)}
    (exp / "cycles").mkdir(parents=True)
    (exp / "config.json").write_text(json.dumps(cfg))
    (tmp / "truth").mkdir()
    want: dict = {}
    for k in (0, 1, 2):
        c = exp / "cycles" / f"{k:04d}"
        c.mkdir()
        truth, mean, spread = (rng.standard_normal((NY, NX)) for _ in range(3))
        mean[0, 0] = np.nan  # a masked (land) point
        truth[0, 0] = np.nan
        _field(tmp / "truth" / f"t_{k}.nc", "t", truth)
        _field(c / "analysis_mean.nc", "t", mean)
        _field(c / "analysis_spread.nc", "t", np.abs(spread))
        d = (mean - truth).reshape(-1)[1:]
        want[k] = {"rmse_analysis": np.sqrt(np.mean(d**2)), "spread_analysis": np.sqrt(np.mean(spread**2))}
        if k == 0:
            continue
        fmean = rng.standard_normal((1, NY, NX))
        fmean[0, 0, 0] = np.nan
        _field(c / "t_forecast_mean.nc", "t_forecast_mean", fmean, ("time", "y", "x"))
        want[k]["rmse_forecast"] = np.sqrt(np.mean((fmean.reshape(-1) - truth.reshape(-1))[1:] ** 2))
        n = 40
        y = ObsSet(rng.standard_normal(n), rng.uniform(0.1, 0.5, n), rng.uniform(0, 4, (n, 2)), np.repeat([1, 2], 20))
        HX, HXa = rng.standard_normal((n, N)), 0.3 * rng.standard_normal((n, N))
        flags = np.zeros(n, np.int8)
        flags[[0, 1, 25]] = [1, 2, 1]
        write_obs_diagnostics(c / "obs_diag.nc", y, ObsSpaceStats.from_ensembles(HX, HXa, y, k), cycle=k, n_members=N,
                              qc_flags=flags, metric="cartesian", kind_names={1: "sst", 2: "t2m"})
        want[k]["obs"] = (y, HX, HXa, flags)
    return want


def test_scores_equal_an_independent_computation_and_the_table_reads_back(tmp_path):
    ps = pytest.importorskip("properscoring")
    xr = pytest.importorskip("xarray")
    want = _experiment(tmp_path, np.random.default_rng(3))
    sc = collect_scores(tmp_path / "run")  # the truth from the run's [verification]
    assert sc.truth == str(tmp_path / "truth/t_{cycle}.nc") and sc.qc_enabled and sc.members == N
    assert sc.initial is not None and sc.initial.cycle == 0 and [c.cycle for c in sc.cycles] == [1, 2]
    for c in [sc.initial, *sc.cycles]:
        v = c.variables["t"]
        assert v.rmse_analysis == pytest.approx(want[c.cycle]["rmse_analysis"], rel=1e-13)
        assert v.spread_analysis == pytest.approx(want[c.cycle]["spread_analysis"], rel=1e-13)
        assert v.rmse_free is None and v.spread_forecast is None
    for c in sc.cycles:
        assert c.variables["t"].rmse_forecast == pytest.approx(want[c.cycle]["rmse_forecast"], rel=1e-13)
        y, HX, HXa, flags = want[c.cycle]["obs"]
        for name, code in (("sst", 1), ("t2m", 2)):
            k, sel = c.kinds[name], y.kinds == code
            used = sel & (flags == 0)
            assert (k.n_used, k.n_gross, k.n_buddy) == (used.sum(), (sel & (flags == 1)).sum(), (sel & (flags == 2)).sum())
            omb = y.values[used] - HX[used].mean(axis=1)
            pss = np.mean(HX[used].var(axis=1, ddof=1))
            assert k.omb_rms == pytest.approx(np.sqrt(np.mean(omb**2)), rel=1e-12)
            assert k.consistency == pytest.approx(np.sqrt(np.mean(omb**2)) / np.sqrt(pss + y.error_var[used].mean()), rel=1e-12)
            assert k.crps_prior == pytest.approx(ps.crps_ensemble(y.values[used], HX[used]).mean(), rel=1e-12)
            assert k.crps_posterior == pytest.approx(ps.crps_ensemble(y.values[used], HXa[used]).mean(), rel=1e-12)
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([0x656E6B66, c.cycle])))
            e = rng.standard_normal(HX.shape) * np.sqrt(y.error_var)[:, None]
            rank = ((HX + e) < y.values[:, None]).sum(axis=1)[used]
            np.testing.assert_array_equal(k.rank_hist, np.bincount(rank, minlength=N + 1))

    nc, cs = write_scores_table(sc, tmp_path / "run")
    with xr.open_dataset(nc) as ds:
        assert list(ds["cycle"].values) == [0, 1, 2] and list(ds["kind"].values) == ["sst", "t2m"]
        assert ds["rmse_analysis"].sel(cycle=1, variable="t") == pytest.approx(want[1]["rmse_analysis"], rel=1e-15)
        assert np.isnan(ds["rmse_forecast"].sel(cycle=0, variable="t")) and np.isnan(ds["omb_rms"].sel(cycle=0)).all()
        assert ds["crps_prior"].sel(cycle=2, kind="t2m") == sc.cycles[1].kinds["t2m"].crps_prior
        np.testing.assert_array_equal(ds["rank_hist"].sel(cycle=2, kind="sst"), sc.cycles[1].kinds["sst"].rank_hist)
        assert np.isnan(ds["rank_hist"].sel(cycle=0)).all() and ds["rank"].size == N + 1
    with open(cs, newline="") as f:
        rows = list(csv.DictReader(f))
    assert set(rows[0]) == {"cycle", "scope", "name", "metric", "value"}
    got = {(int(r["cycle"]), r["scope"], r["name"], r["metric"]): float(r["value"]) for r in rows}
    assert got[(2, "variable", "t", "rmse_forecast")] == sc.cycles[1].variables["t"].rmse_forecast
    assert got[(1, "kind", "sst", "n_gross")] == 1 and (0, "variable", "t", "rmse_forecast") not in got
    assert [got[(1, "kind", "t2m", f"rank_hist_{r}")] for r in range(N + 1)] == sc.cycles[0].kinds["t2m"].rank_hist.tolist()


def test_a_truth_in_another_dimension_order_or_grid_is_refused(tmp_path):
    _experiment(tmp_path, np.random.default_rng(4))
    # The same number of points as the state: paired by position they would give a wrong RMSE silently.
    for dims, shape, says in ((("x", "y"), (NX, NY), r"\(x=5, y=4\) differ from \(y=4, x=5\)"),
                              (("y", "x"), (2, 10), r"\(y=2, x=10\) differ")):
        _field(tmp_path / "truth" / "t_2.nc", "t", np.zeros(shape), dims)
        with pytest.raises(FileFormatError, match=says) as ei:
            collect_scores(tmp_path / "run")
        assert "t_2.nc" in str(ei.value) and ei.value.variable == "t"


def test_verification_section_and_its_file_checks(tmp_path):
    with pytest.raises(ValueError, match="has no {cycle}"):
        VerificationSection(truth="truth.nc")
    with pytest.raises(ValueError, match="not a path template"):
        VerificationSection(free_run="t_{member}.nc")
    restart = tmp_path / "restart.nc"
    _field(restart, "t", np.arange(NY * NX, dtype=float).reshape(NY, NX))
    layout = StateLayout.from_config(restart, StateConfig(variables=["t"]))
    section = VerificationSection(truth="t_{cycle}.nc")
    (tmp_path / "t_1.nc").write_bytes(restart.read_bytes())
    check_verification_files(section, lambda p: tmp_path / p, [1], layout)
    truth = TruthFile(tmp_path / "t_1.nc", layout)  # a rank reads only its rows
    np.testing.assert_array_equal(truth[:], np.arange(NY * NX))
    np.testing.assert_array_equal(truth[7:13], np.arange(7, 13))
    with pytest.raises(ConfigError, match=r"truth file of cycle 2 not found: .*t_2.nc.*verification.truth"):
        check_verification_files(section, lambda p: tmp_path / p, [1, 2], layout)
    _field(tmp_path / "t_2.nc", "t", np.zeros((NX, NY)), ("x", "y"))
    with pytest.raises(ConfigError) as ei:
        check_verification_files(section, lambda p: tmp_path / p, [1, 2], layout)
    assert "the truth file of cycle 2" in str(ei.value) and "t_2.nc, variable 't'" in str(ei.value)
    assert ei.value.key == "verification.truth"
    sq = tmp_path / "square.nc"  # a square grid written as (x, y): the shapes agree, the names do not
    _field(sq, "t", np.zeros((4, 4)))
    square = StateLayout.from_config(sq, StateConfig(variables=["t"]))
    _field(tmp_path / "t_3.nc", "t", np.zeros((4, 4)), ("x", "y"))
    with pytest.raises(ConfigError, match=r"truth file of cycle 3: .*dimensions \('x', 'y'\).*\('y', 'x'\)"):
        check_verification_files(section, lambda p: tmp_path / p, [3], square)


def test_a_truth_template_without_cycle_is_named_with_its_key(tmp_path):
    from enkflow.experiment.config import load_experiment

    toml = tmp_path / "exp.toml"
    toml.write_text('[experiment]\ncycles = 1\nmembers = 2\nrestart = "m_{member}.nc"\nforecast_length = 1\n'
                    '[model]\ncommand = "model {restart}"\n[observations]\nfile = "obs_{cycle}.nc"\n'
                    '[analysis]\nmethod = "etkf"\n[verification]\ntruth = "truth.nc"\n')
    with pytest.raises(ConfigError, match=r"has no \{cycle\}.*verification.truth"):
        load_experiment(toml)
    toml.write_text(toml.read_text().replace('"truth.nc"', '"truth/t_{cycle:03d}.nc"'))
    assert load_experiment(toml).truth_path(7) == tmp_path / "truth" / "t_007.nc"


@pytest.mark.parametrize("observations, enabled", [
    ({}, False), ({"qc": {"buddy_radius": 100.0}}, True), ({"kinds": {"sst": {"qc_sigma": 4.0}}}, True),
    ({"kinds": {"sst": {"error_factor": 2.0}}}, False)])
def test_qc_enabled_from_the_run_config(tmp_path, observations, enabled):
    (tmp_path / "cycles").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"observations": observations}))
    scores = collect_scores(tmp_path)
    assert scores.qc_enabled is enabled
    # The page's settings follow the same decision as its QC panel (a kind's qc_sigma alone is QC on).
    qc = {r.label: r.value for r in settings_summary({"observations": observations}, scores)}["quality control"]
    assert (qc == "off") is not enabled and ("sst at 4 sigma" in qc) is ("kinds" in observations and enabled)


@pytest.mark.parametrize("metric, units", [("sphere", "km"), ("cartesian", "in the units of the state's coordinates"),
                                           (None, "in the units of the state's coordinates), metric cartesian")])
def test_the_radius_units_follow_the_metric(tmp_path, metric, units):
    (tmp_path / "cycles").mkdir()
    loc = {"radius": 500.0} | ({"metric": metric} if metric else {})
    cfg = {"analysis": {"localization": loc}}
    rows = {r.label: r.value for r in settings_summary(cfg, collect_scores(tmp_path))}
    assert units in rows["localization"]
