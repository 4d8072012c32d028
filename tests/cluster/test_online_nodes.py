"""Acceptance (issue 22, item 1): an online study whose 2-rank server spans 2 emulated nodes and whose
runners run on 2 other nodes, all placed by SLURM (``[launcher] kind = "slurm"``, ``[online] nodes = 2``,
``bind = "*"``), gives analyses and final restarts bitwise equal to the same study on one node.

The one-node run is ``enkflow run`` on this machine (local launcher, the server on loopback); the
cluster run is ``enkflow run`` in the head node. Both run in the same folder (the analysis mean files
name their template's path), one after the other.
"""

from __future__ import annotations

import shutil
import sys

from enkflow_testing.node_loss_study import events, outputs
from online_study import MEMBERS, logs, online_toml, run_here

CLUSTER = {"n_nodes": 4, "slurm": True, "cpus_per_node": 1}


def test_online_server_on_two_nodes_with_runners_on_two_others_is_bitwise_one_node(cluster, cluster_shared):
    from enkflow.experiment.demo_problem import DemoSettings, prepare

    pristine = cluster_shared / "pristine"
    text = prepare(pristine, DemoSettings(members=MEMBERS, cycles=2, mode="online"), lambda _m: None).read_text()
    study = cluster_shared / "study"
    shutil.copytree(pristine, study)
    (study / "experiment.toml").write_text(online_toml(text, "local"))
    run_here(study)
    expected = outputs(study)
    shutil.rmtree(study)

    shutil.copytree(pristine, study)
    # Both runners take part (on a loaded machine the study could end before the second one joined).
    (study / "experiment.toml").write_text(online_toml(text, "slurm", nodes=2, bind="*", min_runners=2))
    r = cluster.run("head", [sys.executable, "-m", "enkflow", "run", str(study / "experiment.toml")], cwd=study,
                    capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + logs(study)

    ev = events(study)
    server_nodes = {n for e in ev if e.get("event") == "online_start" for n in e["nodes"]}
    runner_nodes = {str(e["runner"]).rsplit(":", 1)[0] for e in ev if e.get("event") == "runner_join"}
    assert len(server_nodes) == 2 and len(runner_nodes) == 2 and not server_nodes & runner_nodes, (server_nodes, runner_nodes)
    got = outputs(study)
    assert got.keys() == expected.keys() and len(got) == MEMBERS + 2 * (2 + 1)  # cycles 0 (initial), 1, 2
    assert [k for k in expected if got[k] != expected[k]] == []


def test_one_nodes_address_as_bind_of_a_server_on_two_nodes_fails_once_with_the_reason(cluster, cluster_shared):
    """Every rank but those on that node could not listen there: refused at once, recorded, not retried."""
    from enkflow.experiment.demo_problem import DemoSettings, prepare

    study = cluster_shared / "one-address"
    text = prepare(study, DemoSettings(members=MEMBERS, cycles=1, mode="online"), lambda _m: None).read_text()
    (study / "experiment.toml").write_text(online_toml(text, "slurm", nodes=2, bind=cluster.address("n1")))
    r = cluster.run("head", [sys.executable, "-m", "enkflow", "run", str(study / "experiment.toml")], cwd=study,
                    capture_output=True, text=True, timeout=150)
    assert r.returncode != 0 and "one node's address" in r.stderr and "online.bind" in r.stderr, r.stderr[-3000:]
    assert not [e for e in events(study) if e.get("event") == "server_crash"], logs(study)
