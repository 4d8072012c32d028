"""Adaptive inflation (Miyoshi 2011, El Gharamti 2018, Anderson 2009) against the best fixed inflation on Lorenz-96, LETKF.

Set-up of Sakov & Oke (2008) (all 40 variables observed every 0.05 with R = I, GC half-width
7.28, domains of 2 points); every run has the same truth, observations and initial ensemble
(one seed), and is scored by the time-mean analysis RMSE after the same burn-in. For N = 10 and
20: the tuning an adaptive scheme replaces, a sweep of fixed inflation factors on the anomalies
(posterior, DAPPER's convention, and prior, the kind the adaptive scheme estimates), then the
adaptive inflation with nothing tuned:

- ``miyoshi2011 default``: the configuration's defaults (initial factor 1, bounds [1, 10], sigma_b =
  0.04, Miyoshi's, as the lower bound of the estimate's standard deviation, 0.6 at the first cycle,
  DART's ``inf_sd_initial``); ``sd_initial 0.3`` and ``1.0``: how much the result depends on that
  first deviation; ``fixed sigma_b 0.04``: Miyoshi's fixed prior variance from the first cycle;
- ``gharamti2018 default``, ``anderson2009 default``: DART's recommended values (deviation 0.6
  fixed, damping 0.9, bounds [1, 50]), prior inflation; beside them without damping, as posterior
  inflation, and El Gharamti's with deflation allowed (the lower bound 0 DART's guide suggests for
  it), to show what the damping, the target and the bound do.

Prints a Markdown table with the ratio to the best fixed inflation of either kind, then the rows
as JSON; exits non-zero if a scheme's default run is more than 5% above it at any N.

    .venv/bin/python benchmarks/l96_adaptive_inflation.py [--cycles 10000] [--seed 0] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from enkflow.config import Method

FACTORS = [1.0, 1.005, 1.01, 1.015, 1.02, 1.025, 1.03, 1.04]  # on the anomalies
ADAPTIVE = {
    "miyoshi2011 default": {"adaptive": "miyoshi2011"},
    "miyoshi2011 sd_initial 0.3": {"adaptive": "miyoshi2011", "adaptive_sd_initial": 0.3},
    "miyoshi2011 sd_initial 1.0": {"adaptive": "miyoshi2011", "adaptive_sd_initial": 1.0},
    "miyoshi2011 fixed sigma_b 0.04 (Miyoshi)": {"adaptive": "miyoshi2011", "adaptive_sd_initial": 0.04},
    "gharamti2018 default": {"adaptive": "gharamti2018"},
    "gharamti2018 damping 1": {"adaptive": "gharamti2018", "adaptive_damping": 1.0},
    "gharamti2018 posterior": {"adaptive": "gharamti2018", "adaptive_target": "posterior"},
    "gharamti2018 minimum 0": {"adaptive": "gharamti2018", "adaptive_minimum": 0.0},
    "anderson2009 default": {"adaptive": "anderson2009"},
    "anderson2009 damping 1": {"adaptive": "anderson2009", "adaptive_damping": 1.0},
    "anderson2009 posterior": {"adaptive": "anderson2009", "adaptive_target": "posterior"},
}


def _one(job: tuple) -> dict:
    from enkflow.config import AnalysisConfig
    from enkflow.apps import l96 as E

    members, kind, value, cycles, burn_in, seed = job
    s = E.L96Setup(method=Method.LETKF, members=members, cycles=cycles, burn_in=burn_in, seed=seed,
                   inflation=value if kind == "posterior" else 1.0)
    cfg = E.analysis_config(s).model_dump(mode="json")
    if kind == "prior":
        cfg["inflation"]["prior"] = value
    elif kind == "adaptive":
        cfg["inflation"].update(ADAPTIVE[value])
    t0 = time.perf_counter()
    r = E.run(s, analysis=AnalysisConfig.model_validate(cfg))
    return {"members": members, "kind": kind, "value": value, "rmse_a": r.rmse_a, "spread_a": r.spread_a,
            "inflation_mean": r.inflation_mean if kind == "adaptive" else None, "seconds": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=10_000, help="scored cycles after the burn-in")
    ap.add_argument("--burn-in", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--members", type=int, nargs="+", default=[10, 20])
    ap.add_argument("--adaptive", nargs="+", choices=list(ADAPTIVE), default=list(ADAPTIVE), metavar="LABEL",
                    help="the adaptive runs (default: all)")
    args = ap.parse_args()
    common = (args.cycles, args.burn_in, args.seed)
    jobs = [(n, "posterior", f, *common) for n in args.members for f in FACTORS]
    jobs += [(n, "prior", f, *common) for n in args.members for f in FACTORS if f != 1.0]
    jobs += [(n, "adaptive", a, *common) for n in args.members for a in args.adaptive]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as ex:
        res = list(ex.map(_one, jobs))
    wall = time.perf_counter() - t0
    ok = True
    print(f"LETKF on Lorenz-96, {args.cycles} cycles scored after a {args.burn_in}-cycle burn-in, seed {args.seed}; "
          f"{len(jobs)} runs in {wall:.0f} s on {args.jobs} processes")
    print("| N | inflation | rmse_a | spread_a | mean covariance factor | / best fixed |")
    print("|---|---|---|---|---|---|")
    for n in args.members:
        fixed = [r for r in res if r["members"] == n and r["kind"] != "adaptive"]
        best = min(fixed, key=lambda r: r["rmse_a"])
        for r in fixed:
            tag = " (best)" if r is best else ""
            print(f"| {n} | fixed {r['kind']} {r['value']:.3f}{tag} | {r['rmse_a']:.4f} | {r['spread_a']:.4f} "
                  f"| {r['value'] ** 2:.4f} | {r['rmse_a'] / best['rmse_a']:.3f} |")
        for r in res:
            if r["members"] == n and r["kind"] == "adaptive":
                ratio = r["rmse_a"] / best["rmse_a"]
                if r["value"].endswith(" default"):
                    ok &= ratio <= 1.05
                print(f"| {n} | adaptive {r['value']} | {r['rmse_a']:.4f} | {r['spread_a']:.4f} "
                      f"| {r['inflation_mean']:.4f} | {ratio:.3f} |")
    print(json.dumps(res))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
