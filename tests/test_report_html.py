"""`enkflow report DIR --html` on a small demo experiment: every figure is there and is a real,
non-blank PNG; the demo names the page; the directory the demo names is enough."""

from __future__ import annotations

import base64
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from enkflow.apps.demo import DemoSettings, run_demo
from enkflow.report.scores import collect_scores

FIGURES = {"timing", "scores", "obs-by-kind", "qc", "map-soil_moisture-mean", "map-soil_moisture-increment",
           "map-soil_moisture-spread"}


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


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("report") / "demo"
    lines: list[str] = []
    out = run_demo(d, DemoSettings(members=4, cycles=2), say=lines.append)
    return d, out, lines


def test_demo_ends_with_the_report_page_and_every_figure_is_drawn(demo):
    d, out, lines = demo
    page = Path(out["html"])
    assert lines[-1] == f"report: {page}" and page.is_file() and page.parent == d / "run"
    figs = figures(page)
    assert set(figs) == FIGURES
    for fid, png in figs.items():
        check_png(png)
    text = page.read_text()
    assert "timing table" in text and "mean +- std over 2 cycle(s)" in text


def test_cli_finds_the_run_directory_from_the_demo_directory(demo, tmp_path):
    d, _, _ = demo
    out = tmp_path / "page.html"
    r = subprocess.run([sys.executable, "-m", "enkflow", "report", str(d), "--html", "--out", str(out),
                        "--truth", str(d / "truth" / "truth_{cycle:04d}.nc")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    assert "report: reading cycles: 3/3" in r.stderr  # plain progress lines off a terminal (cycle 0: the initial ensemble)
    assert set(figures(out)) == FIGURES


def test_scores_against_the_truth(demo):
    d, out, _ = demo
    scores = collect_scores(d / "run")  # the truth of the demo's [verification]
    sc = scores.cycles
    assert [s.cycle for s in sc] == [1, 2] and scores.initial is not None and scores.initial.cycle == 0
    for s in [scores.initial, *sc]:  # the demo's own RMSE (from the same files) and the report's agree
        v = s.variables["soil_moisture"]
        assert v.rmse_analysis == pytest.approx(out["rmse"][s.cycle], rel=1e-12)
        assert v.spread_analysis == pytest.approx(out["spread"][s.cycle], rel=1e-12)
        assert all(k.n_used > 0 and k.n_gross == 0 for k in s.kinds.values())
    # With [verification] truth the analysis recorded the same RMSE (bitwise) in its diagnostics.
    events = (d / "run" / "events.jsonl").read_text()
    assert all(f'"rmse_analysis":{s.variables["soil_moisture"].rmse_analysis!r}' in events.replace(" ", "") for s in sc)
