"""Why a server ended reaches the supervisor: a start-up error of any rank is recorded (not retried),
a bind that cannot serve ranks on several nodes is refused, and a lost rank is reported by rank and node."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import pytest

from enkflow.errors import ConfigError, EnkflowError
from enkflow.experiment.config import load_experiment
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.experiment.directory import ExperimentDir
from enkflow.fsutil import read_json, write_json_atomic
from enkflow.online.experiment import DETERMINISTIC_ERROR_RC, ServerStatus, _serve
from enkflow.online.launch import OnlineExperiment
from enkflow.online.liveness import AliveFile, AliveWatch, SilentRank
from enkflow.online.sockets import bus_host


@dataclass
class Ranks:
    rank: int
    size: int


def test_a_start_up_error_of_a_rank_other_than_0_is_recorded_as_not_retryable(tmp_path) -> None:
    xdir = ExperimentDir(tmp_path)
    xdir.online.path.mkdir(parents=True)
    xdir.config.write_text("{}")  # not a configuration: every rank fails, rank 0 perhaps waiting in a collective
    assert _serve(xdir, Ranks(1, 2)) == DETERMINISTIC_ERROR_RC
    status = read_json(xdir.online.status)
    assert status["state"] == ServerStatus.FAILED and status["error"].startswith("server rank 1 (node "), status


def test_one_nodes_address_as_bind_is_refused_for_ranks_on_several_nodes() -> None:
    with pytest.raises(ConfigError, match="'10.0.0.1', one node's address"):
        bus_host("10.0.0.1", ["n1", "n2"])
    with pytest.raises(ConfigError, match="loopback"):
        bus_host("127.0.0.1", ["n1", "n2"])
    assert bus_host("10.0.0.1", ["n1", "n1"]) == "127.0.0.1"
    assert bus_host("eth0", ["n1", "n2"]) == "eth0"


def test_a_rank_renews_its_alive_file_and_removes_it_at_its_end(tmp_path) -> None:
    alive = AliveFile(tmp_path, 3, "n4", period_s=0.01)
    path = tmp_path / "rank_0003"
    first = path.stat().st_mtime_ns
    while path.stat().st_mtime_ns == first:  # renewed by its thread (never: the suite's timeout)
        time.sleep(0.01)
    assert path.read_text() == "n4"
    alive.close()
    assert not path.exists()


def test_a_rank_whose_alive_file_stands_still_is_silent_by_the_watchers_clock(tmp_path) -> None:
    watch = AliveWatch(tmp_path, limit_s=60.0, every_s=0.0)
    quiet, busy = tmp_path / "rank_0001", tmp_path / "rank_0000"
    quiet.write_text("n2")
    busy.write_text("n1")
    assert watch.silent(0.0) == []
    for t in (30, 59, 91):
        os.utime(busy, ns=(t, t))  # renewed (mtimes from another node's clock: only their changes count)
        if t == 30:
            os.utime(quiet, ns=(t, t))
        assert watch.silent(float(t)) == ([SilentRank(1, "n2")] if t == 91 else [])


@dataclass
class Cancels:
    cancelled: list[str] = field(default_factory=list)

    def cancel(self, jobs: list[str]) -> None:
        self.cancelled += jobs


def test_the_launcher_cancels_a_server_with_a_silent_rank_and_restarts_it_as_a_lost_rank(tmp_path) -> None:
    toml = prepare(tmp_path, DemoSettings(members=3, cycles=1, mode="online"), lambda m: None)
    said: list[str] = []
    run = OnlineExperiment(load_experiment(toml), progress=said.append)
    run.alive = AliveWatch(run.odir.alive, limit_s=-1.0, every_s=0.0)  # silent as soon as seen twice unchanged
    run.odir.alive.mkdir(parents=True)
    (run.odir.alive / "rank_0001").write_text("n2")
    run.launcher = Cancels()
    run._cancel_silent("job-1")  # first seen
    run._cancel_silent("job-1")  # unchanged: silent
    assert run.launcher.cancelled == ["job-1"]
    assert run._server_ended() is None and "rank 1 (node n2) lost" in said[-1]  # restart it
    crash = [json.loads(line) for line in run.xdir.events.read_text().splitlines()][-1]
    assert crash["event"] == "server_crash" and crash["cause"] == "rank_lost" and crash["nodes"] == ["n2"]
    run.server_restarts = run.o.max_server_restarts
    write_json_atomic(run.odir.status, {"state": ServerStatus.RANK_LOST, "error": "silent", "ranks": [1], "nodes": ["n2"]})
    with pytest.raises(EnkflowError, match="2 of them with a server rank lost"):
        run._server_ended()
