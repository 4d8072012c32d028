"""A cluster in a box: N emulated nodes on this machine, for tests and benchmarks (see ``docs/testing.md``).

Each node is a network namespace on a private bridge, plus a UTS and a mount
namespace with its own hostname and its own ``/dev/shm`` and ``/tmp``
(:mod:`enkflow_testing.cluster_node`); the rest of the file system is shared,
like a parallel file system. A head node (``head``) holds the cluster's
services (SLURM's controller, munge) and is where clients run by default.
MPI reaches the nodes through hydra with a launcher script instead of ssh
(:mod:`enkflow_testing.cluster_mpi`), SLURM through one slurmd per node
(:mod:`enkflow_testing.cluster_slurm`). Needs root.

Usage::

    with Cluster(n_nodes=4, shared=[tmp_path], slurm=True) as c:
        c.run("n1", ["hostname"])                      # runs inside node n1
        c.run("head", ["srun", "-N", "2", "hostname"])  # SLURM_CONF is passed
        c.kill_node("n2"); c.revive_node("n2")
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self

from enkflow_testing.cluster_mpi import MPIEXEC, mpiexec_prefix, write_launcher
from enkflow_testing.cluster_node import HEAD, IFACE, PRIVATE, Node, NodeSpec, boot, make_switch, private_shared
from enkflow_testing.cluster_ns import NETNS_DIR, PREFIX, STATE_ROOT, ClusterFailed, ClusterUnavailable, delete_netns, missing_reason, sweep_stale
from enkflow_testing.cluster_slurm import ClusterSlurm

_HEAD_INDEX = 254
_LOGIN_INDEX = 200
_SEQUENCE = itertools.count()


def _own_folders() -> list[Path]:
    """The checkout and the interpreter's prefix (its virtual environment) where a node's private ``/tmp`` or
    ``/dev/shm`` would hide them: a clone under ``/tmp`` runs on the nodes too."""
    out: list[Path] = []
    for p in (Path(__file__).resolve().parents[2], Path(sys.prefix).resolve()):
        if any(p == q or q in p.parents for q in PRIVATE) and not any(o == p or o in p.parents for o in out):
            out.append(p)
    return out


_SELF = _own_folders()


class Cluster:
    """``n_nodes`` emulated nodes ``n1``..``nN`` (addresses ``<subnet>.1``..) and a head node; a context manager.

    ``login_nodes``: that many more nodes ``l1``.. (addresses ``<subnet>.201``..)
    that SLURM never schedules on: where a launcher can run and be lost
    without taking SLURM's controller (in ``head``) or a compute node with it.
    ``shared``: folders that must be the same on every node although they lie
    under ``/tmp`` or ``/dev/shm`` (e.g. pytest's ``tmp_path``); everything
    outside those two is shared anyway. ``slurm``: also start SLURM, one
    slurmd per node offering ``cpus_per_node`` CPUs and ``memory_mb`` MiB.
    ``tmp_mb``: size of each node's ``/tmp`` and ``/dev/shm`` tmpfs (MiB).
    ``slurmd_timeout_s``: after how long SLURM marks a killed node down.
    ``startup_s`` holds the measured start-up times (seconds): ``nodes`` and ``slurm``.
    """

    def __init__(self, n_nodes: int = 2, *, login_nodes: int = 0, shared: list[str | os.PathLike[str]] | None = None,
                 slurm: bool = False, cpus_per_node: int = 4, memory_mb: int = 2048, tmp_mb: int = 512, subnet: str = "10.77.0",
                 slurmd_timeout_s: int = 10):
        if not 1 <= n_nodes < _LOGIN_INDEX or not 0 <= login_nodes < _HEAD_INDEX - _LOGIN_INDEX:
            raise ValueError(f"n_nodes must be 1..{_LOGIN_INDEX - 1} and login_nodes 0..{_HEAD_INDEX - _LOGIN_INDEX - 1}"
                             f", not {n_nodes} and {login_nodes}")
        self.prefix = f"{PREFIX}{os.getpid()}c{next(_SEQUENCE)}"  # several clusters may live in one process
        self.names = [f"n{k}" for k in range(1, n_nodes + 1)]
        self.login_names = [f"l{k}" for k in range(1, login_nodes + 1)]
        indices = [(_HEAD_INDEX, HEAD), *enumerate(self.names, 1), *enumerate(self.login_names, _LOGIN_INDEX + 1)]
        self.specs = {name: NodeSpec(name=name, netns=f"{self.prefix}-{name}", index=k, address=f"{subnet}.{k}")
                      for k, name in indices}
        self.switch = f"{self.prefix}-switch"
        # The checkout and its interpreter must be seen by every node too (a clone under /tmp, say).
        given = [Path(p).resolve() for p in shared or []]
        self.shared = given + [p for p in _SELF if p not in given]
        self.tmp_mb = tmp_mb
        self.state = STATE_ROOT / f"{self.prefix}-state"
        self.nodes: dict[str, Node] = {}
        self._hidden: list[Path] = []
        self.slurm: ClusterSlurm | None = None
        self._want_slurm = slurm
        self._slurm_args = dict(cpus=cpus_per_node, memory_mb=memory_mb, slurmd_timeout_s=slurmd_timeout_s)
        self.startup_s: dict[str, float] = {}

    # -- life cycle -------------------------------------------------------------------------------------------------

    def start(self) -> Self:
        """Make the switch, the nodes and (if asked) SLURM; raises :class:`ClusterUnavailable` where it cannot
        run here, :class:`ClusterFailed` where its making failed."""
        reason = missing_reason()
        if reason:
            raise ClusterUnavailable(f"cannot make an emulated cluster: {reason}")
        missing = [str(p) for p in self.shared if not p.is_dir()]
        if missing:
            raise ClusterFailed(f"shared folders must exist before the cluster starts: {', '.join(missing)}")
        sweep_stale()
        atexit.register(self.stop)
        try:
            t0 = time.perf_counter()
            self._make()
            self.startup_s["nodes"] = time.perf_counter() - t0
            if self._want_slurm:
                t0 = time.perf_counter()
                self.slurm = ClusterSlurm(self, **self._slurm_args)  # set first: stop() reaps what it started
                self.slurm.start()
                self.startup_s["slurm"] = time.perf_counter() - t0
        except BaseException:
            self.stop()
            raise
        return self

    def _make(self) -> None:
        self.state.mkdir(mode=0o755)
        self.state.chmod(0o755)  # the munge user must reach its folder inside
        hosts = "127.0.0.1 localhost\n" + "".join(f"{s.address} {s.name}\n" for s in self.specs.values())
        self.hosts_file.write_text(hosts)
        self._hidden = private_shared(self.shared)
        make_switch(self.switch)
        for name in self.specs:
            self.nodes[name] = boot(self.specs[name], self.switch, self._hidden, self.hosts_file, self.tmp_mb)
        write_launcher(self)

    def stop(self) -> None:
        """Remove everything the cluster made: daemons, processes, namespaces, veths, mounts, state folder."""
        atexit.unregister(self.stop)
        # No scancel: every job's processes die with the nodes, SLURM's state with the state folder.
        for node in self.nodes.values():
            node.crash()
        self.nodes.clear()
        if self.slurm is not None:
            self.slurm.reap()
            self.slurm = None
        for spec in self.specs.values():
            delete_netns(spec.netns)
        delete_netns(self.switch)
        shutil.rmtree(self.state, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of this cluster is on the machine: its namespaces and state folder (empty after :meth:`stop`)."""
        left = sorted(p.name for p in NETNS_DIR.glob(f"{self.prefix}-*")) if NETNS_DIR.is_dir() else []
        return left + ([str(self.state)] if self.state.exists() else [])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- nodes ------------------------------------------------------------------------------------------------------

    @property
    def hosts_file(self) -> Path:
        return self.state / "hosts"

    def _spec(self, node: str) -> NodeSpec:
        if node not in self.specs:
            raise KeyError(f"no node {node!r} in this cluster; nodes: {', '.join(self.specs)}")
        return self.specs[node]

    def address(self, node: str) -> str:
        """The node's IPv4 address on the cluster's network."""
        return self._spec(node).address

    def hostname(self, node: str) -> str:
        """The node's hostname (its name; every node's ``/etc/hosts`` resolves it)."""
        return self._spec(node).name

    @property
    def iface(self) -> str:
        """The network interface of every node (``-iface`` for hydra)."""
        return IFACE

    def node(self, node: str) -> Node:
        """The live node (raises if it was killed and not revived)."""
        self._spec(node)
        if node not in self.nodes:
            raise RuntimeError(f"node {node} is down (killed); revive_node({node!r}) brings it back")
        return self.nodes[node]

    def enter(self, node: str, cwd: str | os.PathLike[str] | None = None) -> list[str]:
        """Command prefix that runs a program in the node, in ``cwd`` (default: the caller's working folder)."""
        return [*self.node(node).enter(), "env", "-C", str(cwd or os.getcwd())]

    def environment(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """``env`` (default: this process's) with the cluster's SLURM settings added when SLURM runs."""
        return {**(os.environ if env is None else env), **self.slurm_env()}

    def popen(self, node: str, argv: list[str], **kw: Any) -> subprocess.Popen:
        """``subprocess.Popen`` of ``argv`` inside the node; ``cwd`` and ``env`` are kept (SLURM_CONF added)."""
        prefix = self.enter(node, kw.pop("cwd", None))
        return subprocess.Popen([*prefix, *map(str, argv)], env=self.environment(kw.pop("env", None)), **kw)

    def run(self, node: str, argv: list[str], **kw: Any) -> subprocess.CompletedProcess:
        """``subprocess.run`` of ``argv`` inside the node; as :meth:`popen` otherwise."""
        prefix = self.enter(node, kw.pop("cwd", None))
        return subprocess.run([*prefix, *map(str, argv)], env=self.environment(kw.pop("env", None)), **kw)

    def node_path(self, node: str, path: str | os.PathLike[str]) -> Path:
        """``path`` as the node sees it, readable from this process (``/proc/KEEPER/root/...``): e.g. its /dev/shm."""
        return Path(f"/proc/{self.node(node).keeper}/root") / Path(path).relative_to("/")

    def processes(self, node: str) -> list[int]:
        """Pids of every process in the node's namespaces, its keeper included (empty when it is down)."""
        return self.nodes[node].pids() if node in self.nodes else []

    def kill_node(self, node: str) -> None:
        """A node crash: SIGKILL every process of the node (its slurmd too); its ``/dev/shm`` and ``/tmp`` go."""
        if node == HEAD and self.slurm is not None:
            raise ValueError("the head node holds SLURM's controller and cannot be killed; lose a login node instead")
        self.node(node).crash()
        del self.nodes[node]
        delete_netns(self._spec(node).netns)

    def revive_node(self, node: str) -> None:
        """Bring a killed node back with fresh namespaces, same name and address; SLURM resumes it."""
        if node in self.nodes:
            raise RuntimeError(f"node {node} is up; kill_node({node!r}) first")
        self.nodes[node] = boot(self._spec(node), self.switch, self._hidden, self.hosts_file, self.tmp_mb)
        write_launcher(self)
        if self.slurm is not None and node in self.names:
            self.slurm.revive(node)

    # -- MPI and SLURM ----------------------------------------------------------------------------------------------

    def mpiexec(self, hosts: list[str], n: int, ppn: int | None = None) -> list[str]:
        """The hydra ``mpiexec`` prefix that starts ``n`` ranks on ``hosts`` (node names); run it inside a node."""
        return mpiexec_prefix(self, [self.address(h) for h in hosts], n, ppn)

    @property
    def mpiexec_bin(self) -> Path:
        """The mpich wheel's ``mpiexec`` (inside a SLURM job it finds the allocation's nodes by itself)."""
        return MPIEXEC

    def slurm_env(self) -> dict[str, str]:
        """What SLURM's clients need in their environment (``SLURM_CONF``); empty without SLURM."""
        return self.slurm.env() if self.slurm is not None else {}
