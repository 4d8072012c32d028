"""The built-in analysis task's exit status tells the job scheme whether another attempt may pass: a lost
output service (it went with a killed ``enkflow run``; the rerun starts another) is retried, a bad input is
not (found by benchmarks/node_loss_trials.py: ``kill -9`` of ``enkflow run`` during an analysis failed the
rerun, the task marked failed for good)."""

from __future__ import annotations

from pathlib import Path

import pytest

from enkflow.errors import DETERMINISTIC_ERROR_RC, EnkflowError
from enkflow.experiment import analysis_task
from enkflow.output.remote import ServiceLost


@pytest.mark.parametrize(("error", "rc"), [(ServiceLost("the output service at tcp://n:1 (pid 1) is gone"), 2),
                                           (EnkflowError("obs.nc: no variable 'value'"), DETERMINISTIC_ERROR_RC)])
def test_a_lost_output_service_is_retried_a_bad_input_is_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             error: Exception, rc: int) -> None:
    def fail(cfg: object, cycle: int) -> None:
        raise error

    monkeypatch.setattr(analysis_task, "read_json", lambda path: {})
    monkeypatch.setattr(analysis_task, "experiment_from_json", lambda data, file: None)
    monkeypatch.setattr(analysis_task, "run_analysis", fail)
    assert analysis_task.main([str(tmp_path), "1"]) == rc
