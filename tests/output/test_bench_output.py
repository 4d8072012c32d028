"""`enkflow bench output` runs end to end at a tiny size (no timing assertion: figures are the bench's job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_bench_output_smoke(tmp_path, subprocess_env) -> None:  # type: ignore[no-untyped-def]
    r = subprocess.run([sys.executable, "-m", "enkflow", "bench", "output", "--nx", "36", "--ny", "18", "--steps", "4",
                        "--substeps", "1", "--repeat", "4", "--dtype", "int16", "--json", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, env=subprocess_env)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("model_s_no_output", "model_s_sync_output", "model_s_server_output", "writer_backlog_max",
                "model_s_no_output_beside_busy_loop"):
        assert res[key] >= 0
    assert len(res["runs"]["none"]) == len(res["runs"]["busy"]) == len(res["runs"]["server"]) == 4
    # Over 4 rounds each run takes each place once and follows each other run once (a Williams square).
    orders = res["orders"]
    assert all(sorted(o) == ["busy", "none", "server", "sync"] for o in orders)
    assert all(sorted(o[i] for o in orders) == ["busy", "none", "server", "sync"] for i in range(4))
    pairs = [(o[i], o[i + 1]) for o in orders for i in range(3)]
    assert len(set(pairs)) == len(pairs) == 12
    if len(os.sched_getaffinity(0)) >= 2:  # by default the writer has a CPU of its own, the model the others
        assert res["writer_cpus"] and res["model_cpus"] and not set(res["writer_cpus"]) & set(res["model_cpus"])
    assert res["steps"] == 4 and res["writer_backlog_max"] <= 4 and res["repeat"] == 4
    assert res["max_abs_diff_last_file"] <= 20.0 / 65534  # the server's last file holds the model's last field
    assert "through the output server" in r.stdout
    # The run says plainly whether each target of acceptance 1 was met, and records the conditions.
    for line in ("target: output through the server costs the model <= 2% of its time",
                 "set-up: synchronous output costs >= 30%", "the writer keeps up"):
        assert line in r.stdout and any(("MET" in l) for l in r.stdout.splitlines() if l.startswith(line))
    assert res["writer_nice"] == 10 and res["loadavg_start"] >= 0 and isinstance(res["target_server_cpu_met"], bool)
    assert not list(tmp_path.rglob("*.nc"))  # the bench removes what it wrote


def test_bench_output_refuses_cpus_it_cannot_run_on(tmp_path, subprocess_env) -> None:  # type: ignore[no-untyped-def]
    r = subprocess.run([sys.executable, "-m", "enkflow", "bench", "output", "--writer-cpus", "4095", "--dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=120, env=subprocess_env)
    assert r.returncode != 0 and "--writer-cpus '4095': cannot run there" in r.stderr, r.stderr[-2000:]
    assert not list(tmp_path.iterdir())  # refused before anything ran
