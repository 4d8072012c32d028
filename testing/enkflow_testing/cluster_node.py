"""One emulated node: a network namespace on the cluster's bridge and a keeper holding its UTS and mount namespaces.

The switch is a network namespace of its own holding the bridge ``br0``; each
node's ``eth0`` is one end of a veth whose other end (``v<index>``) sits on
that bridge, so nothing is added to the machine's own network namespace. The
keeper (``unshare --uts --mount`` inside the node's network namespace) sets
the hostname, mounts a fresh tmpfs on ``/dev/shm`` and ``/tmp``, binds the
shared folders that lie under them back in place, binds the cluster's hosts
file on ``/etc/hosts``, prints its pid and sleeps; processes enter the node
with ``nsenter -t KEEPER -n -u -m``. When every process of the node is gone
its mount namespace and both tmpfs go with it: a crashed node's memory.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from enkflow_testing.cluster_ns import NETNS_DIR, ClusterFailed, NodeNamespaces, delete_netns, kill_all, pids_in, sh

HEAD = "head"  # the node of the cluster's services (SLURM's controller, munge)
BRIDGE = "br0"
IFACE = "eth0"
# Paths a node holds privately; a shared folder under one of them is bound through.
PRIVATE = (Path("/tmp"), Path("/dev/shm"))
_MAX_SHARED = 6  # file descriptors 3..8 carry the shared folders past the new tmpfs


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """Where a node lives: its name (also its hostname), namespace name, switch port and IPv4 address."""

    name: str
    netns: str
    index: int
    address: str
    prefix_len: int = 24


def private_shared(shared: list[Path]) -> list[Path]:
    """The shared folders that a node's fresh ``/tmp`` or ``/dev/shm`` would hide (they are bound through)."""
    hidden = [p for p in shared if any(p == q or q in p.parents for q in PRIVATE)]
    if len(hidden) > _MAX_SHARED:
        raise ClusterFailed(f"at most {_MAX_SHARED} shared folders under /tmp or /dev/shm, not {len(hidden)}")
    return hidden


def keeper_script(spec: NodeSpec, hidden: list[Path], hosts: Path, tmp_mb: int) -> str:
    """The shell script the keeper runs: private tmpfs, shared folders bound through, hostname, then sleep."""
    q = shlex.quote
    lines = ["set -e"]
    lines += [f"exec {3 + i}<{q(str(p))}" for i, p in enumerate(hidden)]
    lines += [f"mount -t tmpfs -o size={tmp_mb}m,mode=1777 tmpfs {q(str(p))}" for p in PRIVATE]
    for i, p in enumerate(hidden):
        # -c: libmount would resolve /proc/self/fd/N to its path name, which the tmpfs now hides.
        lines += [f"mkdir -p {q(str(p))}", f"mount -c --bind /proc/self/fd/{3 + i} {q(str(p))}", f"exec {3 + i}<&-"]
    lines += [f"mount --bind {q(str(hosts))} /etc/hosts", f"hostname {q(spec.name)}", "echo $$", "exec sleep infinity"]
    return "\n".join(lines)


def make_switch(netns: str) -> None:
    """The switch namespace and its bridge."""
    sh(["ip", "netns", "add", netns], "making the switch namespace")
    sh(["ip", "-n", netns, "link", "add", BRIDGE, "type", "bridge"], "making the bridge")
    sh(["ip", "-n", netns, "link", "set", BRIDGE, "up"], "raising the bridge")


def make_network(spec: NodeSpec, switch: str) -> None:
    """The node's network namespace, its veth to the bridge, its address and loopback, all up."""
    port = f"v{spec.index}"
    sh(["ip", "netns", "add", spec.netns], f"making node {spec.name}'s network namespace")
    # A revived node's old port may outlive its deleted namespace for a moment (the kernel frees a namespace,
    # and the veth in it, once its last user is gone): deleting the port removes the whole old pair at once.
    subprocess.run(["ip", "-n", switch, "link", "del", port], capture_output=True, timeout=30)
    # Made inside the switch namespace: the pair never exists in the machine's own namespace.
    sh(["ip", "-n", switch, "link", "add", port, "type", "veth", "peer", "name", IFACE, "netns", spec.netns],
       f"making node {spec.name}'s veth")
    sh(["ip", "-n", switch, "link", "set", port, "master", BRIDGE, "up"], f"plugging node {spec.name} in")
    sh(["ip", "-n", spec.netns, "addr", "add", f"{spec.address}/{spec.prefix_len}", "dev", IFACE],
       f"addressing node {spec.name}")
    sh(["ip", "-n", spec.netns, "link", "set", IFACE, "up"], f"raising node {spec.name}'s interface")
    sh(["ip", "-n", spec.netns, "link", "set", "lo", "up"], f"raising node {spec.name}'s loopback")


def start_keeper(spec: NodeSpec, hidden: list[Path], hosts: Path, tmp_mb: int) -> tuple[subprocess.Popen, int]:
    """Start the node's keeper; returns its launcher process and the keeper's pid (the holder of the namespaces)."""
    # nsenter, not 'ip netns exec': that would mount a fresh /sys without /sys/fs/cgroup, which slurmd needs.
    argv = ["nsenter", f"--net={NETNS_DIR / spec.netns}", "--", "unshare", "--uts", "--mount", "--propagation", "private", "--fork",
            "sh", "-c", keeper_script(spec, hidden, hosts, tmp_mb)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        proc.kill()
        raise ClusterFailed(f"node {spec.name}'s keeper did not start: {proc.stderr.read().strip()}")
    proc.stdout.close()
    return proc, int(line)


@dataclass(kw_only=True)
class Node:
    """A live node: spec, keeper pid and namespace identities; ``launcher`` is the ``unshare`` process above the keeper."""

    spec: NodeSpec
    launcher: subprocess.Popen
    keeper: int
    ns: NodeNamespaces

    def enter(self) -> list[str]:
        """The command prefix that runs a program in all of this node's namespaces."""
        return ["nsenter", "-t", str(self.keeper), "-n", "-u", "-m", "--"]

    def pids(self) -> list[int]:
        return pids_in(self.ns)

    def crash(self) -> None:
        """SIGKILL every process of the node; the keeper dies too, so its tmpfs are dropped."""
        kill_all(self.ns)
        self.launcher.wait()
        if self.launcher.stderr is not None:
            self.launcher.stderr.close()


def boot(spec: NodeSpec, switch: str, hidden: list[Path], hosts: Path, tmp_mb: int) -> Node:
    """Make the node's namespaces from nothing (a stale one of the same name is removed first)."""
    delete_netns(spec.netns)
    make_network(spec, switch)
    launcher, keeper = start_keeper(spec, hidden, hosts, tmp_mb)
    return Node(spec=spec, launcher=launcher, keeper=keeper, ns=NodeNamespaces.of(keeper))
