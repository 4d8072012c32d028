"""`enkflow bench analysis` on a small grid: the JSON line and its exactness check."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.mpi
def test_bench_analysis_small(subprocess_env):
    out = subprocess.run(
        [sys.executable, "-m", "enkflow", "bench", "analysis", "--nx", "60", "--ny", "50", "--members", "12",
         "--baseline-points", "200", "--ranks", "1,2", "--json"],
        capture_output=True, text=True, env=subprocess_env, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("ms_per_point", "baseline_ms_per_point", "peak_rss_mb", "split_ms_per_point", "speedup_by_ranks"):
        assert key in res
    assert res["max_rel_diff_vs_baseline"] < 1e-10
    assert res["rmse_analysis"] < res["rmse_prior"]
    assert res["by_ranks"]["2"]["rmse_analysis"] == pytest.approx(res["rmse_analysis"], rel=1e-12)
