"""The names enkflow gives its shared-memory segments on a node, and removing those a dead process left.

A segment (an output ring, a progress page, an online server's store or task slot) is named
``enkflow-KIND-PID-HEX`` in ``/dev/shm`` (or the temporary directory where there is none), PID being
its maker's. The maker removes the name at its
end, and its partner when the maker is killed; a process tree killed at once (``kill -9`` of a job,
a lapsed lease) leaves names behind. Every process of a study that runs on a node removes them: a new
segment's maker, a runner, a pilot at its start and end, the launcher at a run's start and end.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from pathlib import Path

_SEGMENT = re.compile(r"enkflow-(?:output|output-beat|online)-(\d+)-[0-9a-f]{8}")  # group 1: the maker's pid


def shm_dir() -> Path:
    """Where segments live: ``/dev/shm`` where it is writable, else the temporary directory."""
    d = Path("/dev/shm")
    return d if d.is_dir() and os.access(d, os.W_OK) else Path(tempfile.gettempdir())


def maker_pid(name: str) -> int | None:
    """The pid of the process that made the segment named ``name``; None for a name not enkflow's."""
    named = _SEGMENT.fullmatch(name)
    return int(named[1]) if named else None


def remove_dead_segments() -> list[Path]:
    """Remove the names of this node's segments whose maker is dead; returns them. A dead maker's
    segment is no longer opened by name: its partner has it mapped, and no new one is told of it."""
    removed = []
    for p in shm_dir().glob("enkflow-*"):
        pid = maker_pid(p.name)
        if pid is not None and not Path(f"/proc/{pid}").exists():
            try:
                p.unlink()
                removed.append(p)
            except OSError:  # removed meanwhile, or another user's
                pass
    return removed


def live_makers() -> list[int]:
    """The pids of the live makers of this node's segments (each once)."""
    pids = {maker_pid(p.name) for p in shm_dir().glob("enkflow-*")}
    return sorted(pid for pid in pids if pid is not None and Path(f"/proc/{pid}").exists())


def new_segment(kind: str) -> Path:
    """The name of a new shared-memory segment of this process (``kind``: ``output`` a ring,
    ``output-beat`` a progress page, ``online`` a server's store or slot), after :func:`remove_dead_segments`."""
    remove_dead_segments()
    return shm_dir() / f"enkflow-{kind}-{os.getpid()}-{secrets.token_hex(4)}"
