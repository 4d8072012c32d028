"""A shared-memory ring of bytes between one sender and one writer on the same node.

The sender allocates contiguous slots in FIFO order and copies arrays into them; the writer
reads each slot in place (no copy) and acknowledges it; acknowledgements arrive in the order
of the allocations, so freeing is popping the oldest slot. The ring is a file in /dev/shm
(or the temporary directory) that both map; the sender unlinks it as soon as the writer has
mapped it, so a ``kill -9`` of either leaves nothing behind.
"""

from __future__ import annotations

import mmap
import os
import secrets
import tempfile
from collections import deque
from pathlib import Path

import numpy as np


def _shm_dir() -> Path:
    d = Path("/dev/shm")
    return d if d.is_dir() and os.access(d, os.W_OK) else Path(tempfile.gettempdir())


class Ring:
    """The sender's side: ``alloc(n)`` -> offset or None (full); ``free_oldest()`` after each acknowledgement."""

    def __init__(self, nbytes: int) -> None:
        self.size = int(nbytes)
        self.path = _shm_dir() / f"enkflow-output-{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, self.size)
            self._map = mmap.mmap(fd, self.size)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        self.buf = np.frombuffer(self._map, dtype=np.uint8)
        # Touch every page now: the first write to a page of shared memory faults, which would
        # otherwise double the cost of each add until the ring has wrapped once.
        self.buf[:: mmap.PAGESIZE] = 0
        self._slots: deque[tuple[int, int]] = deque()  # (offset, bytes reserved incl. a skipped tail)
        self._head = 0

    def unlink(self) -> None:
        """Remove the name (both sides keep their mappings)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def alloc(self, n: int) -> int | None:
        """Offset of ``n`` free contiguous bytes, or None while the ring is too full."""
        if n > self.size:
            raise ValueError(f"{n} bytes do not fit a ring of {self.size}")
        n = max(n, 1)
        if not self._slots:
            self._head = 0
            self._slots.append((0, n))
            self._head = n
            return 0
        tail, head = self._slots[0][0], self._head
        if head > tail:  # free: [head, size) and [0, tail)
            if head + n <= self.size:
                at = head
            elif n <= tail:  # wrap: the end segment is skipped until this slot is freed
                at = 0
            else:
                return None
        elif head + n <= tail:  # wrapped: free is [head, tail)
            at = head
        else:
            return None
        self._slots.append((at, n))
        self._head = at + n
        return at

    def free_oldest(self) -> None:
        self._slots.popleft()

    @property
    def in_use(self) -> int:
        """Slots allocated and not yet acknowledged."""
        return len(self._slots)

    def close(self) -> None:
        self.unlink()
        self.buf = None  # type: ignore[assignment]
        try:
            self._map.close()
        except BufferError:  # a view is still alive (an array in flight); the mapping goes with the process
            pass


class RingView:
    """The writer's side: the sender's ring mapped read-only; ``view(offset, n)`` is a zero-copy slice."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.buf = np.frombuffer(self._map, dtype=np.uint8)

    def view(self, offset: int, n: int) -> np.ndarray:
        return self.buf[offset : offset + n]
