"""`enkflow bench analysis`: the JSON line with both ratios, and the baseline it compares with."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
from scipy.spatial import cKDTree
import pytest

from enkflow.analysis import LETKF, Geometry, LocalDomains, Localization
from enkflow.analysis.local_filters import Kernel
from enkflow.bench.baseline import STAGES, baseline_letkf
from enkflow.config import Metric, RadiusConvention

TIMES = ("ms_per_point", "core_ms_per_point", "kernel_ms_per_point", "baseline_ms_per_point",
         "baseline_kernel_ms_per_point", "speedup_vs_baseline", "kernel_speedup_vs_baseline")


def _check_figures(res: dict) -> None:
    """Existence and consistency of the figures (never their values: the machines are shared)."""
    for key in TIMES:
        assert isinstance(res[key], float) and math.isfinite(res[key]) and res[key] > 0, key
    bs, sp = res["baseline_split_ms_per_point"], res["split_ms_per_point"]
    assert set(bs) == set(STAGES) and set(sp) == set(STAGES)
    assert res["baseline_ms_per_point"] == pytest.approx(sum(bs.values()))
    assert res["baseline_kernel_ms_per_point"] == pytest.approx(bs["build"] + bs["eigen"] + bs["transform"])
    assert res["kernel_ms_per_point"] == pytest.approx(sp["build"] + sp["eigen"] + sp["transform"])
    assert res["core_ms_per_point"] == pytest.approx(res["ms_per_point"] * res["ranks"])
    # The kernel runs inside the analysis: its time is part of the analysis' core time.
    assert res["kernel_ms_per_point"] <= res["core_ms_per_point"]
    # Whole analysis: both sides' search included; kernel only: neither side's.
    assert res["speedup_vs_baseline"] == pytest.approx(res["baseline_ms_per_point"] / res["core_ms_per_point"])
    assert res["kernel_speedup_vs_baseline"] == pytest.approx(
        res["baseline_kernel_ms_per_point"] / res["kernel_ms_per_point"])
    assert res["max_rel_diff_vs_baseline"] < 1e-10
    assert res["rmse_analysis"] < res["rmse_prior"]


@pytest.mark.mpi
def test_bench_analysis_small(subprocess_env):
    out = subprocess.run(
        [sys.executable, "-m", "enkflow", "bench", "analysis", "--nx", "60", "--ny", "50", "--members", "12",
         "--baseline-points", "200", "--ranks", "1,2", "--json"],
        capture_output=True, text=True, env=subprocess_env, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("peak_rss_mb", "speedup_by_ranks", "by_ranks"):
        assert key in res
    _check_figures(res)
    _check_figures(res["by_ranks"]["2"])
    assert res["by_ranks"]["2"]["rmse_analysis"] == pytest.approx(res["rmse_analysis"], rel=1e-12)
    # The text shows both ratios, each beside its baseline.
    text = out.stdout
    assert text.count("whole analysis") == 2 and text.count("kernel only") == 2
    assert "baseline per-point LAPACK" in text and "batched search" in text


def test_baseline_is_the_reference_analysis_with_one_batched_search(problem, monkeypatch):
    """The baseline equals the library's reference kernel (per-domain LAPACK), and finds the
    local observations of all its points in one search, not one KD-tree query per point."""
    X, HX, obs, coords, _ = problem
    loc = Localization.from_radius(6.0, RadiusConvention.CUTOFF, metric=Metric.CARTESIAN)
    geo = Geometry(Metric.CARTESIAN, obs.coords)
    points = np.arange(3, X.shape[0], 7)
    ref = LETKF(localization=loc, kernel=Kernel.REFERENCE).analyze(
        X, HX, obs, domains=LocalDomains.per_row(coords), geometry=geo)

    calls = []

    class CountingTree(cKDTree):
        def sparse_distance_matrix(self, other, max_distance, *a, **kw):
            calls.append((self.n, other.n))
            return super().sparse_distance_matrix(other, max_distance, *a, **kw)

    monkeypatch.setattr("enkflow.bench.baseline.cKDTree", CountingTree)
    out, t = baseline_letkf(X, HX, obs, loc, coords, points, rho=1.0)
    assert calls == [(points.size, obs.n_obs)]  # one batched SciPy search, nothing of enkflow's
    assert set(t) == set(STAGES) and all(v >= 0 for v in t.values())
    np.testing.assert_allclose(out, ref[points], rtol=0, atol=1e-12 * np.abs(ref).max())
