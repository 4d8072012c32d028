"""Offline and online agree: the demo both ways gives bitwise-identical analyses, diagnostics, adaptive
inflation fields and the same table of scores; Lorenz-96 through the server gives the scores of
`enkflow l96`; a model keeping state between exposes is caught by the statelessness check."""

import re
import threading

import netCDF4
import numpy as np
import pytest

from enkflow.apps.l96 import L96Setup, NatureRun, Scores, make_step, run
from enkflow.apps.l96_online import run_online
from enkflow.config import AdaptiveInflation, Method
from enkflow.errors import MemberError
from enkflow.apps.demo import DemoSettings, run_demo
from enkflow.jobs.events import iter_events
from enkflow.report import load_report
from enkflow.models import lorenz96 as l96
from enkflow.online import Field, Problem, Runner, Server, ServerConfig


def _var(path, name="soil_moisture"):
    with netCDF4.Dataset(path) as ds:
        return np.asarray(ds[name][:])


def test_demo_online_is_bitwise_the_offline_demo(tmp_path):
    """`enkflow demo` both ways, with Miyoshi's adaptive inflation: the demo's progress (online too), report and falling
    RMSE; the members, every cycle's analysis mean and spread, observation-space diagnostics and inflation
    field bit for bit; the same analysis balance report from one server rank as from one analysis rank."""
    out = {}
    for mode in ("offline", "online"):
        lines: list[str] = []
        s = DemoSettings(members=6, cycles=3, mode=mode, runners=2, adaptive="miyoshi2011", inflation=1.0)
        out[mode] = run_demo(tmp_path / mode, s, say=lines.append)
        out[mode]["lines"] = lines
    text = "\n".join(out["offline"]["lines"])
    assert "mean +- std over 3 cycle(s)" in text and "analysis RMSE" in text
    assert [c.cycle for c in out["offline"]["report"].cycles] == [1, 2, 3]
    assert sorted(out["offline"]["rmse"]) == [0, 1, 2, 3] and out["offline"]["rmse"][3] < out["offline"]["rmse"][0]
    assert out["offline"]["rmse"] == out["online"]["rmse"]
    assert out["offline"]["spread"] == out["online"]["spread"]
    for m in range(1, 7):
        f = f"members/member_{m:04d}.nc"
        assert np.array_equal(_var(tmp_path / "offline" / f), _var(tmp_path / "online" / f)), m
    for k in (1, 2, 3):
        for stat in ("mean", "spread"):
            f = f"run/cycles/{k:04d}/analysis_{stat}.nc"
            assert np.array_equal(_var(tmp_path / "offline" / f), _var(tmp_path / "online" / f)), f
    rmse_lines = [line for line in out["online"]["lines"] if line.strip().startswith("cycle ") and "RMSE" in line]
    assert rmse_lines == [line for line in out["offline"]["lines"] if line.strip().startswith("cycle ") and "RMSE" in line]
    assert len(rmse_lines) == 5  # the initial line, then cycles 0-3
    online = "\n".join(out["online"]["lines"])  # its progress, as offline's: members done, then the analysis
    for k in (1, 2, 3):
        assert re.search(rf"cycle {k}: 6/6 members done, [12] runners? alive \(", online), online
        assert re.search(rf"cycle {k}: analysis done \(\d+\.\d\d s\), omb \S+ -> oma \S+", online), online
    _diagnostics_and_inflation_equal(tmp_path)
    _the_same_balance_report(tmp_path)


def _vars(path):
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        return {k: np.asarray(v[:]) for k, v in ds.variables.items()}


def _diagnostics_and_inflation_equal(tmp_path):
    """obs_diag.nc and inflation.nc of every cycle, offline (files carried between analysis tasks) and online
    (the server's memory): the same values, bit for bit; the field estimated and carried."""
    fields = []
    for k in (1, 2, 3):
        for name in ("obs_diag.nc", "inflation.nc"):
            a, b = (_vars(tmp_path / m / "run" / "cycles" / f"{k:04d}" / name) for m in ("offline", "online"))
            assert a.keys() == b.keys()
            for v in a:
                assert np.array_equal(a[v], b[v]), (k, name, v)
        fields.append(_vars(tmp_path / "offline" / "run" / "cycles" / f"{k:04d}" / "inflation.nc")["inflation"])
        d = _vars(tmp_path / "offline" / "run" / "cycles" / f"{k:04d}" / "obs_diag.nc")
        # prior_spread is the uninflated ensemble's: the analysis narrows the inflated prior
        infl = fields[-1].max()
        assert np.all(d["posterior_spread"] < np.sqrt(infl) * d["prior_spread"])
        assert d["posterior_spread"].mean() < d["prior_spread"].mean()
    assert fields[0].max() > 1.0 and not np.array_equal(fields[0], fields[2])


