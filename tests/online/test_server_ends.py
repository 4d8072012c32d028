"""Why a server ended reaches the supervisor: a start-up error of any rank is recorded (not retried),
a bind that cannot serve ranks on several nodes is refused, and a lost rank is reported by rank and node."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from enkflow.errors import ConfigError, EnkflowError
from enkflow.experiment.config import load_experiment
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.experiment.directory import ExperimentDir
from enkflow.fsutil import read_json, write_json_atomic
from enkflow.online.experiment import DETERMINISTIC_ERROR_RC, ServerStatus, _serve
from enkflow.online.launch import OnlineExperiment
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


def test_a_lost_rank_is_reported_by_rank_and_node_and_counts_as_a_restart(tmp_path) -> None:
    toml = prepare(tmp_path, DemoSettings(members=3, cycles=1, mode="online"), lambda m: None)
    said: list[str] = []
    run = OnlineExperiment(load_experiment(toml), progress=said.append)
    run.odir.path.mkdir(parents=True)
    lost = {"state": ServerStatus.RANK_LOST, "error": "silent", "ranks": [1], "nodes": ["n2"]}
    write_json_atomic(run.odir.status, lost)
    assert run._server_ended() is None  # restart it
    assert "rank 1 (node n2) lost" in said[-1]
    crash = [json.loads(line) for line in run.xdir.events.read_text().splitlines()][-1]
    assert crash["event"] == "server_crash" and crash["cause"] == "rank_lost" and crash["nodes"] == ["n2"]
    run.server_restarts = run.o.max_server_restarts
    with pytest.raises(EnkflowError, match="2 of them with a server rank lost"):
        run._server_ended()
