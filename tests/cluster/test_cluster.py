"""The cluster in a box: emulated nodes, MPI and SLURM across them, a node crash, and nothing left behind.

One cluster (3 nodes and a head, with SLURM) serves the module; it needs root
and the namespace tools, and the tests skip with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from enkflow.jobs.process import process_alive
from enkflow_testing.cluster import Cluster
from enkflow_testing.cluster_ns import NETNS_DIR, missing_reason, sweep_stale

NODES = ["n1", "n2", "n3"]
CLUSTER = {"n_nodes": len(NODES), "login_nodes": 1, "slurm": True, "cpus_per_node": 4}
PY = sys.executable


def _out(c: Cluster, node: str, argv: list[str], **kw) -> str:
    res = c.run(node, argv, capture_output=True, text=True, timeout=120, **kw)
    assert res.returncode == 0, f"{argv} on {node}: {res.stderr}"
    return res.stdout


def test_each_node_has_its_hostname_and_address(cluster: Cluster):
    names = [_out(cluster, n, ["hostname"]).strip() for n in NODES]
    assert names == NODES
    assert _out(cluster, "n2", ["ip", "-4", "-o", "addr", "show", cluster.iface]).split()[3] == "10.77.0.2/24"
    # A node's own name, and every other node's, resolves to its address on the cluster's network.
    resolve = "import socket; print(*(socket.gethostbyname(h) for h in [socket.gethostname(), 'n1', 'head']))"
    assert _out(cluster, "n3", [PY, "-c", resolve]).split() == ["10.77.0.3", "10.77.0.1", "10.77.0.254"]


def test_tmp_and_shm_are_private_the_shared_root_is_not(cluster: Cluster, cluster_shared: Path):
    for private in ("/tmp", "/dev/shm"):
        _out(cluster, "n1", ["touch", f"{private}/only-on-n1"])
        assert not Path(private, "only-on-n1").exists()  # not on the machine's own
        assert _out(cluster, "n2", ["ls", private]).split() == _visible(private, cluster.shared)
    _out(cluster, "n1", ["sh", "-c", f"echo from-n1 > {cluster_shared}/note"])
    assert _out(cluster, "n3", ["cat", f"{cluster_shared}/note"]) == "from-n1\n"
    assert (cluster_shared / "note").read_text() == "from-n1\n"


def _visible(private: str, shared: list[Path]) -> list[str]:
    """What a fresh node shows in ``private``: only the top folders of the shared folders bound through it (the
    test's shared root; the checkout and its interpreter where they lie under it)."""
    return sorted({p.relative_to(private).parts[0] for p in shared if Path(private) in p.parents})


_SERVE = textwrap.dedent("""
    import socket, sys
    s = socket.create_server((sys.argv[1], 0))
    print(s.getsockname()[1], flush=True)
    conn, peer = s.accept()
    conn.sendall(peer[0].encode())
""")
_CONNECT = "import socket, sys; print(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20).recv(64).decode())"
_PROBE = textwrap.dedent("""
    import socket, sys
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
        print("reached")
    except OSError as exc:
        print(type(exc).__name__)
""")


def test_tcp_between_nodes_not_to_the_machines_loopback(cluster: Cluster):
    server = cluster.popen("n1", [PY, "-c", _SERVE, cluster.address("n1")], stdout=subprocess.PIPE, text=True)
    port = server.stdout.readline().strip()
    assert _out(cluster, "n2", [PY, "-c", _CONNECT, cluster.address("n1"), port]).strip() == cluster.address("n2")
    server.wait(timeout=30)
    with socket.create_server(("127.0.0.1", 0)) as host_service:  # a service on the machine's own loopback
        port = str(host_service.getsockname()[1])
        assert _out(cluster, "n1", [PY, "-c", _PROBE, port]).strip() == "ConnectionRefusedError"


# Rank 0 prints every rank's host and the allreduce it saw, one line: the ranks' own prints would interleave.
_RANKS = ("from mpi4py import MPI; import socket, json; c = MPI.COMM_WORLD; "
          "r = c.gather([socket.gethostname(), c.allreduce(c.rank + 1)]); c.rank or print(json.dumps(r))")


def _ranks(out: str) -> dict[int, tuple[str, int]]:
    return {rank: (host, total) for rank, (host, total) in enumerate(json.loads(out))}


@pytest.mark.mpi
def test_mpiexec_across_two_nodes(cluster: Cluster):
    out = _out(cluster, "n1", [*cluster.mpiexec(hosts=["n1", "n2"], n=4, ppn=2), PY, "-c", _RANKS])
    assert _ranks(out) == {0: ("n1", 10), 1: ("n1", 10), 2: ("n2", 10), 3: ("n2", 10)}


@pytest.mark.slurm
def test_srun_across_two_nodes(cluster: Cluster):
    out = _out(cluster, "head", ["srun", "-N", "2", "-n", "2", "hostname"])
    hosts = out.split()
    assert len(hosts) == 2 and len(set(hosts)) == 2 and set(hosts) <= set(NODES)


@pytest.mark.slurm
@pytest.mark.mpi
def test_sbatch_job_lands_on_nodes_and_hydra_spans_its_allocation(cluster: Cluster, cluster_shared: Path):
    """mpiexec inside a 2-node batch job starts its ranks on both nodes (hydra uses the allocation)."""
    script = cluster_shared / "job.sh"
    script.write_text(f"#!/bin/sh\nhostname > {cluster_shared}/batch-host\n{cluster.mpiexec_bin} -n 4 {PY} -c '{_RANKS}'\n")
    job = cluster.slurm.sbatch(["--nodes=2", "--ntasks-per-node=2", f"--output={cluster_shared}/job.out", str(script)],
                               cwd=cluster_shared)
    assert cluster.slurm.wait_job(job) == "COMPLETED"
    first = (cluster_shared / "batch-host").read_text().strip()
    ranks = _ranks((cluster_shared / "job.out").read_text())
    assert first in NODES
    assert sorted(ranks) == [0, 1, 2, 3] and {s for _, s in ranks.values()} == {10}
    assert len({h for h, _ in ranks.values()}) == 2


@pytest.mark.slurm
def test_kill_node_kills_its_processes_and_memory_revive_brings_it_back(cluster: Cluster):
    sleeper = cluster.popen("n3", ["sleep", "600"])
    _out(cluster, "n3", ["sh", "-c", "echo x > /dev/shm/segment && echo y > /tmp/scratch"])
    assert [p.name for p in cluster.node_path("n3", "/dev/shm").iterdir()] == ["segment"]
    before = cluster.processes("n3")
    assert sleeper.pid in before and len(before) >= 3  # keeper, slurmd, sleep
    cluster.kill_node("n3")
    assert sleeper.wait(timeout=10) == -signal.SIGKILL
    assert cluster.processes("n3") == [] and not any(process_alive(p) for p in before)
    with pytest.raises(RuntimeError, match="down"):
        cluster.run("n3", ["true"])
    cluster.revive_node("n3")
    assert not list(cluster.node_path("n3", "/dev/shm").iterdir())
    assert not cluster.node_path("n3", "/tmp/scratch").exists()
    assert _out(cluster, "head", ["srun", "-w", "n3", "hostname"]).strip() == "n3"


@pytest.mark.slurm
def test_a_login_node_submits_but_gets_no_jobs_and_can_be_lost(cluster: Cluster):
    assert sorted(_out(cluster, "l1", ["sinfo", "-h", "-N", "-o", "%N"]).split()) == NODES
    assert sorted(_out(cluster, "l1", ["srun", "-N", "3", "hostname"]).split()) == NODES
    assert cluster.address("l1") == "10.77.0.201"
    cluster.kill_node("l1")
    cluster.revive_node("l1")
    assert _out(cluster, "l1", ["hostname"]).strip() == "l1"
    with pytest.raises(ValueError, match="controller"):
        cluster.kill_node("head")


_ABANDON = textwrap.dedent("""
    import sys
    from enkflow_testing.cluster import Cluster
    c = Cluster(n_nodes=1).start()
    print(c.prefix, flush=True)
    sys.stdin.read()
""")


def test_a_killed_harness_is_swept_and_a_stopped_one_leaves_nothing():
    reason = missing_reason()
    if reason:
        pytest.skip(f"emulated cluster unavailable: {reason}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([PY, "-c", _ABANDON], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    prefix = child.stdout.readline().strip()
    assert prefix and list(NETNS_DIR.glob(f"{prefix}-*"))
    child.kill()  # no atexit: its namespaces and keepers stay until a sweep
    child.wait()
    # Other dead harnesses' namespaces may be swept too (tests of other worktrees run beside these).
    assert {f"{prefix}-head", f"{prefix}-n1", f"{prefix}-switch"} <= set(sweep_stale())
    assert not list(NETNS_DIR.glob(f"{prefix}-*"))
    links = _host_links()
    with Cluster(n_nodes=1) as c:
        keeper = c.node("n1").keeper
        assert _host_links() == links  # nothing added to the machine's own network namespace
    assert not c.leftovers() and not process_alive(keeper)


def _host_links() -> list[str]:
    return sorted(subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout.splitlines())
