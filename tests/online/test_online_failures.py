"""Online failures name their cause at once (`enkflow run`, exit status 65): a runner written without
``with Runner(...)`` that raises on one member (its own exception text, in seconds, not after the
heartbeat timeout), and runners that cannot start or join (a missing script, a field the experiment does
not carry, a wrong token) stop the study at the first one, not after restarts."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from enkflow.cli import main
from enkflow.errors import DETERMINISTIC_ERROR_RC
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.online.contact import CONTACT_ENV, contacts, note_contact
from enkflow.online.process_ends import Culprit, RunnerExit, RunnerExits, StudyFailed

USER_RUNNER = Path(__file__).with_name("user_runner.py")


@pytest.fixture(scope="module")
def problem(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("problem")
    prepare(d, DemoSettings(members=3, cycles=1, mode="online", runners=2), lambda m: None)
    return d


def _run(problem: Path, where: Path, runner: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[dict]]:
    """``enkflow run`` of the problem with ``runner`` as [online] runner, its heartbeat timeout 60 s (a
    study that ends in this test's time did not wait for it) and a member failing twice failed for good
    (each of the two runners once, no restart needed): exit status, stderr, events."""
    shutil.copytree(problem, where)
    toml = where / "experiment.toml"
    text = re.sub(r"(?m)^runner = .*$", lambda _: f'runner = "{runner}"', toml.read_text())
    text = text.replace("heartbeat_timeout = 10.0", "heartbeat_timeout = 60.0\nmax_failures = 2")
    toml.write_text(text)
    rc = main(["run", str(toml)])
    events = [json.loads(line) for line in (where / "run" / "events.jsonl").read_text().splitlines()]
    return rc, capsys.readouterr().err, events


def test_a_runner_without_with_that_raises_names_its_exception_at_once(problem, tmp_path, capsys) -> None:
    rc, err, events = _run(problem, tmp_path / "s", f"{sys.executable} {USER_RUNNER} {{address}} {{token_file}} "
                                                    "{restart} raise", capsys)
    cause = "FloatingPointError: overflow in the tracer advection of member 2"
    assert rc == DETERMINISTIC_ERROR_RC, err
    error = err[err.index("enkflow run: error:"):]
    assert error.startswith("enkflow run: error: member 2, cycle 1: the forecast failed on 2 runners"), error
    assert error.count(cause) >= 3, error  # each attempt, and the tail of the first failed runner's log
    # The log named is that of the runner whose FAIL was the last straw, never one told to stop.
    assert re.search(r"the runner whose failure ended the study: runner \d \(job \S+\) exited with status 1; "
                     r"\S+/runner-\d\.log ends with:", error), error
    assert "status 0" not in err and "told it to stop" not in err, err
    # Said as it happened: the member rescheduled with the runner's own text, each exit with its status.
    assert re.search(rf"cycle 1: member 2 rescheduled \(failed\): runner \S+: {cause}", err), err
    assert "exited with status 1;" in err.split("enkflow run: error:")[0], err
    assert "no heartbeat" not in err and not any(e["event"] == "runner_lost" for e in events), err
    assert {e.get("status") for e in events if e["event"] == "runner_exit"} == {1}
    starts = sum(e["event"] == "runner_start" for e in events)  # only a runner reported as exited is replaced
    assert starts - 2 <= sum(e["event"] == "runner_exit" for e in events), events
    fails = [e for e in events if e["event"] == "experiment_fail"]
    assert re.search(r"/runner-\d\.log$", fails[-1]["log"]) and isinstance(fails[0].get("id"), int), fails
    names = [e["event"] for e in events]  # the address, so the runners, only once the server can welcome them
    assert names.index("online_start") < names.index("runner_start"), names


@pytest.mark.parametrize("case, cause", [
    ("missing", r"can't open file '\S*no_such_runner\.py'"),
    ("extra-field", r"unknown field 'land_i' \(the server expects soil_moisture\); the server's fields are the state "
                    r"variables \(\[state\] variables\), then .*\(\[online\] carried\)"),
    ("wrong-token", "authentication failed: wrong token"),
])
def test_a_runner_that_cannot_start_or_join_stops_the_study_at_once(problem, tmp_path, capsys, case, cause) -> None:
    script = USER_RUNNER.with_name("no_such_runner.py") if case == "missing" else USER_RUNNER
    rc, err, events = _run(problem, tmp_path / "s", f"{sys.executable} {script} {{address}} {{token_file}} {{restart}} "
                                                    f"{case}", capsys)
    assert rc == DETERMINISTIC_ERROR_RC, err
    error = err[err.index("enkflow run: error:"):]
    how = " before it reached the server" if case == "missing" else r": the server refused it \("
    assert re.match(rf"enkflow run: error: runner \d \(job \S+\) exited with status [12]{how}", error), error
    assert re.search(r"runner-\d\.log ends with:\n", error) and re.search(cause, error), error
    assert sum(e["event"] == "runner_start" for e in events) == 2, "a runner that cannot start was restarted"
    fail = events[-1]  # for `enkflow report`: why, and the log that holds the cause
    assert fail["event"] == "experiment_fail" and re.search(cause, fail["reason"]) and fail["log"] in fail["reason"], fail


def test_the_log_named_is_the_first_failed_runners_and_never_an_empty_tail(tmp_path) -> None:
    logs = [tmp_path / f"runner-{k}.log" for k in range(10)]
    logs[0].write_text("Traceback (most recent call last):\nFloatingPointError: the cause\n")
    for log in logs[1:]:
        log.write_text("")
    exits = RunnerExits()
    exits.add(RunnerExit(0, "j0", 1, logs[0]), any_joined=True, refused={})
    for k in range(1, 10):
        exits.add(RunnerExit(k, f"j{k}", -9, logs[k]), any_joined=True, refused={})
    assert exits.cause().startswith(f"\nthe first runner to fail: runner 0 (job j0) exited with status 1; {logs[0]} "
                                    "ends with:\n    Traceback"), exits.cause()
    assert "FloatingPointError: the cause" in exits.cause()
    assert RunnerExit(9, "j9", -9, logs[9]).describe() == "runner 9 (job j9) was killed by signal 9 (SIGKILL)"
    assert RunnerExit(9, "j9", None, logs[9]).tail() == f"; its log {logs[9]} is empty"


def test_a_runner_told_to_stop_is_never_the_one_to_fail(tmp_path) -> None:
    log = tmp_path / "runner-0.log"
    exits = RunnerExits()
    exits.note(RunnerExit(0, "j0", 0, log, told_to_stop=True))
    exits.add(RunnerExit(1, "j1", 0, log, frozenset({7})), any_joined=True, refused={})
    assert exits.first_failed() is None and exits.cause() == "\nno runner exited with an error"
    assert exits.log_or(tmp_path) == tmp_path
    assert exits.cause(Culprit(0, "j0", log)).startswith("\nthe runner whose failure ended the study: runner 0 (job j0) "
                                                         "exited with status 0 when the server told it to stop;")
    running = Culprit(3, "j3", tmp_path / "runner-3.log")
    assert exits.cause(running).startswith("\nthe runner whose failure ended the study: runner 3 (job j3), still running;")
    assert exits.log_or(tmp_path, running) == running.log


@pytest.mark.parametrize("status, greeted, refused, fails", [
    (2, frozenset(), {}, "before it reached the server"),  # python cannot open the script
    (1, frozenset({5}), {5: "wrong token"}, r"the server refused it \(wrong token\)"),
    (1, frozenset({5}), {}, None),  # ServerLost: greeted a server that did not answer in time
    (None, frozenset(), {}, None),  # SLURM without accounting cannot tell
    (0, frozenset(), {}, None),  # cancelled while pending
    (137, frozenset(), {}, None),  # SIGKILL behind mpiexec or a shell
    (-15, frozenset(), {}, None),
    (1, frozenset({5}), {6: "another runner's fields"}, None),
])
def test_only_a_refusal_or_an_error_before_greeting_is_a_failed_start(tmp_path, status, greeted, refused, fails) -> None:
    ended = RunnerExit(2, "j2", status, tmp_path / "runner-2.log", greeted)
    if fails is None:
        RunnerExits().add(ended, any_joined=False, refused=refused)
    else:
        with pytest.raises(StudyFailed, match=rf"runner 2 \(job j2\) exited with status {status}:? {fails}"):
            RunnerExits().add(ended, any_joined=False, refused=refused)
    RunnerExits().add(RunnerExit(2, "j2", 2, ended.log), any_joined=True, refused={})  # others run: replaced
    assert RunnerExit(2, "j2", 137, ended.log).describe().endswith("status 137 (128 + 9: signal 9, SIGKILL, as a shell "
                                                                   "reports it)")


def test_a_runner_records_its_greeting_where_enkflow_run_asks(tmp_path, monkeypatch) -> None:
    contact = tmp_path / "runner-0.contact"
    assert contacts(contact) == set()
    monkeypatch.setenv(CONTACT_ENV, str(contact))
    note_contact(12)
    note_contact(34)
    assert contacts(contact) == {12, 34}
