"""MPI across the emulated nodes: the mpich wheel's hydra with a launcher script that stands in for ssh.

Hydra's ssh launcher calls ``SCRIPT [options] HOST COMMAND...``; the script
skips the options, looks HOST (an address or a node name) up in the cluster's
node table and runs COMMAND in that node's namespaces with ``nsenter``.
``-iface eth0`` makes the proxies connect back over the emulated network.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from enkflow_testing.cluster import Cluster

MPIEXEC = Path(sys.executable).parent / "mpiexec"

_SCRIPT = """#!/bin/sh
# hydra calls: {name} [options] HOST COMMAND...; enters HOST's emulated node instead of ssh.
while [ $# -gt 0 ] && [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
pid=$(awk -v h="$host" '$1 == h || $2 == h {{ print $3 }}' {table})
if [ -z "$pid" ]; then echo "{name}: $host is no live emulated node (see {table})" >&2; exit 255; fi
exec nsenter -t "$pid" -n -u -m -- sh -c "$*"
"""


def launcher_path(cluster: "Cluster") -> Path:
    return cluster.state / "hydra-launch"


def write_launcher(cluster: "Cluster") -> None:
    """Write the node table (``address name keeper-pid`` per live node) and the launcher script."""
    table = cluster.state / "nodes"
    rows = "".join(f"{n.spec.address} {n.spec.name} {n.keeper}\n" for n in cluster.nodes.values())
    tmp = table.with_suffix(".new")
    tmp.write_text(rows)
    os.replace(tmp, table)  # a launch reading it meanwhile sees the old or the new table, never half
    script = launcher_path(cluster)
    script.write_text(_SCRIPT.format(name=script.name, table=table))
    script.chmod(0o755)


def mpiexec_prefix(cluster: "Cluster", addresses: list[str], n: int, ppn: int | None) -> list[str]:
    """``mpiexec`` with the launcher script, the hosts by address and the nodes' interface."""
    if not MPIEXEC.exists():
        raise FileNotFoundError(f"no mpiexec next to {sys.executable}: install the 'mpich' wheel")
    argv = [str(MPIEXEC), "-launcher", "ssh", "-launcher-exec", str(launcher_path(cluster)),
            "-hosts", ",".join(addresses), "-iface", cluster.iface, "-n", str(n)]
    return argv + (["-ppn", str(ppn)] if ppn else [])
