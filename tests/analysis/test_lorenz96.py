"""Short Lorenz-96 runs of the Sakov & Oke (2008) configurations (the 10^4-cycle
runs live in benchmarks/l96_sakov2008.py). Expected scores are data: the
published time-mean analysis RMSE; short runs get a wider band."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from enkflow.apps import l96 as l96x
from enkflow.apps.l96 import L96Setup, run
from enkflow.analysis import LESTKF, Kernel
from enkflow.config import AnalysisConfig, Method

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


def _run_with(monkeypatch, setup: L96Setup, **changes) -> tuple:
    """``run(setup)`` with its ``[analysis]`` configuration changed by ``changes``; returns the
    result and the filter that ran (to check which code path it took)."""
    made = []
    build = l96x.build_step

    def make(*args, **kw):
        made.append(build(*args, **kw))
        return made[-1]

    cfg = l96x.analysis_config(setup).model_dump(mode="json") | changes
    with monkeypatch.context() as m:
        m.setattr(l96x, "build_step", make)
        res = run(setup, analysis=AnalysisConfig.model_validate(cfg))
    return res, made[0].filter


def _same(a, b, tol=1e-10):
    for k in ("rmse_a", "spread_a", "rmse_f"):
        assert abs(getattr(a, k) - getattr(b, k)) < tol, (k, a, b)


CYCLED = dict(members=10, inflation=1.02, cycles=200, burn_in=50)


def test_lestkf_reference_equals_letkf_compiled(monkeypatch):
    """Cycled LETKF = LESTKF, each side through its own code: LETKF with the
    compiled C kernel, LESTKF with its per-domain LAPACK formulation in the
    error subspace (``estkf_weights``, the T projection). With the compiled
    kernel on both sides the two would run the same C code and could not differ."""
    a = run(L96Setup(method=Method.LETKF, **CYCLED))
    b, f = _run_with(monkeypatch, L96Setup(method=Method.LESTKF, **CYCLED), kernel="reference")
    assert isinstance(f, LESTKF) and f.kernel is Kernel.REFERENCE and f.stats.n_domains > 0
    assert a.rmse_a < 0.5
    _same(a, b)


def test_local_with_unlimited_radius_equals_global_estkf(monkeypatch):
    """A step taper wider than the ring gives every domain every observation with
    weight 1: the compiled local kernel must then reproduce the global ESTKF
    (Python, error-subspace transform) cycle after cycle."""
    glob = {**CYCLED, "members": 20}  # 10 members diverge without localization
    a = run(L96Setup(method=Method.ESTKF, **glob))
    assert a.rmse_a < 0.5
    unlimited = {"radius": 1e9, "taper": "step", "metric": "periodic", "period": 40.0}
    b, f = _run_with(monkeypatch, L96Setup(method=Method.LETKF, **glob), localization=unlimited)
    assert f.kernel is Kernel.COMPILED and f.stats.fallbacks == 0 and f.stats.mean_local_obs == 40
    _same(a, b)


def test_estkf_equals_etkf():
    """The global filters run different transforms (``letkf_weights`` and ``estkf_weights``)."""
    c = run(L96Setup(method=Method.ETKF, members=20, inflation=1.02, cycles=200, burn_in=50))
    d = run(L96Setup(method=Method.ESTKF, members=20, inflation=1.02, cycles=200, burn_in=50))
    _same(c, d)


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
