"""Hold a running offline analysis right after its update's commit, so that a trial can lose its node there.

The commit is the ``rename`` of the commit marker into place (the marker beside the first member file,
named from the member paths: :func:`enkflow.io.wal.marker_path`), made by rank 0; only then are the
member files touched: replaced by their shadows (``link`` of each member file to its spare, then the
``rename`` of the shadow over it; :mod:`enkflow.io.shadow`, the default) or written in place (the
write-ahead log). :class:`AnalysisBarrier` finds the ranks of one cycle's analysis (``python -m
enkflow.experiment.analysis_task EXPDIR CYCLE``, rank from ``PMI_RANK``) and attaches strace to rank 0,
which sends it SIGSTOP at its first ``link`` or write of a member file (``-P`` on the member files:
strace 6.1 matches only the first path of a ``rename``, and the marker's temporary name holds a thread
id, so the rename itself cannot be picked out). The cluster's nodes share the machine's PID namespace,
so the harness traces from outside. :func:`phase` says where an update stands.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from enkflow_testing.faults import strace_path

if TYPE_CHECKING:
    from enkflow_testing.cluster import Cluster

WRITES = "write,pwrite64,writev,pwritev,pwritev2,link,linkat"  # a member file's first change after the commit
MODULE = "enkflow.experiment.analysis_task"


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _rank(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    rank = next((v[len(b"PMI_RANK="):] for v in env if v.startswith(b"PMI_RANK=")), None)
    return int(rank) if rank is not None else None


def _state(pid: int) -> str:
    """The process's state letter (``R``, ``S``, ``T`` stopped, ``t`` tracing stop...); ``""`` once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


class Phase(StrEnum):
    BEFORE_COMMIT = "before its commit"
    COMMITTED = "after its commit"
    APPLIED = "after its update"


def phase(study: Path, files: list[Path], cycle: int) -> Phase:
    """Where ``cycle``'s update of the member ``files`` stands: its commit marker not yet there, there, or
    gone with the cycle's completion record (``analysis_applied.json``) written."""
    from enkflow.io.wal import marker_path

    if (study / "run" / "cycles" / f"{cycle:04d}" / "analysis_applied.json").exists():
        return Phase.APPLIED
    return Phase.COMMITTED if marker_path([str(f) for f in files]).exists() else Phase.BEFORE_COMMIT


class AnalysisBarrier:
    """The barrier after ``cycle``'s analysis commit of the study in ``study`` (restarts ``members/``)."""

    def __init__(self, c: "Cluster", study: Path, members: int, cycle: int):
        self.c, self.study, self.cycle = c, study, cycle
        self.files = [study / "members" / f"member_{m:04d}.nc" for m in range(1, members + 1)]
        self.ranks: dict[int, int] = {}  # rank -> pid
        self.tracer: subprocess.Popen | None = None
        self.note = ""
        self._stopped_since: float | None = None

    def _find(self) -> None:
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                argv = _argv(int(d.name))
                if argv[1:3] == ["-m", MODULE] and argv[-1] == str(self.cycle) and str(self.study) in argv[-2]:
                    rank = _rank(int(d.name))
                    if rank is not None:
                        self.ranks.setdefault(rank, int(d.name))

    def node_of(self, pid: int) -> str | None:
        return next((n for n in list(self.c.nodes) if pid in self.c.processes(n)), None)

    def ranks_nodes(self) -> dict[int, str] | None:
        """Once both ranks run, {rank: node}; None before (poll it)."""
        self._find()
        if len(self.ranks) < 2:
            return None
        nodes = {rank: self.node_of(pid) for rank, pid in self.ranks.items()}
        return {r: n for r, n in nodes.items() if n is not None} or None

    def attach(self) -> dict[int, str] | None:
        """Once both ranks run: strace on rank 0, then {rank: node}; None before (poll it)."""
        nodes = self.ranks_nodes()
        if nodes and self.tracer is None:
            paths = [a for f in self.files for a in ("-P", str(f))]
            self.tracer = subprocess.Popen(
                [strace_path() or "strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={WRITES}", *paths,
                 "-e", f"inject={WRITES}:signal=SIGSTOP:when=1", "-p", str(self.ranks[0])],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if phase(self.study, self.files, self.cycle) is not Phase.BEFORE_COMMIT:
                self.note = "(the commit was made before strace attached)"
        return nodes

    def stopped(self) -> bool:
        """Rank 0 has been stopped at the barrier (and stays stopped) for 0.1 s."""
        stopped = _state(self.ranks[0]) in ("T", "t") and phase(self.study, self.files, self.cycle) is Phase.COMMITTED
        if not stopped:
            self._stopped_since = None
            return False
        self._stopped_since = self._stopped_since or time.monotonic()
        return time.monotonic() - self._stopped_since >= 0.1

    def is_stopped(self) -> bool:
        return self._stopped_since is not None and _state(self.ranks.get(0, -1)) in ("T", "t")

    def release(self) -> None:
        """Detach strace (SIGTERM: it detaches cleanly) and let rank 0 go on, if it still lives."""
        if self.tracer is not None:
            self.tracer.terminate()
            try:
                self.tracer.wait(timeout=5)
            except subprocess.TimeoutExpired:  # a detach from a stopped tracee can wait for ever (a trial hung)
                self._resume_rank_0()
                try:
                    self.tracer.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.tracer.kill()
                    self.tracer.wait()
            self.tracer = None
        self._resume_rank_0()

    def _resume_rank_0(self) -> None:
        if 0 in self.ranks and _state(self.ranks[0]):
            try:
                os.kill(self.ranks[0], signal.SIGCONT)
            except ProcessLookupError:
                pass
