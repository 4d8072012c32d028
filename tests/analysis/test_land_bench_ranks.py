"""``enkflow bench land --ranks P``: runs itself under mpiexec and reports the per-rank split, and
the layouts of the observations (``--layout``) side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.bench.land_layouts import PER_LAYOUT, RATIOS, compare_layouts, layout_lines, same_variables
from enkflow.config import ObsLayout


@pytest.mark.mpi
@pytest.mark.parametrize("balance", [True, False])
def test_bench_land_ranks_reports_the_balance(mpiexec, subprocess_env, tmp_path, balance):
    # Balanced: both layouts (the default), compared; not balanced: the distributed layout alone.
    cmd = [sys.executable, "-m", "enkflow", "bench", "land", "--size", "tiny", "--members", "6", "--cutoff-km", "3000",
           "--ranks", "2", "--dir", str(tmp_path / "d"), "--json"] + ([] if balance else ["--no-balance", "--layout",
                                                                                             "distributed"])
    proc = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    res = json.loads(lines[-1])
    assert res["ranks"] == 2 and res["balance"] is balance
    for k in ("analysis_s", "imbalance", "imbalance_est", "imbalance_cpu"):
        assert res[k] > 0, k
    assert len(res["rank_analysis_s"]) == 2 and sum(res["rank_rows"]) == res["n_state"] == 877
    assert any(line.strip().startswith("rank 1:") for line in lines)
    if balance:
        assert res["imbalance_est"] < 1.05
    assert res["observations"] == "distributed" and res["obs_fraction"] == 0.1 and res["n_obs"] == 88
    assert len(res["rank_peak_rss_mb"]) == 2 and res["peak_rss_mb"] == max(res["rank_peak_rss_mb"]) > 0
    replicated = {f"{k}_replicated" for k in PER_LAYOUT}
    assert set(PER_LAYOUT) | replicated | set(RATIOS) | {"identical", "layouts"} <= res.keys()
    if balance:
        assert res["layouts"] == ["replicated", "distributed"] and res["identical"] is True
        assert len(res["rank_peak_rss_mb_replicated"]) == 2 and res["analysis_s_replicated"] > 0
        assert res["analysis_s_ratio"] == res["analysis_s"] / res["analysis_s_replicated"]
        assert any(line.strip().startswith("rank 1, replicated:") for line in lines)
        assert not list((tmp_path / "d").glob("*-*"))  # the copies are gone; the last one's analysis is kept
        analysed = tmp_path / "d" / "analysed"
        assert {"member_0001.nc", "analysis_mean.nc", "analysis_spread.nc"} <= {f.name for f in analysed.iterdir()}
        # The directory kept its forecast: a second run there analyses the same problem.
        again = subprocess.run(cmd[:-1] + ["--layout", "distributed", "--json"], env=subprocess_env,
                               capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        res2 = json.loads(again.stdout.strip().splitlines()[-1])
        assert (res2["rmse_prior"], res2["rmse_analysis"]) == (res["rmse_prior"], res["rmse_analysis"])
    else:
        assert res["layouts"] == ["distributed"]
        assert all(res[k] is None for k in replicated | set(RATIOS) | {"identical"})


def _nc(path: Path, values: np.ndarray) -> Path:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("x", values.size)
        ds.createVariable("v", values.dtype, ("x",))[:] = values
    return path


def test_same_variables_sees_the_last_bit(tmp_path):
    a = np.linspace(0.0, 1.0, 7)
    b = a.copy()
    b[3] = np.nextafter(b[3], 2.0)
    assert same_variables(_nc(tmp_path / "a.nc", a), _nc(tmp_path / "a2.nc", a.copy()))
    assert not same_variables(tmp_path / "a.nc", _nc(tmp_path / "b.nc", b))
    assert not same_variables(tmp_path / "a.nc", _nc(tmp_path / "c.nc", a.astype(np.float32)))


def _report(layout: str, obs_bytes: list[float], hx_bytes: list[float], analysis_s: float) -> dict:
    return {"observations": layout, "ranks": 2, "n_obs": 10.0, "obs_fraction": 0.5, "analysis_s": analysis_s,
            "total_s": 2 * analysis_s, "peak_rss_mb": 30.0, "rank_peak_rss_mb": [30.0, 20.0],
            "rank_obs_held": [6.0, 10.0], "rank_obs_owned": [4.0, 6.0], "rank_obs_bytes": obs_bytes,
            "rank_hx_bytes": hx_bytes}


def test_compare_layouts_reports_both_and_their_ratios():
    """The figures each analysis reports per rank: largest rank, NAME_replicated, ratios, text lines."""
    res = compare_layouts({ObsLayout.REPLICATED: _report("replicated", [800.0, 800.0], [400.0, 400.0], 4.0),
                           ObsLayout.DISTRIBUTED: _report("distributed", [100.0, 200.0], [40.0, 50.0], 2.0)}, True)
    assert (res["obs_bytes_max"], res["obs_bytes_max_replicated"], res["obs_bytes_ratio"]) == (200.0, 800.0, 0.25)
    assert (res["hx_bytes_max"], res["hx_bytes_max_replicated"], res["hx_bytes_ratio"]) == (50.0, 400.0, 0.125)
    assert res["analysis_s_ratio"] == 0.5 and res["rank_obs_bytes_replicated"] == [800.0, 800.0]
    assert res["layouts"] == ["replicated", "distributed"] and res["identical"] is True
    text = layout_lines(res)
    assert "rank 1, replicated: held 10, owned 6" in text and "obs space 0.250" in text
    alone = compare_layouts({ObsLayout.DISTRIBUTED: _report("distributed", [1.0, 2.0], [3.0, 4.0], 1.0)}, None)
    assert alone["obs_bytes_max"] == 2.0 and alone["obs_bytes_max_replicated"] is None
    assert alone["obs_bytes_ratio"] is None and "replicated" not in layout_lines(alone)
