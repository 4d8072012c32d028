"""Short Lorenz-96 runs of the Sakov & Oke (2008) configurations (the 10^4-cycle
runs live in benchmarks/l96_sakov2008.py). Expected scores are data: the
published time-mean analysis RMSE; short runs get a wider band."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from enkflow.config import Method
from enkflow.models.l96_experiment import L96Setup, run

# method, N, posterior inflation -> published rmse_a
SAKOV2008 = [
    (Method.ETKF, 24, 1.013, 0.18),
    (Method.DENKF, 40, 1.01, 0.18),
    (Method.ENKF, 40, 1.06, 0.22),
    (Method.LETKF, 10, 1.02, 0.20),
]


@pytest.mark.parametrize("method,N,infl,expected", SAKOV2008, ids=[m.value for m, *_ in SAKOV2008])
def test_short_run_scores(method, N, infl, expected):
    res = run(L96Setup(method=method, members=N, inflation=infl, cycles=1500, seed=1))
    assert abs(res.rmse_a - expected) < 0.03, res
    assert 0.7 < res.spread_a / res.rmse_a < 1.5


def test_lestkf_equals_letkf_and_estkf_equals_etkf():
    a = run(L96Setup(method=Method.LETKF, members=10, inflation=1.02, cycles=200, burn_in=50))
    b = run(L96Setup(method=Method.LESTKF, members=10, inflation=1.02, cycles=200, burn_in=50))
    assert abs(a.rmse_a - b.rmse_a) < 1e-8
    c = run(L96Setup(method=Method.ETKF, members=20, inflation=1.02, cycles=200, burn_in=50))
    d = run(L96Setup(method=Method.ESTKF, members=20, inflation=1.02, cycles=200, burn_in=50))
    assert abs(c.rmse_a - d.rmse_a) < 1e-8


def test_cli_json(subprocess_env):
    out = subprocess.run(
        [sys.executable, "-m", "enkflow", "l96", "--method", "letkf", "--members", "10", "--inflation", "1.02",
         "--cycles", "100", "--burn-in", "20", "--json"],
        capture_output=True, text=True, env=subprocess_env, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"rmse_a", "spread_a", "seconds_per_cycle"} <= res.keys() and res["rmse_a"] < 1.0
    bad = subprocess.run([sys.executable, "-m", "enkflow", "l96", "--members", "1"], capture_output=True, text=True,
                         env=subprocess_env, timeout=60)
    assert bad.returncode == 2 and "--members must be >= 2" in bad.stderr
