"""benchmarks/l96_methods.py's configuration mapping (DAPPER -> enkflow l96) and its DAPPER driver's
request, without DAPPER: names, the radius conversion, what is passed to each side and the scored
window. The comparison itself is the benchmark's (10^4 cycles, DAPPER installed in its own venv)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from enkflow.apps.l96 import L96Setup
from enkflow.config import Method

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module
    spec.loader.exec_module(module)
    return module


bench = _load("l96_methods")
driver = _load("l96_methods_dapper")


def _config(method: str, n: int):
    return next(d for d in bench.CONFIGS if d.method == method and d.N == n)


def test_names_and_radius():
    assert bench.enkflow_setup(_config("SL_EAKF", 7)) == {
        "method": "ensrf", "members": 7, "inflation": 1.07, "radius": 10.92, "domain_size": 2}
    # enkflow l96's default radius 7.28 is DAPPER's loc_rad 4, as in benchmarks/l96_sakov2008.py
    letkf = bench.enkflow_setup(_config("LETKF", 10))
    assert letkf["radius"] == L96Setup(method=Method.LETKF, members=10).radius == 4 * 1.82
    assert bench.enkflow_setup(_config("EnKF", 24)) == {"method": "etkf", "members": 24, "inflation": 1.013}
    assert bench.enkflow_setup(_config("EnKF_N", 24)) == {
        "method": "enkf-n", "members": 24, "inflation": 1.0, "xn": 2.0, "rotate": True}
    # a rotation for a method without one in enkflow is not passed on
    assert "rotate" not in bench.enkflow_setup(bench.DapperConfig("SL_EAKF", N=7, rot=True, loc_rad=6))
    assert bench.enkflow_setup(_config("LNETF", 40)) == {
        "method": "lnetf", "members": 40, "inflation": 1.10, "radius": 9.1, "domain_size": 2, "rs": 1.9, "rotate": True}
    assert set(bench.ENKFLOW_METHOD.values()) <= {"letkf", "etkf", "ensrf", "enkf-n", "lnetf"}
    # every method at two ensemble sizes at least
    for method in bench.ENKFLOW_METHOD:
        assert len({d.N for d in bench.CONFIGS if d.key == method}) >= (1 if method in ("LETKF", "EnKF Sqrt") else 2)


def test_dapper_calls_and_flags():
    assert _config("SL_EAKF", 7).call() == "SL_EAKF(N=7, infl=1.07, loc_rad=6)"
    assert _config("EnKF", 24).call() == "EnKF('Sqrt', N=24, infl=1.013)"
    assert _config("EnKF_N", 24).call() == "EnKF_N(N=24, rot=True, xN=2.0)"
    flags = bench.cli_flags(bench.enkflow_setup(_config("LNETF", 80)))
    assert flags == "--method lnetf --members 80 --inflation 1.06 --radius 9.1 --domain-size 2 --rs 1.4 --rotate"


def test_driver_request_scores_the_cycles_after_the_burn_in():
    d = _config("EnKF", 24)
    req = driver.parse_request(json.dumps(d.request(burn_in=400, cycles=10_000, seed=3)))
    assert (req.method, req.args, req.kwargs, req.seed) == ("EnKF", ("Sqrt",), {"N": 24, "infl": 1.013}, 3)
    # DAPPER: observation ko at time (ko + 1) * dt, scored when after BurnIn
    times = [(ko + 1) * driver.DT for ko in range(req.last_obs + 1)]
    scored = [ko for ko, t in enumerate(times) if t > req.burn_in_time]
    assert len(times) == 10_400 and scored[0] == 400 and len(scored) == 10_000
    with pytest.raises(ValueError, match="cycles must be an integer >= 1"):
        driver.parse_request(json.dumps(d.request(burn_in=400, cycles=0, seed=3)))
    with pytest.raises(ValueError, match="expected the keys"):
        driver.parse_request(json.dumps({"method": "EnKF"}))


def test_enkflow_side_runs_or_says_why_not():
    letkf = bench.run_enkflow(bench.enkflow_setup(_config("LETKF", 10)), burn_in=2, cycles=3, seed=0)
    assert isinstance(letkf, bench.Score) and 0 < letkf.rmse_a < 5
    missing = bench.run_enkflow({"method": "no-such-method", "members": 4}, burn_in=2, cycles=3, seed=0)
    assert missing.startswith(bench.NOT_HERE)
    for d in bench.CONFIGS:  # the methods this enkflow has build their L96Setup
        setup = bench.enkflow_setup(d)
        if setup["method"] in {m.value for m in Method} and set(setup) <= set(L96Setup.__dataclass_fields__):
            L96Setup(**(setup | {"method": Method(setup["method"])}))


def test_only_selects_by_either_name():
    assert {d.key for d in bench.select(["ensrf"])} == {"SL_EAKF"}
    assert {d.key for d in bench.select(["EnKF_N", "letkf"])} == {"EnKF_N", "LETKF"}
    with pytest.raises(SystemExit, match="no configuration"):
        bench.select(["nope"])
