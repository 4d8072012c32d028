"""A 2-rank server whose ranks have different host names, inside a private network namespace whose
only way out of loopback is an interface with a non-loopback address: the ranks' bus and every data
socket are bound and advertised on that address (never loopback), runners reach them, and the
result is bitwise the one of 1 server rank and 1 runner. The same server bound on loopback stops
with a configuration error naming the key.

Rank 1 runs in a UTS namespace of its own (hydra's MPMD form ``mpiexec -n 1 A : -n 1 unshare --uts
... A``), so the server sees two nodes. Needs root, ``ip`` and ``unshare``; the namespace is created
and removed here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from nton_study import logs, run_study, script

ADDRESS = "10.251.7.1"


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace with loopback and an interface ``en0`` holding ADDRESS/24 (a veth pair whose
    two ends are both inside: nothing touches this machine's own network)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("a private network namespace needs root, ip and unshare")
    name = f"enkflow-span-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        pytest.skip("cannot create a network namespace here")
    try:
        for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "link", "add", "en0", "type", "veth", "peer", "name", "en1"],
                    ["ip", "addr", "add", f"{ADDRESS}/24", "dev", "en0"], ["ip", "link", "set", "en1", "up"],
                    ["ip", "link", "set", "en0", "up"]):
            subprocess.run(["ip", "netns", "exec", name, *cmd], check=True, capture_output=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def _server_on_two_hosts(ns: str, mpiexec: str, tmp: Path, bind: str) -> list[str]:
    """``mpiexec`` in ``ns``: rank 0 here, rank 1 under another host name."""
    argv = script("nton_server.py", tmp, "1", bind)
    other_host = ["unshare", "--uts", "sh", "-c", 'hostname enkflow-node-b && exec "$@"', "sh"]
    return ["ip", "netns", "exec", ns, mpiexec, "-n", "1", *argv, ":", "-n", "1", *other_host, *argv]


@pytest.mark.mpi
def test_ranks_on_two_hosts_bind_and_advertise_the_node_address(tmp_path, netns, mpiexec, subprocess_env):
    ref = run_study(tmp_path / "ref", subprocess_env, script("nton_server.py", tmp_path / "ref", "1"),
                    [script("nton_runner.py", tmp_path / "ref", "0")])
    two = tmp_path / "two"
    got = run_study(two, subprocess_env, _server_on_two_hosts(netns, mpiexec, two, "*"),
                    [["ip", "netns", "exec", netns, *script("nton_runner.py", two, "0")]])
    assert (two / "address").read_text().startswith(f"tcp://{ADDRESS}:")
    assert (two / "bus").read_text().startswith(f"tcp://{ADDRESS}:"), "the ranks' bus listens on loopback"
    assert ref.keys() == got.keys() == {"a", "b", "h"}
    for k in ref:
        assert ref[k].dtype == got[k].dtype and np.array_equal(ref[k], got[k]), k


@pytest.mark.mpi
def test_ranks_on_two_hosts_refuse_a_loopback_bind(tmp_path, netns, mpiexec, subprocess_env):
    tmp_path.joinpath("token").write_text("0" * 32)
    with open(tmp_path / "server.log", "wb") as out:
        rc = subprocess.run(_server_on_two_hosts(netns, mpiexec, tmp_path, "127.0.0.1"), env=subprocess_env,
                            stdout=out, stderr=subprocess.STDOUT, timeout=120).returncode
    text = logs(tmp_path)
    assert rc != 0 and "listen on loopback" in text and "online.bind" in text, text
