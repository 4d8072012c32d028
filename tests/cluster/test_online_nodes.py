"""Acceptance (issue 22, item 1): an online study whose 2-rank server spans 2 emulated nodes and whose
runners run on 2 other nodes, all placed by SLURM (``[launcher] kind = "slurm"``, ``[online] nodes = 2``,
``bind = "*"``), gives analyses and final restarts bitwise equal to the same study on one node.

The one-node run is ``enkflow run`` on this machine (local launcher, the server on loopback); the
cluster run is ``enkflow run`` in the head node. Both run in the same folder (the analysis mean files
name their template's path), one after the other.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from enkflow_testing.online_faults import nc_content

# The harness (enkflow_testing.cluster, tests/cluster/conftest.py) comes with the cluster branch.
pytest.importorskip("enkflow_testing.cluster", reason="the emulated cluster harness is not in this checkout")

CLUSTER = {"n_nodes": 4, "slurm": True, "cpus_per_node": 1}
MEMBERS, CYCLES = 8, 2


def _online(text: str, launcher: str, **settings: object) -> str:
    """The demo's ``experiment.toml`` with its last sections, [launcher] and [online], replaced."""
    runner = (f"{sys.executable} -m enkflow.online.models demo --address {{address}} --token-file {{token_file}} "
              "--grid {restart} --length {length}")
    online = {"runner": runner, "runners": 2, "ranks": 2, **settings}
    body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in online.items())
    return text[:text.index("\n[launcher]")] + f'\n[launcher]\nkind = "{launcher}"\n\n[online]\n{body}'


def _outputs(root: Path) -> dict[str, bytes]:
    out = {p.name: p.read_bytes() for p in sorted((root / "members").glob("member_*.nc"))}
    for p in sorted((root / "run" / "cycles").glob("*/analysis_*.nc")):
        out[str(p.relative_to(root))] = nc_content(p)
    return out


def _events(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "run" / "events.jsonl").read_text().splitlines()]


def test_online_server_on_two_nodes_with_runners_on_two_others_is_bitwise_one_node(cluster, cluster_shared):
    from enkflow.experiment.demo_problem import DemoSettings, prepare

    pristine = cluster_shared / "pristine"
    toml = prepare(pristine, DemoSettings(members=MEMBERS, cycles=CYCLES, mode="online"), lambda _m: None)
    text = toml.read_text()
    study = cluster_shared / "study"

    shutil.copytree(pristine, study)
    (study / "experiment.toml").write_text(_online(text, launcher="local"))
    one = subprocess.run([sys.executable, "-m", "enkflow", "run", str(study / "experiment.toml")], cwd=study,
                         capture_output=True, text=True, timeout=120)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    expected = _outputs(study)
    shutil.rmtree(study)

    shutil.copytree(pristine, study)
    (study / "experiment.toml").write_text(_online(text, launcher="slurm", nodes=2, bind="*"))
    many = cluster.run("head", [sys.executable, "-m", "enkflow", "run", str(study / "experiment.toml")], cwd=study,
                       capture_output=True, text=True, timeout=150)
    logs = "".join(f"\n== {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                   for p in sorted((study / "run" / "online" / "logs").glob("*.log")))
    assert many.returncode == 0, many.stdout[-3000:] + many.stderr[-3000:] + logs

    events = _events(study)
    server_nodes = {n for e in events if e.get("event") == "online_start" for n in e["nodes"]}
    runner_nodes = {str(e["runner"]).rsplit(":", 1)[0] for e in events if e.get("event") == "runner_join"}
    assert len(server_nodes) == 2 and len(runner_nodes) == 2 and not server_nodes & runner_nodes, (server_nodes, runner_nodes)
    got = _outputs(study)
    assert got.keys() == expected.keys() and len(got) == MEMBERS + 2 * CYCLES
    assert [k for k in expected if got[k] != expected[k]] == []
