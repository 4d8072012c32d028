"""A real SLURM across the emulated nodes: munged and slurmctld in the head node, one slurmd per node.

Each network namespace has its own ports, so every daemon listens on SLURM's
usual ports (6817, 6818) without meeting the machine's own. The munge daemon
is private to the cluster (its key and socket under the state folder,
``AuthInfo=socket=...``), so nothing depends on a munged of the machine. The
slurmd of each node keeps its spool, pid and log under ``slurm/`` with the
node's name (``%n``). Clients (``sbatch``, ``srun``, ``squeue``, ``scancel``)
must run inside a node: the machine's own namespace cannot reach the bridge.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Self

from enkflow.errors import EnkflowError
from enkflow_testing.localslurm import DAEMON_SETTINGS, ensure_installed, missing_reason
from enkflow_testing.munge import install_key, own, start_munged
from enkflow_testing.cluster_node import HEAD
from enkflow_testing.cluster_ns import ClusterUnavailable

if TYPE_CHECKING:
    from enkflow_testing.cluster import Cluster

CTLD_PORT = 6817
SLURMD_PORT = 6818


class ClusterSlurm:
    """SLURM on a :class:`~enkflow_testing.cluster.Cluster`; nodes offer ``cpus`` CPUs and ``memory_mb`` MiB each."""

    def __init__(self, cluster: "Cluster", *, cpus: int, memory_mb: int, slurmd_timeout_s: int):
        self.cluster = cluster
        self.cpus = cpus
        self.memory_mb = memory_mb
        self.slurmd_timeout_s = slurmd_timeout_s
        self.dir = cluster.state / "slurm"
        self.conf = self.dir / "slurm.conf"
        self.munge_dir = self.dir / "munge"
        self.socket = self.munge_dir / "munge.socket"
        self._daemons: dict[str, subprocess.Popen] = {}

    def config_text(self) -> str:
        c, d = self.cluster, self.dir
        nodes = ",".join(c.names)
        return "\n".join([
            "ClusterName=enkbox",
            f"SlurmctldHost={HEAD}({c.address(HEAD)})",
            f"SlurmctldPort={CTLD_PORT}",
            f"SlurmdPort={SLURMD_PORT}",
            f"AuthInfo=socket={self.socket}",
            *DAEMON_SETTINGS,
            f"SlurmdTimeout={self.slurmd_timeout_s}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/slurmctld.log",
            f"SlurmdLogFile={d}/slurmd-%n.log",
            *(f"NodeName={n} NodeAddr={c.address(n)} NodeHostname={c.hostname(n)} CPUs={self.cpus} "
              f"RealMemory={self.memory_mb} State=UNKNOWN" for n in c.names),
            f"PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP",
            "",
        ])

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def start(self) -> Self:
        """Start munged, slurmctld and every slurmd; wait until every node is idle (at most 60 s)."""
        reason = missing_reason()
        if reason:
            raise ClusterUnavailable(f"cannot start SLURM on the emulated cluster: {reason}")
        try:
            ensure_installed()
        except EnkflowError as exc:  # slurm-wlm cannot be had here (no package source): nothing to test with
            raise ClusterUnavailable(f"cannot start SLURM on the emulated cluster: {exc}") from None
        for sub in ("state", *(f"spool/{n}" for n in self.cluster.names)):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(self.config_text())
        self._start_munge()
        self._daemons[HEAD] = self._daemon(HEAD, ["slurmctld", "-D", "-c", "-i", "-f", str(self.conf)])
        self._wait(lambda: "UP" in self._client(["scontrol", "ping"]), "slurmctld did not answer 'scontrol ping'")
        for name in self.cluster.names:
            self._start_slurmd(name)
        self._wait(lambda: self._states() == {n: "idle" for n in self.cluster.names}, "the nodes did not become idle")
        return self

    def _start_munge(self) -> None:
        own([self.munge_dir])
        self.munge_dir.chmod(0o755)  # munged wants its socket reachable by all
        key = self.munge_dir / "munge.key"
        install_key(key)
        m = self.munge_dir
        options = [f"--key-file={key}", f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log",
                   f"--seed-file={m}/munged.seed"]
        self._daemons["munged"] = start_munged(options, self.socket, self.cluster.enter(HEAD, m), m / "stderr")

    def _daemon(self, node: str, argv: list[str]) -> subprocess.Popen:
        with open(self.dir / f"{argv[0]}-{node}.stdout", "ab") as log:
            return self.cluster.popen(node, argv, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)

    def _start_slurmd(self, node: str) -> None:
        old = self._daemons.get(node)
        if old is not None:
            old.wait()  # killed with its node: reap it
        self._daemons[node] = self._daemon(node, ["slurmd", "-D", "-N", node, "-f", str(self.conf)])

    def _client(self, argv: list[str]) -> str:
        # The cluster passes SLURM_CONF only once start() has returned; the daemons' clients need it now.
        res = self.cluster.run(HEAD, argv, env={**os.environ, **self.env()}, capture_output=True, text=True, timeout=60)
        return res.stdout

    def _states(self) -> dict[str, str]:
        """SLURM's state of every node (``idle``, ``down*``, ...)."""
        rows = (line.split() for line in self._client(["sinfo", "-h", "-N", "-o", "%N %T"]).splitlines())
        return {r[0]: r[1] for r in rows if len(r) == 2}

    def _wait(self, ok: Callable[[], bool], message: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ok():
                return
            time.sleep(0.2)
        logs = ""
        for path in sorted(self.dir.glob("*.log")):
            logs += f"\n--- {path.name}:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-10:])
        raise EnkflowError(f"emulated cluster's SLURM: {message} within {timeout_s:.0f} s{logs}")

    def wait_idle(self, node: str, timeout_s: float = 60.0) -> None:
        """Wait until SLURM reports the node idle (after a revive)."""
        self._wait(lambda: self._states().get(node) == "idle", f"node {node} did not become idle", timeout_s)

    def revive(self, node: str) -> None:
        """Start the node's slurmd again; returns when SLURM has the node idle.

        The node is first set DOWN, as the controller would after ``SlurmdTimeout``
        (its jobs died with it): a new slurmd's registration then returns it to
        service (``ReturnToService=2``), a change that can be waited for.
        """
        self._client(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=revived"])
        self._wait(lambda: "down" in self._states().get(node, ""), f"node {node} was not set down")
        self._start_slurmd(node)
        self.wait_idle(node)

    def sbatch(self, args: list[str], node: str = HEAD, cwd: Path | None = None) -> str:
        """Submit a batch job from ``node`` (``sbatch --parsable ARGS``, in ``cwd``); returns its job id."""
        res = self.cluster.run(node, ["sbatch", "--parsable", *args], cwd=cwd, env={**os.environ, **self.env()},
                               capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise EnkflowError(f"sbatch {' '.join(args)} on {node} failed: {res.stderr.strip()}")
        return res.stdout.strip().split(";")[0]

    def job_state(self, job: str) -> str:
        """The job's state (``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``...); ``""`` once SLURM forgot it."""
        fields = self._client(["scontrol", "show", "job", job, "-o"]).split()
        return next((f.split("=", 1)[1] for f in fields if f.startswith("JobState=")), "")

    def wait_job(self, job: str, timeout_s: float = 120.0) -> str:
        """Wait until the job has ended; returns its final state (SLURM keeps it ``MinJobAge`` = 30 s)."""
        ended: list[str] = []

        def done() -> bool:
            state = self.job_state(job)
            ended[:] = [state]
            return state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED")

        self._wait(done, f"job {job} did not end", timeout_s)
        return ended[0]

    def reap(self) -> None:
        """Collect the daemons' exit statuses once the cluster has killed every node's processes."""
        for proc in self._daemons.values():
            proc.wait()
        self._daemons.clear()

    @property
    def log_dir(self) -> Path:
        """Where the daemons' logs are (``slurmctld.log``, ``slurmd-<node>.log``, ``munge/munged.log``)."""
        return self.dir
