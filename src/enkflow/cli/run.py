"""``enkflow run EXPERIMENT.toml``: offline cycling with the dynamic running job scheme, or online
cycling (``[experiment] mode = "online"``) with an assimilation server and runners.

Rerunning the same command after a crash or kill resumes from the recorded
state: finished cycles and members are not run again.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from enkflow.cli import COMMANDS
from enkflow.errors import DETERMINISTIC_ERROR_RC, ConfigError, FileFormatError, InputError, MemberError
from enkflow.experiment import Experiment, load_experiment
from enkflow.experiment.config import ExperimentConfig
from enkflow.online.launch import OnlineExperiment, restore_online
from enkflow.online.process_ends import StudyFailed
from enkflow.report import load_report, render_report


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help=COMMANDS["run"], description=__doc__)
    p.add_argument("config", help="experiment TOML file")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--retry-failed", action="store_true",
                   help="put the tasks that failed for good back in line (after fixing the cause); "
                        "done members are not run again")
    p.add_argument("--accept-restarts", action="store_true",
                   help="start (or resume) from restarts that another experiment advanced, or that changed "
                        "since this experiment wrote them")
    p.add_argument("--from-archive", type=int, metavar="CYCLE", default=None,
                   help="restore the restarts archived after CYCLE ([archive] dir; every checksum verified first) "
                        "and continue the experiment from the next cycle")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    cfg = load_experiment(args.config)
    progress = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    if cfg.experiment.mode == "online":
        return _online(cfg, args, progress)
    Experiment(cfg, progress=progress).run(retry_failed=args.retry_failed, accept_restarts=args.accept_restarts,
                                           from_archive=args.from_archive)
    print(render_report(load_report(cfg.expdir)))
    return 0


# An online study that stopped for a cause a rerun would meet again (docs/online.md, "Exit statuses").
_STUDY_FAILURES = (StudyFailed, MemberError, ConfigError, FileFormatError, InputError)


def _online(cfg: ExperimentConfig, args: argparse.Namespace, progress: Callable[[str], None] | None) -> int:
    """The online study: 0 complete, 65 (DETERMINISTIC_ERROR_RC) failed for a cause a rerun would meet again;
    other errors reach the command line's handler (2)."""
    try:
        if args.from_archive is not None:
            restore_online(cfg, args.from_archive, progress=progress)
        OnlineExperiment(cfg, progress=progress, bar_stream=sys.stderr).run()
    except _STUDY_FAILURES as exc:
        print(f"enkflow run: error: {exc}", file=sys.stderr, flush=True)
        return DETERMINISTIC_ERROR_RC
    print(render_report(load_report(cfg.expdir)))
    return 0
