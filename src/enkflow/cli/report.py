"""``enkflow report EXPDIR``: time-to-solution figures of an experiment, and the failure that stopped it.

Per-cycle total, queuing, running, I/O and overhead seconds, and their
mean +- std over cycles with each as a percentage of the total. ``--html``
writes the report page: settings, scores, maps, timing; ``--scores`` the
per-cycle scores as a table (NetCDF and CSV).
"""

from __future__ import annotations

import argparse
import json

from enkflow.cli import COMMANDS
from enkflow.report import MapCycles, find_expdir, load_report, render_report, report_json, write_html
from enkflow.report.scores import collect_scores
from enkflow.report.scores_table import write_scores_table


def _map_cycle(text: str) -> int | MapCycles:
    if text == MapCycles.ALL.value:
        return MapCycles.ALL
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a cycle number or 'all', not {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help=COMMANDS["report"], description=__doc__)
    p.add_argument("expdir", help="experiment directory (holding events.jsonl)")
    p.add_argument("--members", action="store_true", help="also list every member's wait, run and I/O time")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--html", action="store_true",
                   help="write a self-contained HTML page (settings, scores, maps, timing) and print its path")
    p.add_argument("--scores", action="store_true",
                   help="write the per-cycle scores as EXPDIR/scores.nc and EXPDIR/scores.csv and print their paths")
    p.add_argument("--out", default=None, help="--html: the page's path (default EXPDIR/report.html)")
    p.add_argument("--truth", default=None, metavar="TEMPLATE",
                   help="--html, --scores: truth files for the RMSE, a path with {cycle} (e.g. truth/truth_{cycle:04d}.nc), "
                        "relative to the experiment TOML's directory; overrides [verification] truth")
    p.add_argument("--free-run", default=None, metavar="TEMPLATE",
                   help="--html, --scores: a no-assimilation run's state files, a path with {cycle}; overrides "
                        "[verification] free_run")
    p.add_argument("--map-cycle", default=MapCycles.LAST, type=_map_cycle, metavar="K|all",
                   help="--html: the cycle the maps show (default the last), or 'all'")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    if args.html:
        print(write_html(args.expdir, args.out, truth=args.truth, free_run=args.free_run, map_cycle=args.map_cycle))
        return 0
    if args.scores:
        expdir = find_expdir(args.expdir)
        for path in write_scores_table(collect_scores(expdir, args.truth, args.free_run), expdir):
            print(path)
        return 0
    rep = load_report(args.expdir)
    print(json.dumps(report_json(rep), indent=1) if args.json else render_report(rep, members=args.members))
    return 0
