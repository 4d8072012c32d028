"""`enkflow report DIR --html` on a small demo experiment: settings first, the scores, the maps in the state's
coordinates, timing last; every figure a real, non-blank PNG; no figure without content, and a line for each
one left out. The score figures from synthetic scores: QC and inflation only where they exist."""

from __future__ import annotations

import base64
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from enkflow.cli import main
from enkflow.report.html import _score_makers
from enkflow.report.score_types import CycleScores, ExperimentScores, KindScores, VariableScores
from enkflow.report.scores import collect_scores

MAPS = {"map-soil_moisture-mean", "map-soil_moisture-increment", "map-soil_moisture-spread"}
SCORES = {"fig-rmse", "fig-consistency", "fig-rank-hist", "fig-crps", "fig-obs-by-kind", "fig-inflation"}


def figures(page: Path) -> dict[str, bytes]:
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert "src='http" not in text and 'src="http' not in text  # self-contained
    return {fid: base64.b64decode(b) for fid, b in re.findall(r"<figure id='([^']+)'>.*?base64,([^']+)'", text)}


def check_png(png: bytes) -> None:
    import matplotlib.image as mpimg

    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    img = mpimg.imread(io.BytesIO(png), format="png")
    assert img.shape[0] > 100 and img.shape[1] > 100
    assert float(np.std(img[..., :3])) > 0.02  # not blank: lines, bars or points are drawn


def test_demo_ends_with_the_report_page_and_every_figure_is_drawn(report_demo):
    d, out, _ = report_demo
    page = Path(out["html"])
    assert out["lines"][-1] == f"report: {page}" and page.is_file() and page.parent == d / "run"
    figs = figures(page)
    assert set(figs) == SCORES | MAPS | {"map-soil_moisture-minus-truth", "timing"}
    for png in figs.values():
        check_png(png)
    text = page.read_text()
    order = [text.index(s) for s in ("id='settings'", "id='fig-rmse'", "id='map-soil_moisture-mean'", "id='timing'",
                                     "id='timing-table'")]
    assert order == sorted(order)
    assert "mean +- std over 2 cycle(s)" in text and "ensemble size N_e</td><td>4<" in text
    assert "truth_{cycle:04d}.nc</td>" in text


