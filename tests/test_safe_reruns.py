"""Safe reruns: restarts another experiment advanced are refused, experiment.initial = "copy",
--retry-failed, configuration changes on resume, one driver per directory, a full disk."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from enkflow.errors import ConfigError, EnkflowError, MemberError
from enkflow.experiment import Experiment, load_experiment
from enkflow.experiment.provenance import RestartProvenanceError
from enkflow.jobs.events import iter_events
from jobs_helpers.experiments import make_experiment, restarts

N = 4


def ends(cfg) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    for e in iter_events(cfg.expdir / "events.jsonl"):
        if e["event"] == "task_end":
            out[(e["cycle"], e["task"])] = out.get((e["cycle"], e["task"]), 0) + 1
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, synth: Path) -> list[np.ndarray]:
    root = tmp_path_factory.mktemp("ref")
    Experiment(load_experiment(make_experiment(root, synth, cycles=2, model_sleep=0.0))).run()
    return restarts(root, N)


def second_experiment(root: Path, directory: str, extra_experiment: str = "") -> Path:
    """Another experiment TOML over the same restarts as ``root/exp.toml``."""
    text = (root / "exp.toml").read_text().replace('directory = "exp"', f'directory = "{directory}"\n{extra_experiment}')
    p = root / f"{directory}.toml"
    p.write_text(text)
    return p


def test_a_new_experiment_refuses_restarts_another_one_advanced(tmp_path: Path, synth: Path) -> None:
    root = tmp_path / "run"
    cfg = load_experiment(make_experiment(root, synth, cycles=1, model_sleep=0.0))
    Experiment(cfg).run()
    other = load_experiment(second_experiment(root, "exp2"))
    with pytest.raises(RestartProvenanceError, match=rf"member_0001.nc was advanced by experiment {cfg.expdir} \(cycle 1"):
        Experiment(other).run()
    assert not (other.expdir / "cycles").exists()  # refused before any forecast
    Experiment(other).run(accept_restarts=True)  # said explicitly


def test_initial_copy_keeps_the_initial_ensemble(tmp_path: Path, synth: Path, reference: list[np.ndarray]) -> None:
    root = tmp_path / "run"
    make_experiment(root, synth, cycles=2, model_sleep=0.0)
    cfg = load_experiment(second_experiment(root, "copy1", 'initial = "copy"'))
    before = restarts(root, N)
    Experiment(cfg).run()
    for a, b in zip(restarts(root, N), before):
        assert np.array_equal(a, b)  # the configured restarts are untouched
    import netCDF4

    for m in range(1, N + 1):
        with netCDF4.Dataset(cfg.restart_path(m)) as ds:
            assert np.array_equal(np.asarray(ds["soil_moisture"][:]), reference[m - 1])
    # Rerunning from scratch is always possible: a second copy experiment gives the same result.
    cfg2 = load_experiment(second_experiment(root, "copy2", 'initial = "copy"'))
    Experiment(cfg2).run()
    for m in range(1, N + 1):
        assert cfg2.restart_path(m).read_bytes() == cfg.restart_path(m).read_bytes()


def test_a_resume_refuses_restarts_changed_since_written(tmp_path: Path, synth: Path) -> None:
    root = tmp_path / "run"
    cfg = load_experiment(make_experiment(root, synth, cycles=1, model_sleep=0.0, obs_cycles=2))
    Experiment(cfg).run()
    shutil.copyfile(synth / "member_0002.nc", root / "members" / "member_0002.nc")  # someone restores one file
    toml = root / "exp.toml"
    toml.write_text(toml.read_text().replace("cycles = 1", "cycles = 2"))
    more = load_experiment(toml)
    with pytest.raises(RestartProvenanceError, match=r"member_0002.nc changed since this experiment wrote it at the end of cycle 1"):
        Experiment(more).run()


def test_retry_failed_after_the_cause_is_fixed(tmp_path: Path, synth: Path, reference: list[np.ndarray]) -> None:
    root = tmp_path / "run"
    fix = root / "fixed"
    model = (f"sh -c 'test $1 != 3 || test -e {fix} || exit 1; exec {sys.executable} -m enkflow.cli.model $2 --length $3 --cycle $4' "
             "m {member} {restart} {length} {cycle}")
    cfg = load_experiment(make_experiment(root, synth, cycles=2, model_command=model, max_attempts=2))
    with pytest.raises(MemberError, match="member 3, cycle 1"):
        Experiment(cfg).run()
    fix.touch()
    with pytest.raises(MemberError, match="member 3, cycle 1") as rerun:
        Experiment(cfg).run()  # a failed task stays failed without the flag
    # The rerun says the failure is the earlier run's, and how to run the task again.
    text = str(rerun.value)
    assert "the previous run failed here" in text and "previous failure: model: failed 2 time(s)" in text
    assert text.rstrip().endswith("(done members are not run again)") and "rerun with --retry-failed" in text
    Experiment(cfg).run(retry_failed=True)
    for a, b in zip(restarts(root, N), reference):
        assert np.array_equal(a, b)
    assert all(v == 1 for v in ends(cfg).values())  # done members were not run again


def test_settings_no_finished_step_used_may_change_on_resume(tmp_path: Path, synth: Path, reference: list[np.ndarray]) -> None:
    root = tmp_path / "run"
    toml = make_experiment(root, synth, cycles=2, model_sleep=0.0)
    good = toml.read_text()
    toml.write_text(good.replace('[analysis_task]\ncommand = "', '[analysis_task]\ncommand = "false ', 1))
    cfg = load_experiment(toml)
    with pytest.raises(EnkflowError, match="analysis of cycle 1"):
        Experiment(cfg).run()
    # The model settings cannot change: members of cycle 1 ran with them.
    command = load_experiment(toml).model.command
    toml.write_text(toml.read_text().replace("--sleep 0.0", "--sleep 0.01", 1))
    with pytest.raises(ConfigError, match=r"members 1, 2, 3, 4 of cycle 1 already ran") as changed:
        Experiment(load_experiment(toml)).run(retry_failed=True)
    # The error names the key and both values.
    new = command.replace("--sleep 0.0", "--sleep 0.01")
    assert f'model.command: "{command}" -> "{new}"' in str(changed.value) and changed.value.key == "model.command"
    toml.write_text(good)  # the analysis fixed: it had not been applied, so the change is allowed
    cfg = load_experiment(toml)
    Experiment(cfg).run(retry_failed=True)
    for a, b in zip(restarts(root, N), reference):
        assert np.array_equal(a, b)
    assert all(v == 1 for v in ends(cfg).values())
    # Finished cycles ran with the analysis settings: a change names the key, not a garbled section list.
    toml.write_text(good.replace("[observations]\n", "[observations]\nwindow = [-1.0, 1.0]\n", 1))
    with pytest.raises(ConfigError, match=r"cycles 1-2 ran with the recorded ones") as finished:
        Experiment(load_experiment(toml)).run()
    assert "observations.window: (not set) -> [-1.0, 1.0]" in str(finished.value)
    assert finished.value.key == "observations.window"


def test_a_second_driver_on_one_directory_is_refused(tmp_path: Path, synth: Path, subprocess_env: dict[str, str]) -> None:
    root = tmp_path / "run"
    toml = make_experiment(root, synth, cycles=1, model_sleep=5.0)
    first = subprocess.Popen([sys.executable, "-m", "enkflow", "run", "--quiet", str(toml)], env=subprocess_env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        lock = root / "exp" / "driver.lock"
        t0 = time.time()
        while not (lock.exists() and lock.stat().st_size > 0) and time.time() - t0 < 30:
            time.sleep(0.1)
        out = subprocess.run([sys.executable, "-m", "enkflow", "run", "--quiet", str(toml)], env=subprocess_env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2
        assert f"PID {first.pid}" in out.stderr and "in use by another enkflow run" in out.stderr
        assert "Traceback" not in out.stderr
    finally:
        first.kill()
        first.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_stops_with_the_file_named_and_the_rerun_resumes(tmp_path: Path, synth: Path,
                                                                      reference: list[np.ndarray],
                                                                      subprocess_env: dict[str, str]) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        root = tmp_path / "run"
        toml = make_experiment(root, synth, cycles=2, model_sleep=0.3, workers=1)
        toml.write_text(toml.read_text().replace('directory = "exp"', f'directory = "{mnt / "exp"}"'))
        proc = subprocess.Popen([sys.executable, "-m", "enkflow", "run", "--quiet", str(toml)], env=subprocess_env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # Fill the disk once the first member is done.
        t0 = time.time()
        while not list((mnt / "exp").glob("cycles/0001/done/task_001.json")) and time.time() - t0 < 60:
            time.sleep(0.05)
        subprocess.run(["dd", "if=/dev/zero", f"of={mnt / 'filler'}", "bs=64k"], capture_output=True)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, err
        assert "no space left on the device" in err and str(mnt / "exp") in err
        assert "Traceback" not in err
        (mnt / "filler").unlink()
        out = subprocess.run([sys.executable, "-m", "enkflow", "run", "--quiet", str(toml)], env=subprocess_env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        for a, b in zip(restarts(root, N), reference):
            assert np.array_equal(a, b)
    finally:
        subprocess.run(["umount", "-l", str(mnt)])
