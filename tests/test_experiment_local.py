"""Offline cycling with the local launcher: strategies, report, resume, bad input, failing model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from enkflow.errors import ConfigError, MemberError, StructureMismatchError
from enkflow.experiment import Experiment, load_experiment
from enkflow.jobs.events import iter_events
from enkflow.report import load_report, render_report
from jobs_helpers.experiments import make_experiment, restarts

N = 4


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, synth: Path) -> list[np.ndarray]:
    """Restarts after 3 fault-free cycles with the dynamic scheme."""
    root = tmp_path_factory.mktemp("ref")
    cfg = load_experiment(make_experiment(root, synth))
    Experiment(cfg).run()
    return restarts(root, N)


def _end_counts(expdir: Path) -> dict[tuple[int, int], int]:
    counts: dict[tuple[int, int], int] = {}
    for e in iter_events(expdir / "events.jsonl"):
        if e["event"] == "task_end":
            key = (e["cycle"], e["task"])
            counts[key] = counts.get(key, 0) + 1
    return counts


def test_dynamic_run_report_and_restarts_change(tmp_path: Path, synth: Path, reference: list[np.ndarray]) -> None:
    cfg = load_experiment(make_experiment(tmp_path / "run", synth))
    before = restarts(tmp_path / "run", N)
    assert not any(np.array_equal(a, b) for a, b in zip(before, reference))
    Experiment(cfg).run()
    for a, b in zip(restarts(tmp_path / "run", N), reference):
        assert np.array_equal(a, b)
    counts = _end_counts(cfg.expdir)
    assert counts == {(k, t): 1 for k in (1, 2, 3) for t in range(1, N + 2)}
    rep = load_report(cfg.expdir)
    assert [c.cycle for c in rep.cycles] == [1, 2, 3]
    for c in rep.cycles:
        assert c.total > 0 and c.running > 0
        assert abs(c.queuing + c.running + c.io + c.overhead - c.total) < 1e-6
        assert c.io > 0  # the toy analysis reports read_s and write_s
        assert set(c.members) == set(range(1, N + 1))
    text = render_report(rep)
    assert "queuing" in text and "% of total" in text
    assert (cfg.expdir / "output" / "mean_0003.npy").exists()


@pytest.mark.parametrize("strategy", ["per-member", "single"])
def test_reference_strategies_give_the_same_restarts(tmp_path: Path, synth: Path, reference: list[np.ndarray],
                                                      strategy: str) -> None:
    cfg = load_experiment(make_experiment(tmp_path, synth, strategy=strategy))
    Experiment(cfg).run()
    for a, b in zip(restarts(tmp_path, N), reference):
        assert np.array_equal(a, b)
    roles = {e.get("role") for e in iter_events(cfg.expdir / "events.jsonl") if e["event"] == "job_submit"}
    assert roles == ({"member", "analysis"} if strategy == "per-member" else {"all"})


def test_rerun_of_a_finished_experiment_runs_nothing_and_more_cycles_extend_it(tmp_path: Path, synth: Path) -> None:
    cfg = load_experiment(make_experiment(tmp_path, synth, cycles=1, model_sleep=0.0, obs_cycles=2))
    assert Experiment(cfg).run() == [1]
    assert Experiment(load_experiment(tmp_path / "exp.toml")).run() == []
    # A larger cycle count extends the experiment.
    toml = tmp_path / "exp.toml"
    toml.write_text(toml.read_text().replace("cycles = 1", "cycles = 2"))
    assert Experiment(load_experiment(toml)).run() == [2]


def test_resume_after_kill_of_the_driver(tmp_path: Path, synth: Path, reference: list[np.ndarray]) -> None:
    toml = make_experiment(tmp_path, synth)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    code = "import sys; from enkflow.experiment import Experiment, load_experiment; Experiment(load_experiment(sys.argv[1])).run()"
    proc = subprocess.Popen([sys.executable, "-c", code, str(toml)], env=env, start_new_session=True)
    events = tmp_path / "exp" / "events.jsonl"
    # Kill the driver (and its pilots) once the second cycle has members done.
    deadline = time.time() + 60
    while time.time() < deadline:
        ev = list(iter_events(events))
        if any(e["event"] == "task_end" and e.get("cycle") == 2 and e.get("member") for e in ev):
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    cfg = load_experiment(toml)
    ran = Experiment(cfg).run()
    assert ran == [2, 3]
    for a, b in zip(restarts(tmp_path, N), reference):
        assert np.array_equal(a, b)
    starts = [e["cycle"] for e in iter_events(events) if e["event"] == "cycle_start"]
    assert starts.count(1) == 1 and starts.count(2) == 1
    # No member ran twice to completion in any cycle.
    assert all(v == 1 for v in _end_counts(cfg.expdir).values())


def test_member_failing_repeatedly_stops_with_stderr_and_command(tmp_path: Path, synth: Path) -> None:
    cmd = "sh -c 'echo model exploded at member {member} >&2; exit 3'"
    cfg = load_experiment(make_experiment(tmp_path, synth, model_command=cmd, max_attempts=2, cycles=1))
    with pytest.raises(MemberError) as ei:
        Experiment(cfg).run()
    msg = str(ei.value)
    assert "model exploded at member" in msg
    assert "sh -c" in msg and "exit status 3" in msg
    assert ei.value.cycle == 1


def test_missing_observation_file_fails_before_the_cycle(tmp_path: Path, synth: Path) -> None:
    cfg = load_experiment(make_experiment(tmp_path, synth, cycles=3, obs_cycles=2))
    with pytest.raises(ConfigError, match="observation file of cycle 3") as ei:
        Experiment(cfg).run()
    assert ei.value.key == "observations.file"
    assert not (cfg.expdir / "cycles").exists()


def test_model_command_not_found(tmp_path: Path, synth: Path) -> None:
    cfg = load_experiment(make_experiment(tmp_path, synth, model_command="no-such-model-xyz {restart}"))
    with pytest.raises(ConfigError, match="no-such-model-xyz") as ei:
        Experiment(cfg).run()
    assert ei.value.key == "model.command"


def test_restart_structure_mismatch(tmp_path: Path, synth: Path) -> None:
    import netCDF4

    toml = make_experiment(tmp_path, synth)
    bad = tmp_path / "members" / "member_0003.nc"
    bad.unlink()
    with netCDF4.Dataset(bad, "w") as ds:
        ds.createDimension("land", 5)
        ds.createVariable("soil_moisture", "f8", ("land",))
    with pytest.raises(StructureMismatchError, match="member_0003.nc"):
        Experiment(load_experiment(toml)).run()


def _set_key(text: str, section: str, name: str, value: str) -> str:
    """``text`` with ``name = value`` in ``[section]`` (replaced if present)."""
    out, current, done = [], None, False
    for line in text.splitlines():
        if line.startswith("["):
            if current == section and not done:
                out.append(f"{name} = {value}")
                done = True
            current = line.strip("[]")
        elif current == section and line.split("=")[0].strip() == name:
            line, done = f"{name} = {value}", True
        out.append(line)
    if not done:
        out.append(f"{name} = {value}")
    return "\n".join(out)


@pytest.mark.parametrize("section, name, value", [
    ("experiment", "members", "1"),
    ("jobs", "strategy", '"pilots"'),
    ("jobs", "workers", "9"),
    ("model", "command", '"run {rstart}"'),
    ("launcher", "kind", '"pbs"'),
    ("jobs", "colour", '"red"'),
    ("observations", "file", '"obs_{cycel}.nc"'),
])
def test_config_errors_name_the_key(tmp_path: Path, synth: Path, section: str, name: str, value: str) -> None:
    toml = make_experiment(tmp_path, synth)
    toml.write_text(_set_key(toml.read_text(), section, name, value))
    with pytest.raises(ConfigError) as ei:
        load_experiment(toml)
    assert ei.value.key == f"{section}.{name}"
    assert str(toml) in str(ei.value)


def test_state_and_io_sections_are_accepted_and_checked(tmp_path: Path, synth: Path) -> None:
    from enkflow.experiment import checks

    toml = make_experiment(tmp_path, synth)
    toml.write_text(toml.read_text() + '\n[state]\nvariables = ["soil_moisture"]\n\n[io]\nio_tasks = 2\n')
    cfg = load_experiment(toml)
    assert cfg.state is not None and cfg.io.io_tasks == 2
    checks.check_restarts(cfg)
    toml.write_text(toml.read_text().replace('variables = ["soil_moisture"]', 'variables = ["no_such_var"]'))
    with pytest.raises(Exception, match="no_such_var"):
        checks.check_restarts(load_experiment(toml))


def test_operator_stage_runs_after_each_forecast(tmp_path: Path, synth: Path) -> None:
    toml = make_experiment(tmp_path, synth, cycles=2, model_sleep=0.0)
    text = toml.read_text().replace(
        'file = "obs/obs_{cycle:03d}.nc"',
        'file = "obs/obs_{cycle:03d}.nc"\noperator = "sh -c \'echo {member} {cycle} {obs} > {output}\'"\n'
        'operator_output = "hx/hx_{cycle}_{member}.txt"')
    toml.write_text(text)
    cfg = load_experiment(toml)
    Experiment(cfg).run()
    for k in (1, 2):
        for m in range(1, N + 1):
            got = (tmp_path / "hx" / f"hx_{k}_{m}.txt").read_text().split()
            assert got[:2] == [str(m), str(k)] and got[2].endswith(f"obs_{k:03d}.nc")
