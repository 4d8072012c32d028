"""`enkflow bench online` and `online-scale` at tiny sizes: the JSON line's keys and the exchanged data
(checksummed on both sides with --check); never a timing assertion (the machines are shared)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from enkflow.bench.online_checks import checksum, verify


def _bench(args: list[str], env: dict, cwd) -> dict:
    p = subprocess.run([sys.executable, "-m", "enkflow", "bench", *args, "--json", "--dir", str(cwd)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    assert len(lines) > 1, "a readable table comes before the JSON line"
    return json.loads(lines[-1])


def _positive(res: dict, *keys: str) -> None:
    for k in keys:
        assert isinstance(res[k], float) and math.isfinite(res[k]) and res[k] > 0, k


@pytest.mark.mpi
def test_bench_online_tiny(mpiexec, subprocess_env, tmp_path):
    res = _bench(["online", "--state-mb", "1", "--members", "2", "--cycles", "1", "--runners", "2", "--ranks", "2",
                  "--check"], subprocess_env, tmp_path)
    _positive(res, "exchange_gbps", "raw_zmq_gbps", "ratio", "seconds_per_cycle_online", "seconds_per_cycle_offline")
    assert res["ratio"] == pytest.approx(res["exchange_gbps"] / res["raw_zmq_gbps"])
    assert (res["state_mb"], res["members"], res["cycles"], res["runners"], res["ranks"]) == (1.0, 2, 1, 2, 2)
    assert res["bytes_moved"] == 2 * 2 * 1 * 125_000 * 8
    assert res["tasks"] == 2
    assert res["data_ok"] is True and res["data_problems"] == []
    assert res["online_equals_offline"] is True
    _positive(res, "memcpy_gbps", "memcpy_s")
    shm = ("shm_exchange_gbps", "shm_ratio", "shm_ratio_best", "shm_over_tcp")
    if res["shm_unavailable"] is None:  # the runners are on the server's node: shared memory, against a copy
        _positive(res, *shm)
        assert res["shm_ratio"] == pytest.approx(res["shm_exchange_gbps"] / res["memcpy_gbps"])
        assert res["shm_over_tcp"] == pytest.approx(res["shm_exchange_gbps"] / res["exchange_gbps"])
        assert len(res["shm_exchange_forecast_s"]) == len(res["shm_exchange_cpu_s"]) == 1
    else:
        assert all(res[k] is None for k in shm)
    assert not list(tmp_path.iterdir()), "the temporary files are removed"


@pytest.mark.mpi
def test_bench_online_scale_tiny(mpiexec, subprocess_env, tmp_path):
    res = _bench(["online-scale", "--members", "24", "--runners", "3", "--ranks", "2", "--cycles", "1", "--model", "l96",
                  "--check"], subprocess_env, tmp_path)
    _positive(res, "server_ms_per_member", "members_per_s", "runner_cpu_ms_per_member")
    assert len(res["server_cpu_ms_per_member"]) == 2
    assert res["timed_tasks"] == 24 and sum(res["tasks_per_runner"]) == 48
    # the server's forecast phases and the runners' exchanges are timed through their public hooks
    assert all(c > 0 for c in res["server_cpu_ms_per_member"])
    _positive(res, "runner_put_ms_per_member", "runner_get_ms_per_member")
    assert res["data_ok"] is True


def test_checksum_is_exact_additive_and_positional():
    x = np.random.default_rng(0).standard_normal(1001)
    assert (checksum(x[:400]) + checksum(x[400:], 400)) % 2**64 == checksum(x)
    y = x.copy()
    y[[3, 7]] = y[[7, 3]]
    assert checksum(y) != checksum(x)
    y = x.copy()
    y[500] = np.nextafter(y[500], np.inf)
    assert checksum(y) != checksum(x)


def test_verify_finds_a_wrong_exchange():
    rec = {"initial": [11, 12], "analyses": {"1": [21, 22]}, "forecasts": {"1": [31, 32], "2": [41, 42]},
           "runners": [{"tasks": [[1, 1, 11, 31], [1, 2, 12, 32], [2, 1, 21, 41]]},
                       {"tasks": [[2, 2, 99, 42]]}]}
    assert verify(rec, 2, 2) == ["cycle 2, member 2: the runner got another state than the server held"]
    rec["runners"][1]["tasks"] = []
    assert verify(rec, 2, 2) == ["cycle 2, member 2: no runner ran it"]
    rec["runners"][1]["tasks"] = [[2, 2, 22, 43]]
    assert verify(rec, 2, 2) == ["cycle 2, member 2: the analysis saw another forecast than the runner sent"]
