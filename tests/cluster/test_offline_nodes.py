"""Acceptance (issue 22, item 1): an offline study whose built-in analysis runs as 2 MPI ranks on 2 emulated
nodes (dynamic pilots, SLURM jobs of 2 nodes; ``mpiexec -n 2`` in the pilot starts its ranks through
``srun``) gives final restarts and analysis files bitwise equal to the same study run on one node.

The one-node run is ``enkflow run`` on this machine (local launcher, serial analysis); the cluster run is
``enkflow run`` in the head node. Both run in the same folder (the analysis mean files name their
template's path), one after the other.
"""

from __future__ import annotations

import subprocess
import sys

from enkflow_testing.node_loss_study import TOML, Mode, events, fresh_copy, offline_toml, outputs, prepare

# One CPU per node: a pilot of 2 tasks must take 2 nodes, so the analysis's 2 ranks are on 2 nodes.
CLUSTER = {"n_nodes": 4, "slurm": True, "cpus_per_node": 1}
MEMBERS, CYCLES = 4, 2


def test_offline_analysis_on_two_nodes_is_bitwise_one_node(cluster, cluster_shared):
    pristine, study = cluster_shared / "pristine", cluster_shared / "study"
    demo = prepare(pristine, Mode.OFFLINE, members=MEMBERS, cycles=CYCLES)

    fresh_copy(pristine, study, offline_toml(demo, sys.executable, slurm=False))
    one = subprocess.run([sys.executable, "-m", "enkflow", "run", TOML], cwd=study, capture_output=True, text=True,
                         timeout=120)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    expected = outputs(study)

    fresh_copy(pristine, study, offline_toml(demo, sys.executable, slurm=True))
    many = cluster.run("head", [sys.executable, "-m", "enkflow", "run", TOML], cwd=study, capture_output=True,
                       text=True, timeout=150)
    logs = "".join(f"\n== {p.relative_to(study)}\n{p.read_text(errors='replace')[-1500:]}"
                   for p in sorted((study / "run" / "cycles").glob("*/logs/*.log")))
    assert many.returncode == 0, many.stdout[-3000:] + many.stderr[-3000:] + logs

    analyses = [e for e in events(study) if e.get("event") == "task_end" and e.get("member") is None]
    assert [len(e["timings"]["rank_rows"]) for e in analyses] == [2] * CYCLES  # 2 ranks, one per node
    hosts = {str(e["worker"]).rsplit("-", 1)[0] for e in events(study) if e.get("event") == "job_start"}
    assert hosts <= set(cluster.names), hosts  # the pilots ran on the compute nodes
    got = outputs(study)
    assert got.keys() == expected.keys() and len(got) == MEMBERS + 2 * (CYCLES + 1)  # cycle 0: the initial ensemble
    assert [k for k in expected if got[k] != expected[k]] == []
