"""The observation-space diagnostics file and the adaptive inflation field, offline (files carried
between analysis tasks) and online (the server's memory): the same values, bit for bit; and the
same diagnostics of the analysis, the balance of its ranks included."""

import netCDF4
import numpy as np

from enkflow.apps.l96 import L96Setup, run
from enkflow.apps.l96_online import run_online
from enkflow.config import Method
from enkflow.apps.demo import DemoSettings, run_demo
from enkflow.jobs.events import iter_events
from enkflow.report import load_report

BALANCE = ("imbalance_est", "imbalance_cpu", "imbalance_wall", "balance_s", "redistribute_s", "wait_s", "balanced",
           "rank_analysis_s", "rank_cpu_s", "rank_est_work", "rank_rows", "rank_search_s", "rank_kernel_s")


def _vars(path):
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        return {k: np.asarray(v[:]) for k, v in ds.variables.items()}


def test_obs_diag_and_adaptive_inflation_online_equal_offline(tmp_path):
    for mode in ("offline", "online"):
        run_demo(tmp_path / mode, DemoSettings(members=5, cycles=3, mode=mode, runners=2, adaptive="miyoshi2011",
                                               inflation=1.0), say=lambda _m: None)
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
    assert fields[0].max() > 1.0 and not np.array_equal(fields[0], fields[2])  # estimated and carried
    # One server rank reports the analysis balance as one offline analysis rank does (it reported none
    # while the server assembled its own analysis).
    offline = [c.analysis for c in load_report(tmp_path / "offline" / "run").cycles]
    online = [e for e in iter_events(tmp_path / "online" / "run" / "events.jsonl") if e["event"] == "online_cycle_end"]
    assert len(offline) == len(online) == 3
    for a, b in zip(offline, online):
        for d in (a, b):
            assert all(k in d for k in BALANCE), sorted(set(BALANCE) - set(d))
            assert d["balanced"] == 0.0 and len(d["rank_rows"]) == 1  # one rank: the rows stay where they are
        assert (a["rank_rows"], a["imbalance_est"]) == (b["rank_rows"], b["imbalance_est"])


def test_lorenz96_adaptive_inflation_through_the_server_scores_as_in_process():
    s = L96Setup(method=Method.LETKF, members=6, cycles=25, burn_in=5, adaptive="miyoshi2011")
    a, b = run(s), run_online(s, runners=2)
    assert (a.rmse_a, a.spread_a, a.rmse_f) == (b.rmse_a, b.spread_a, b.rmse_f)