BALANCE = ("imbalance_est", "imbalance_cpu", "imbalance_wall", "balance_s", "redistribute_s", "wait_s", "balanced",
           "rank_analysis_s", "rank_cpu_s", "rank_est_work", "rank_rows", "rank_search_s", "rank_kernel_s")


def _the_same_balance_report(tmp_path):
    """One server rank reports the analysis balance as one offline analysis rank does (it reported none
    while the server assembled its own analysis)."""
    offline = [c.analysis for c in load_report(tmp_path / "offline" / "run").cycles]
    online = [e for e in iter_events(tmp_path / "online" / "run" / "events.jsonl") if e["event"] == "online_cycle_end"]
    assert len(offline) == len(online) == 3
    for a, b in zip(offline, online):
        for d in (a, b):
            assert all(k in d for k in BALANCE), sorted(set(BALANCE) - set(d))
            assert d["balanced"] == 0.0 and len(d["rank_rows"]) == 1  # one rank: the rows stay where they are
        assert (a["rank_rows"], a["imbalance_est"]) == (b["rank_rows"], b["imbalance_est"])


@pytest.mark.parametrize("method, options", [(Method.ETKF, {}), (Method.LETKF, {}),
                                             (Method.ENKF_N, {"xn": 2.0, "rotate": True}),
                                             (Method.LNETF, {"rs": 2.0, "rotate": True}), (Method.ENSRF, {})],
                         ids=["etkf", "letkf", "enkf-n", "lnetf", "ensrf"])
def test_lorenz96_through_the_server_scores_as_in_process(method, options):
    s = L96Setup(method=method, members=6, inflation=1.05, cycles=25, burn_in=5, **options)
    a, b = run(s), run_online(s, runners=2)
    assert (a.rmse_a, a.spread_a, a.rmse_f) == (b.rmse_a, b.spread_a, b.rmse_f)


@pytest.mark.parametrize("method, adaptive", [(Method.LETKF, AdaptiveInflation.MIYOSHI2011),
                                              (Method.ENSRF, AdaptiveInflation.GHARAMTI2018)],
                         ids=["letkf-miyoshi2011", "ensrf-gharamti2018"])
def test_lorenz96_through_the_server_reports_the_adaptive_inflation_as_in_process(method, adaptive):
    """Online, the adaptive field's mean is the estimate (it was reported as 1.0 when online had its own scores);
    the serial filter's field, updated observation by observation, is carried by the server as a local filter's."""
    s = L96Setup(method=method, members=6, cycles=25, burn_in=5, adaptive=adaptive)
    a, b = run(s), run_online(s, runners=2)
    assert (a.rmse_a, a.spread_a, a.rmse_f, a.inflation_mean) == (b.rmse_a, b.spread_a, b.rmse_f, b.inflation_mean)
    assert b.inflation_mean != 1.0


def test_a_model_with_hidden_state_fails_the_statelessness_check():
    s = L96Setup(method=Method.ETKF, members=4, cycles=2, burn_in=0)
    rng = np.random.default_rng(0)
    nature = NatureRun(l96.spin_up(rng), rng, 1.0)
    E0 = nature.truth[:, None] + rng.standard_normal((40, 4))

    def initial(store):
        store.parts[0][...] = E0

    class Nature(NatureRun):
        def observations(self, cycle):
            self.y = self.truth
            return super().observations(cycle)

    nat = Nature(nature.truth, rng, 1.0)
    problem = Problem((Field("x", "float64", (40,)),), 4, initial, lambda c: 1, nat,
                      make_step(s, nat.coords, lambda c: None, Scores(s.burn_in)))
    server = Server(problem, ServerConfig(token="t", stateless_check=True, heartbeat_timeout_s=30))
    errors = []

    def stateful_runner(seed):
        calls = 0
        try:
            with Runner(server.address, "t", reconnect_s=2) as r:
                r.init([Field("x", "float64", (40,))])
                x = np.zeros(40)
                x, n = r.expose(x)
                while n:
                    calls += 1
                    x[...] = l96.step(x) + 1e-9 * (calls + seed)  # state of its own: a seed, a count of members run
                    x, n = r.expose(x)
        except Exception as exc:  # the server goes away once it stops the study
            errors.append(exc)

    threads = [threading.Thread(target=stateful_runner, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    with pytest.raises(MemberError, match="not stateless.*member 1|member 1.*not stateless"):
        server.run([1, 2])
    for t in threads:
        t.join(timeout=30)