def test_without_a_truth_the_page_says_so(report_demo, tmp_path, capsys):
    _, _, bare = report_demo
    assert main(["report", str(bare), "--scores"]) == 0
    assert capsys.readouterr().out.split() == [str(bare / "scores.nc"), str(bare / "scores.csv")]
    r = subprocess.run([sys.executable, "-m", "enkflow", "report", str(bare), "--html", "--out", str(tmp_path / "p.html"),
                        "--map-cycle", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "p.html")
    assert "report: reading cycles: 3/3" in r.stderr  # plain progress lines off a terminal (cycle 0: the initial ensemble)
    text = (tmp_path / "p.html").read_text()
    assert set(figures(tmp_path / "p.html")) == SCORES | MAPS | {"timing"}
    assert "cycle 1" in text and "analysis minus truth maps: no truth configured" in text
    assert "truth</td><td>none configured" in text


def test_scores_against_the_truth(report_demo):
    d, out, _ = report_demo
    scores = collect_scores(d / "run")  # the truth of the demo's [verification]
    sc = scores.cycles
    assert [s.cycle for s in sc] == [1, 2] and scores.initial is not None and scores.initial.cycle == 0
    for s in [scores.initial, *sc]:  # the demo's own RMSE (from the same files) and the report's agree
        v = s.variables["soil_moisture"]
        assert v.rmse_analysis == pytest.approx(out["rmse"][s.cycle], rel=1e-12)
        assert v.spread_analysis == pytest.approx(out["spread"][s.cycle], rel=1e-12)
    for s in sc:
        v = s.variables["soil_moisture"]
        assert v.rmse_forecast > v.rmse_analysis
        (k,) = s.kinds.values()
        assert k.n_used > 0 and k.n_gross == 0
        assert k.consistency == pytest.approx(k.omb_rms / np.sqrt(k.prior_spread_ms + k.sigma_o_ms))
    # With [verification] truth the analysis recorded the same RMSE (bitwise) in its diagnostics.
    events = (d / "run" / "events.jsonl").read_text()
    assert all(f'"rmse_analysis":{s.variables["soil_moisture"].rmse_analysis!r}' in events.replace(" ", "") for s in sc)


def _synthetic(qc: bool, inflation: bool) -> ExperimentScores:
    rng = np.random.default_rng(1)

    def kind(n: int) -> KindScores:
        return KindScores(n_used=n, n_gross=2, n_buddy=1, omb_bias=0.01, omb_rms=0.1, oma_bias=0.0, oma_rms=0.05,
                          prior_spread_ms=0.004, posterior_spread_ms=0.001, sigma_o_ms=0.006,
                          consistency=0.1 / np.sqrt(0.01), crps_prior=0.06, crps_posterior=0.03,
                          rank_hist=rng.integers(0, 9, 6))

    cycles = [CycleScores(k, {"h": VariableScores(0.2 / k, 0.1 / k, 0.3, 0.15, 0.1)}, {"sst": kind(20), "sss": kind(9)},
                          1.02 if inflation else None) for k in (1, 2, 3)]
    return ExperimentScores(cycles, CycleScores(0, {"h": VariableScores(None, 0.4, None, None, 0.3)}), truth="t_{cycle}.nc",
                            members=5, qc_enabled=qc)


@pytest.mark.parametrize("qc, inflation", [(True, True), (False, False)])
def test_score_figures_only_where_there_is_something_to_show(qc, inflation):
    makers, missing = _score_makers(_synthetic(qc, inflation))
    ids = [m[0] for m in makers]
    assert ids[:5] == ["fig-rmse", "fig-consistency", "fig-rank-hist", "fig-crps", "fig-obs-by-kind"]
    assert ("fig-qc" in ids) is qc and ("fig-inflation" in ids) is inflation
    assert any(m.startswith("quality control counts: quality control is off") for m in missing) is not qc
    if qc:  # every figure drawn once
        for _, _, make in makers:
            check_png(make())


def test_a_grids_map_is_in_its_coordinates_with_names_and_units(tmp_path):
    """A (y, x) state with CF coordinate variables: a mesh over x and y, axes named with their units; the
    same variable on points named by [state] coordinates: a scatter in those."""
    import netCDF4

    from enkflow.report.figures import fig_map
    from enkflow.report.map_grid import map_grid

    path = tmp_path / "mean.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("y", 3)
        ds.createDimension("x", 4)
        for name, n, long in (("x", 4, "easting"), ("y", 3, "northing")):
            v = ds.createVariable(name, "f8", (name,))
            v.long_name, v.units = long, "km"
            v[:] = np.arange(n) * 10.0
        ds.createVariable("tracer", "f8", ("y", "x"))[:] = np.arange(12.0).reshape(3, 4)
        px, py = ds.createVariable("px", "f8", ("y", "x")), ds.createVariable("py", "f8", ("y", "x"))
        px[:], py[:] = np.meshgrid(np.arange(4.0), np.arange(3.0))
    grid = map_grid(path, "tracer", None)
    assert grid is not None and grid.gridded and grid.same_units
    assert (grid.x.label, grid.y.label) == ("easting [km]", "northing [km]")
    assert grid.x.values.tolist() == [0, 10, 20, 30] and grid.y.values.tolist() == [0, 10, 20]
    points = map_grid(path, "tracer", ["px", "py"])
    assert points is not None and not points.gridded and points.x.label == "px (no units attribute)"
    with netCDF4.Dataset(path, "a") as ds:  # a track coordinate first: "lon" in along_track is no longitude
        ds.createVariable("along_track", "f8", ("y", "x")).units = "km"
        for name, units in (("plon", "degrees_east"), ("plat", "degrees_north")):
            ds.createVariable(name, "f8", ("y", "x")).units = units
        ds["tracer"].coordinates = "along_track plon plat"
    track = map_grid(path, "tracer", None)
    assert track is not None and (track.x.label, track.y.label) == ("plon [degrees_east]", "plat [degrees_north]")
    check_png(fig_map(np.arange(12.0).reshape(3, 4), grid, "tracer", diverging=True, units="tracer [1]",
                      obs=(np.array([5.0, 25.0]), np.array([5.0, 15.0]))))
