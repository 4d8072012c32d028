"""Leaving an MPI program at once, without ``MPI_Finalize``; the shared memory of a node's ranks.

A rank that meets an error while the others may wait for it in a collective cannot finalize (that
waits for every rank): it exits, and the MPI launcher ends the others. ``MPI_Finalize`` is also what
removes the names of the shared-memory segments the ranks of a node share (the mpich wheel's
``/dev/shm/mpich_shm_*``): :func:`~enkflow.parallel.comm.get_comm` removes them as soon as every rank
has mapped them, so no way out (this one, a kill) leaves them in the node's memory until reboot.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

SHM = Path("/dev/shm")


def mapped_shm_names(maps: Path = Path("/proc/self/maps")) -> list[Path]:
    """The ``/dev/shm`` files this process maps that still have a name (the kernel marks the unlinked
    ones ``(deleted)``), in order of first mapping."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:  # not Linux: nothing to find
        return []
    names: list[Path] = []
    for line in lines:
        fields = line.split(maxsplit=5)
        path = Path(fields[5]) if len(fields) == 6 and not fields[5].endswith("(deleted)") else None
        if path is not None and path.parent == SHM and path not in names:
            names.append(path)
    return names


def leave(rc: int) -> NoReturn:
    """End this process now with exit status ``rc``, without ``MPI_Finalize`` (its output flushed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
