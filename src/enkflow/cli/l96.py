"""`enkflow l96`: Lorenz-96 twin experiments (Sakov & Oke 2008 set-up)."""

from __future__ import annotations

import argparse
import json

from enkflow.apps.l96 import L96Setup, run
from enkflow.apps.l96_online import run_online
from enkflow.cli import COMMANDS
from enkflow.config import AdaptiveInflation, AdaptiveTarget, Method
from enkflow.progress import Counter


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "l96",
        help=COMMANDS["l96"],
        description=(
            "Cycle a filter on Lorenz-96 (40 variables, F=8, RK4, dt=0.05), all variables observed "
            "every step with R=I; print the time-mean analysis RMSE and spread after the burn-in."
        ),
    )
    p.add_argument("--method", type=Method, choices=list(Method), default=Method.ETKF, metavar="{" + ",".join(m.value for m in Method) + "}")
    p.add_argument("--members", type=int, default=24, help="ensemble size N (default 24)")
    p.add_argument("--inflation", type=float, default=1.0, help="posterior multiplicative inflation of anomalies (default 1.0)")
    p.add_argument("--radius", type=float, default=7.28, help="Gaspari-Cohn half-width c in grid points, localized methods (DAPPER's loc_rad x 1.82; default 7.28)")
    p.add_argument("--domain-size", type=int, default=2, help="neighbouring points per local domain (default 2)")
    p.add_argument("--cycles", type=int, default=10_000, help="cycles after the burn-in (default 10000)")
    p.add_argument("--burn-in", type=int, default=400, help="cycles discarded first (default 400)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--adaptive", choices=[a.value for a in AdaptiveInflation], default=AdaptiveInflation.NONE.value,
                   help="adaptive inflation of the local methods at the scheme's defaults (docs/analysis.md), on top "
                        "of --inflation")
    p.add_argument("--adaptive-target", choices=[t.value for t in AdaptiveTarget], default=AdaptiveTarget.PRIOR.value,
                   help="the covariance the adaptive factor multiplies (gharamti2018, anderson2009; default prior)")
    p.add_argument("--adaptive-damping", type=float, default=None,
                   help="gharamti2018, anderson2009: DART's inf_damping in [0, 1] (default 0.9)")
    p.add_argument("--xn", type=float, default=1.0, help="enkf-n: certainty of the inflation hyperprior (DAPPER's xN, default 1.0)")
    p.add_argument("--rs", type=float, default=1.0, help="lnetf: DAPPER's Rs, factor on the observation error "
                   "standard deviations in the particle weights (default 1.0)")
    p.add_argument("--rotate", action="store_true", help="enkf-n, lnetf: random mean-preserving rotation of the analysis anomalies (DAPPER's rot=True)")
    p.add_argument("--json", action="store_true", help="end with one line: a JSON object of the scores")
    p.add_argument("--online", type=int, default=0, metavar="RUNNERS",
                   help="advance the members in RUNNERS online runner processes through the assimilation server "
                        "(same scores; seconds per cycle then include every cycle and the exchanges)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    s = L96Setup(
        method=args.method, members=args.members, inflation=args.inflation, radius=args.radius,
        domain_size=args.domain_size, cycles=args.cycles, burn_in=args.burn_in, seed=args.seed, adaptive=args.adaptive,
        xn=args.xn, rs=args.rs, rotate=args.rotate,
        adaptive_target=args.adaptive_target, adaptive_damping=args.adaptive_damping,
    )
    if args.online:
        res = run_online(s, runners=args.online)
    else:
        bar = Counter("  cycle")
        try:
            res = run(s, progress=bar)
        finally:
            bar.close()
    print(
        f"{s.method.value} N={s.members} inflation={s.inflation}"
        + (f" xn={s.xn}{' rotate' if s.rotate else ''}" if s.method is Method.ENKF_N else "")
        + (f" adaptive {s.adaptive.value} (mean factor {res.inflation_mean:.4f})"
           if s.adaptive is not AdaptiveInflation.NONE else "")
        + f": rmse_a {res.rmse_a:.4f}  "
        f"spread_a {res.spread_a:.4f}  rmse_f {res.rmse_f:.4f}  ({res.seconds_per_cycle * 1e3:.3f} ms/cycle, {res.cycles} cycles)"
    )
    if args.json:
        print(json.dumps({"method": s.method.value, "members": s.members, "inflation": s.inflation, "seed": s.seed, **res.as_dict()}))
    return 0
