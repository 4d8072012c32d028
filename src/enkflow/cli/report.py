"""``enkflow report EXPDIR``: time-to-solution figures of an experiment.

Per-cycle total, queuing, running, I/O and overhead seconds, and their
mean +- std over cycles with each as a percentage of the total.
"""

from __future__ import annotations

import argparse
import json

from enkflow.cli import COMMANDS
from enkflow.report import load_report, render_report, report_json, write_html


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help=COMMANDS["report"], description=__doc__)
    p.add_argument("expdir", help="experiment directory (holding events.jsonl)")
    p.add_argument("--members", action="store_true", help="also list every member's wait, run and I/O time")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--html", action="store_true",
                   help="write a self-contained HTML page with figures (timing, scores, OmB/OmA per kind, QC, maps) "
                        "and print its path")
    p.add_argument("--out", default=None, help="--html: the page's path (default EXPDIR/report.html)")
    p.add_argument("--truth", default=None, metavar="TEMPLATE",
                   help="--html: truth files for the RMSE, a path with {cycle} (e.g. truth/truth_{cycle:04d}.nc)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    if args.html:
        print(write_html(args.expdir, args.out, truth=args.truth))
        return 0
    rep = load_report(args.expdir)
    print(json.dumps(report_json(rep), indent=1) if args.json else render_report(rep, members=args.members))
    return 0
