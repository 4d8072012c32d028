"""Entry point of the built-in analysis task: ``python -m enkflow.experiment.analysis_task EXPDIR CYCLE``.

The worker that takes the analysis ID runs this module (prefixed with
``analysis_task.launcher``, e.g. ``mpiexec -n 4``, for a parallel analysis).
It loads the experiment's saved configuration, calls
:func:`enkflow.experiment.analysis_step.run_analysis` and writes the timings
it returns (seconds) as JSON to ``$ENKFLOW_TIMING_FILE``, from rank 0 only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from enkflow.errors import DETERMINISTIC_ERROR_RC, EnkflowError, RecoveryError, StorageError
from enkflow.experiment.analysis_step import run_analysis
from enkflow.experiment.config import experiment_from_json
from enkflow.experiment.directory import ExperimentDir
from enkflow.jobs.files import read_json, write_json_atomic
from enkflow.jobs.worker import timing_record
from enkflow.output.remote import ServiceLost
from enkflow.parallel import get_comm


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m enkflow.experiment.analysis_task EXPDIR CYCLE", file=sys.stderr)
        return 2
    expdir, cycle = Path(args[0]), int(args[1])
    try:
        config = ExperimentDir(expdir).config
        data = read_json(config)
        if data is None:
            raise EnkflowError(f"{expdir}: no config.json; is it an enkflow experiment directory?")
        cfg = experiment_from_json(data, file=str(config))
        timings = run_analysis(cfg, cycle)
        out = os.environ.get("ENKFLOW_TIMING_FILE")
        if out and get_comm().rank == 0:
            write_json_atomic(out, timing_record(timings or {}))
    except (StorageError, RecoveryError, ServiceLost) as exc:
        # May pass once the cause is fixed or on another attempt: the job scheme retries. The study's
        # output service is lost with its launcher (killed, its node lost): the rerun starts another.
        print(f"enkflow analysis (cycle {cycle}): error: {exc}", file=sys.stderr)
        return 2
    except EnkflowError as exc:
        print(f"enkflow analysis (cycle {cycle}): error: {exc}", file=sys.stderr)
        return DETERMINISTIC_ERROR_RC
    return 0


if __name__ == "__main__":
    sys.exit(main())
