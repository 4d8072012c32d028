"""``enkflow bench land --ranks P``: runs itself under mpiexec and reports the per-rank split."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.mpi
@pytest.mark.parametrize("balance", [True, False])
def test_bench_land_ranks_reports_the_balance(mpiexec, subprocess_env, tmp_path, balance):
    cmd = [sys.executable, "-m", "enkflow", "bench", "land", "--size", "tiny", "--members", "6", "--cutoff-km", "3000",
           "--ranks", "2", "--dir", str(tmp_path / "d"), "--json"] + ([] if balance else ["--no-balance"])
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
