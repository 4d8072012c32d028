"""Linux namespaces for the emulated cluster: find, kill and sweep what the harness made.

Every network namespace the harness makes is named ``enkc<pid>c<n>-<node>``, where
``<pid>`` is the process that made it; :func:`sweep_stale` removes those whose
maker is dead (a harness killed before its cleanup ran). A process belongs to
a node when it shares the node's network, UTS or mount namespace, which is how
:func:`pids_in` finds a node's processes without any bookkeeping.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from enkflow.errors import EnkflowError
from enkflow.fsutil import pid_alive

PREFIX = "enkc"
NETNS_DIR = Path("/run/netns")
STATE_ROOT = Path("/var/tmp")
TOOLS = ("ip", "unshare", "nsenter", "mount", "hostname", "env")
_STALE = re.compile(rf"^{PREFIX}(\d+)c\d+-")


class ClusterUnavailable(EnkflowError):
    """The emulated cluster cannot be made here (no root, a tool or slurm-wlm missing); the message
    says why, and tests skip with it."""


class ClusterFailed(EnkflowError):
    """The emulated cluster could be made here but its making failed (a set-up command, a node or a
    daemon that did not start): a defect, and tests fail with it."""


def missing_reason() -> str | None:
    """Why namespaces cannot be made here (None when they can): root and the util-linux/iproute2 tools."""
    if os.name != "posix" or os.geteuid() != 0:
        return "needs root (network, UTS and mount namespaces)"
    absent = [t for t in TOOLS if not shutil.which(t, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin")]
    if absent:
        return f"needs the commands {', '.join(absent)} (iproute2, util-linux, coreutils)"
    return None


def sh(argv: list[str], what: str) -> str:
    """Run a set-up command; a failure raises with its message (stdout returned)."""
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise ClusterFailed(f"{what}: {' '.join(argv)} failed: {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout


@dataclass(frozen=True, kw_only=True)
class NodeNamespaces:
    """A node's namespace identities, as ``/proc/PID/ns/*`` links read (``net:[4026532177]``)."""

    net: str
    uts: str
    mnt: str

    @classmethod
    def of(cls, pid: int) -> "NodeNamespaces":
        return cls(**{kind: os.readlink(f"/proc/{pid}/ns/{kind}") for kind in ("net", "uts", "mnt")})


def netns_id(name: str) -> str:
    """The ``net:[inode]`` identity of a named network namespace (its bind mount under /run/netns)."""
    return f"net:[{os.stat(NETNS_DIR / name).st_ino}]"


def _ns_of(pid: str, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:  # gone meanwhile, or a kernel thread
        return None


def pids_in(ns: NodeNamespaces) -> list[int]:
    """Every live process in any of the node's namespaces (the caller's own process never is)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        if _ns_of(pid, "net") == ns.net or _ns_of(pid, "uts") == ns.uts or _ns_of(pid, "mnt") == ns.mnt:
            found.append(int(pid))
    return found


def kill_all(ns: NodeNamespaces, timeout_s: float = 10.0) -> None:
    """SIGKILL every process of the node until none is left (children forked meanwhile included)."""
    deadline = time.monotonic() + timeout_s
    while pids := pids_in(ns):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise EnkflowError(f"processes {pids} of the node survive SIGKILL after {timeout_s:.0f} s")
        time.sleep(0.02)


def delete_netns(name: str) -> None:
    """Kill what is left in a named network namespace, then delete it (its veth ends go with it)."""
    if not (NETNS_DIR / name).exists():
        return
    net = netns_id(name)
    kill_all(NodeNamespaces(net=net, uts=net, mnt=net))
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)


def sweep_stale() -> list[str]:
    """Remove the namespaces and state folders of clusters whose maker is dead; returns the names removed."""
    names = sorted(p.name for p in NETNS_DIR.glob(f"{PREFIX}*")) if NETNS_DIR.is_dir() else []
    removed = []
    for name in names:
        m = _STALE.match(name)
        if m and not pid_alive(int(m.group(1))):
            delete_netns(name)
            removed.append(name)
    for d in STATE_ROOT.glob(f"{PREFIX}*-state"):
        m = _STALE.match(d.name)
        if m and not pid_alive(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)
    return removed
