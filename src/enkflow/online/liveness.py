"""Every server rank's sign of life on the shared file system, which the launcher watches.

Inside the analysis the server's ranks wait in MPI collectives, and the bus's heartbeats
(:mod:`enkflow.online.bus`) are not exchanged: a rank whose node went silent (powered off, its
network cut, its processes stopped) without closing its connections is noticed neither by the MPI
library nor by mpiexec, and the other ranks would wait for ever (under SLURM the node is declared
down and the job ended; outside SLURM nothing would end it). So each rank of a server of several
ranks keeps a file ``EXPDIR/online/alive/rank_RRRR`` (holding its node's name) whose modification
time a background thread renews every ``period_s`` seconds, in every phase (the thread runs while
the main thread waits in MPI, ctypes or NumPy, which release the interpreter lock). The launcher,
which holds the run's lease, cancels a server one of whose files has not changed for ``limit_s``
seconds of its own clock (:class:`AliveWatch`; no clock shared between nodes is assumed) and
restarts it, as for a rank lost on the bus.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from enkflow.fsutil import write_bytes_atomic


class AliveFile:
    """This rank's file in ``directory``, renewed every ``period_s`` s by a thread until :meth:`close`."""

    def __init__(self, directory: Path, rank: int, node: str, period_s: float):
        directory.mkdir(parents=True, exist_ok=True)
        self.path, self.period_s = directory / f"rank_{rank:04d}", period_s
        write_bytes_atomic(self.path, node.encode(), durable=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"enkflow-alive-{rank}", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                os.utime(self.path)
            except OSError:
                pass  # the file system is gone from this node: the launcher sees the file stop changing

    def close(self) -> None:
        """Stop renewing and remove the file (this rank ended: nothing for the launcher to watch)."""
        self._stop.set()
        self._thread.join()
        self.path.unlink(missing_ok=True)


@dataclass
class _Seen:
    mtime_ns: int  # the file's modification time when last looked at
    since: float  # the watcher's clock (s) when it last changed


@dataclass(frozen=True)
class SilentRank:
    rank: int
    node: str


class AliveWatch:
    """The launcher's view of the ranks' files in ``directory``: which stopped changing for ``limit_s``
    s; it looks at most every ``every_s`` s (each look reads every rank's file)."""

    def __init__(self, directory: Path, limit_s: float, every_s: float):
        self.dir, self.limit_s, self.every_s = directory, limit_s, every_s
        self._seen: dict[Path, _Seen] = {}
        self._looked = float("-inf")

    def reset(self) -> None:
        """Before a server starts: the files of the one before are gone."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self._seen.clear()
        self._looked = float("-inf")

    def silent(self, now: float) -> list[SilentRank]:
        """The ranks whose file has not changed for longer than the limit (``now``: the watcher's
        monotonic clock, s); a file seen for the first time starts its clock."""
        if now - self._looked < self.every_s:
            return []
        self._looked = now
        out = []
        for p in sorted(self.dir.glob("rank_*")):
            try:
                mtime = p.stat().st_mtime_ns
                node = p.read_text().strip()
            except OSError:
                continue  # being replaced, or removed
            seen = self._seen.get(p)
            if seen is None or seen.mtime_ns != mtime:
                self._seen[p] = _Seen(mtime, now)
            elif now - seen.since > self.limit_s:
                out.append(SilentRank(int(p.name.removeprefix("rank_")), node))
        return out


def alive_period(rank_timeout_s: float) -> float:
    """How often a rank renews its file (s): a quarter of ``[online] rank_timeout``."""
    return rank_timeout_s / 4


def alive_limit(rank_timeout_s: float) -> float:
    """How long the launcher lets a rank's file stand still (s): twice ``[online] rank_timeout``, so that
    in a forecast phase the bus (which judges within ``rank_timeout``) notices first, and a file
    system slow to show another node's update is not taken for a lost node."""
    return 2 * rank_timeout_s
