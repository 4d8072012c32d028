"""Fault trial: the offline study's output service stopped (SIGSTOP) mid-run, and never continued.

Claim under test (issue 12, acceptance 3, for a hang rather than a kill): the run does not wait for
ever, nor go on paying for the hang. The driver, which watches the service at every poll, finds it
without progress for ``[analysis_output] writer_timeout`` + 5 s, kills it and stops the run naming it
(what the service held may be lost, so no exit 0); a rerun starts a new service, runs the cycles left
and every cycle has its statistics and mean/spread files.

The experiment: the tiny synthetic land problem, 4 members, ``--cycles`` cycles, the built-in LETKF,
``writer_timeout = 1`` s; the service is stopped at the end of cycle 1. Prints what happened and ends
with one JSON line.

usage: python benchmarks/output_hang_trial.py [--cycles 3] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testing"))

from enkflow.experiment import Experiment, load_experiment  # noqa: E402
from enkflow.jobs.events import iter_events  # noqa: E402
from enkflow_testing.experiments import synth_problem, write_builtin_experiment  # noqa: E402

FILES = ("analysis_mean.nc", "analysis_spread.nc", "soil_moisture_analysis_mean.nc",
         "soil_moisture_analysis_spread.nc", "soil_moisture_forecast_mean.nc", "soil_moisture_analysis_increment.nc")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--work", type=Path, default=None)
    a = ap.parse_args()
    root = a.work or Path(tempfile.mkdtemp(prefix="enkflow-hang-"))
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    cfg = load_experiment(write_builtin_experiment(root / "e", synth_problem(root / "p", 4), members=4, cycles=a.cycles,
                                                   extra="\n[analysis_output]\nwriter_timeout = 1.0\n"))
    stopped: list[int] = []

    def stop_service(k: int) -> None:
        if k == 1:
            start = next(e for e in iter_events(cfg.expdir / "events.jsonl") if e["event"] == "output_service_start")
            os.kill(int(start["pid"]), signal.SIGSTOP)
            stopped.append(int(start["pid"]))

    t0 = time.monotonic()
    error = None
    try:
        Experiment(cfg, on_cycle_end=stop_service).run()
    except Exception as exc:  # noqa: BLE001 - the claim is that it fails, and how
        error = f"{type(exc).__name__}: {exc}"
    first_s = time.monotonic() - t0
    analysis_s = {e["cycle"]: round(e["t"] - s["t"], 1) for s in iter_events(cfg.expdir / "events.jsonl")
                  if s["event"] == "task_start" and s["task"] == 5
                  for e in iter_events(cfg.expdir / "events.jsonl")
                  if e["event"] == "task_end" and e["task"] == 5 and e["cycle"] == s["cycle"]}
    rerun = Experiment(cfg).run()
    missing = {k: [f for f in FILES if not (cfg.cycle_dir(k) / f).is_file()] for k in range(1, a.cycles + 1)}
    res = {"trial": "output_service_sigstop", "cycles": a.cycles, "first_run_error": error, "first_run_s": round(first_s, 1),
           "service_killed": bool(stopped) and not Path(f"/proc/{stopped[0]}").exists(),
           "analysis_task_s": analysis_s, "rerun_cycles": rerun, "files_missing": {k: v for k, v in missing.items() if v},
           "claim_holds": error is not None and "hung" in error and "[analysis_output] writer_timeout" in error and rerun == list(range(2, a.cycles + 1))
           and not any(missing.values())}
    print(f"first run: {'failed: ' + error if error else 'exit 0'} after {first_s:.1f} s")
    print(f"analysis task seconds per cycle: {analysis_s}; rerun ran cycles {rerun}; files missing: {res['files_missing']}")
    print(json.dumps(res))
    if a.work is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if res["claim_holds"] else 1


if __name__ == "__main__":
    sys.exit(main())
