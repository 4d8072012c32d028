"""No process outlives its study (issue 22, item 4), online and offline.

``kill -9`` of ``enkflow run`` alone during an online study (about 1 s in, the start-up, and at random
moments): before the launcher's lease, the server and its mean/spread writer stayed alive with
parent 1, and the rerun crashed six times on ``Address already in use``. Now every process the
launcher started stops by itself once the lease lapses (``[launcher] lease_timeout``), a rerun that
comes sooner stops them first, and the rerun's restarts are bitwise those of a fault-free run.
Afterwards no process of the study and no ``/dev/shm`` segment one of them made is left.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zmq

from enkflow.errors import BindError
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.online.sockets import bind
from enkflow_testing.launcher_kill import StudyProcesses, enkflow_run

LEASE_S = 2.0
# What a watched process may take to stop by itself: the timeout, a look, the SIGKILL grace of
# enkflow.jobs.lease.watch_from_environment, and room for a loaded machine. Not a speed check.
BOUND_S = LEASE_S + LEASE_S / 8 + 15.0 + 10.0


def _prepare(d: Path, mode: str, members: int) -> Path:
    """The demo's inputs (``members`` members, 2 cycles; online: 3 runners) with a 2-s lease, in ``d``."""
    toml = prepare(d, DemoSettings(members=members, cycles=2, mode=mode, runners=3), lambda m: None)
    text = toml.read_text().replace('kind = "local"\n', f'kind = "local"\nlease_timeout = {LEASE_S}\n')
    assert f"lease_timeout = {LEASE_S}" in text
    toml.write_text(text)
    return d


@pytest.fixture(scope="module")
def problem(tmp_path_factory) -> Path:
    return _prepare(tmp_path_factory.mktemp("orphans") / "problem", "online", members=6)


def _copy(problem: Path, to: Path) -> Path:
    shutil.copytree(problem, to)
    return to / "experiment.toml"


def _restarts(d: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted((d / "members").glob("member_*.nc"))]


def _run_to_end(toml: Path, study: StudyProcesses) -> str:
    log = toml.parent / "rerun.log"
    rc = study.follow(enkflow_run(toml, log))
    text = log.read_text()
    assert rc == 0, text
    assert "Traceback" not in text, text
    return text


def _fault_free(problem: Path, where: Path) -> list[bytes]:
    toml = _copy(problem, where)
    study = StudyProcesses()
    try:
        _run_to_end(toml, study)
        return _restarts(toml.parent)
    finally:
        study.kill_all()


@pytest.fixture(scope="module")
def reference(problem, tmp_path_factory) -> list[bytes]:
    return _fault_free(problem, tmp_path_factory.mktemp("orphans") / "reference")


def _kill_trial(problem: Path, where: Path, delay_s: float, *, wait: bool) -> tuple[StudyProcesses, str]:
    """kill -9 of the launcher ``delay_s`` in; with ``wait``, its processes must stop by themselves
    before the rerun; without, the rerun comes at once and must stop them. Returns the study and the
    rerun's stderr."""
    toml = _copy(problem, where)
    study = StudyProcesses()
    try:
        launcher = enkflow_run(toml, where / "killed.log")
        if study.follow(launcher, for_s=delay_s) is None:
            study.look(launcher)
            launcher.kill()
            launcher.wait()
        if wait:
            left = study.wait_gone(BOUND_S)
            assert not left, f"still running after the lease lapsed: {[p.cmdline() for p in left]}"
        said = _run_to_end(toml, study)
        assert not study.wait_gone(BOUND_S), "a process of the rerun outlived it"
        assert study.segments() == [], "shared-memory segments of the study's processes are left"
        return study, said
    finally:
        study.kill_all()


def test_a_killed_launchers_processes_stop_by_themselves_and_the_rerun_is_bitwise(problem, reference, tmp_path):
    """The reported defect: kill -9 about 1 s in (the server starting), at a random moment around it."""
    rng = np.random.default_rng()
    for n, delay in enumerate([float(rng.uniform(0.5, 2.0))]):
        study, _ = _kill_trial(problem, tmp_path / f"t{n}", delay, wait=True)
        assert _restarts(tmp_path / f"t{n}") == reference, f"kill at {delay:.2f} s: the restarts differ"


def test_a_rerun_right_after_the_kill_stops_what_the_killed_launcher_left(problem, reference, tmp_path):
    rng = np.random.default_rng()
    delay = float(rng.uniform(0.8, 2.5))
    study, said = _kill_trial(problem, tmp_path / "t", delay, wait=False)
    assert _restarts(tmp_path / "t") == reference, f"kill at {delay:.2f} s: the restarts differ"
    assert "Address already in use" not in said


def test_offline_a_killed_launchers_pilots_stop_by_themselves_and_the_rerun_is_bitwise(tmp_path):
    """Offline: the pilots (and the analysis they run) stop on the lapsed lease, their task put back."""
    problem = _prepare(tmp_path / "problem", "offline", members=4)
    reference = _fault_free(problem, tmp_path / "reference")
    delay = float(np.random.default_rng().uniform(0.5, 3.0))
    _kill_trial(problem, tmp_path / "t", delay, wait=True)
    assert _restarts(tmp_path / "t") == reference, f"kill at {delay:.2f} s: the restarts differ"


def test_a_taken_port_is_one_clear_error_naming_the_address_and_the_experiment(problem, tmp_path):
    """Another program holds the control port: the study stops at once with what to do, not after six
    restarts of the server with a traceback each."""
    ctx = zmq.Context.instance()
    holder = bind(ctx, zmq.ROUTER, "127.0.0.1")
    try:
        port = int(holder.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        with pytest.raises(BindError, match=f"tcp://127.0.0.1:{port}.*Address already in use.*enkflow run"):
            bind(ctx, zmq.ROUTER, "127.0.0.1", port=port)
        toml = _copy(problem, tmp_path / "t")
        toml.write_text(toml.read_text().replace("[online]\n", f"[online]\nport = {port}\n"))
        study = StudyProcesses()
        rc = study.follow(enkflow_run(toml, tmp_path / "t.log"))
        said = (tmp_path / "t.log").read_text()
        assert rc != 0 and "Traceback" not in said and "crashed" not in said, said
        assert f"cannot listen on tcp://127.0.0.1:{port} for experiment {tmp_path / 't' / 'run'}" in said, said
        assert not study.wait_gone(BOUND_S)
    finally:
        holder.close(0)
