"""A shared-memory ring between one sender and one writer on the same node: notices and bytes.

The file (in /dev/shm, or the temporary directory) holds three parts::

    header   one page: published (u64, notices the sender has written), consumed (u64, notices
             the writer has finished with), told (u64, ZeroMQ messages the writer has sent this
             sender: while it equals what the sender has received, an add need not look at its socket)
    notices  NOTICE_SLOTS slots of NOTICE_BYTES: u32 length + the JSON metadata of one piece
    data     the bytes of the pieces, allocated contiguously in FIFO order

The sender copies an array into a data slot, writes its notice, then bumps ``published``; the
writer reads notices up to ``published``, writes each piece straight from the data slot (no
copy) and bumps ``consumed``, which frees the oldest slots. Neither side makes a system call
per piece: the sender does not wake the writer (it looks for work every few milliseconds), so
a model on a crowded node is not preempted by its own output. The order of the stores (data,
notice, counter) is what the reader sees on x86-64 (total store order); elsewhere the
notices go through ZeroMQ instead (:func:`queue_supported`). The sender unlinks the file as
soon as the writer has mapped it, so a ``kill -9`` of either leaves nothing behind.
"""

from __future__ import annotations

import mmap
import os
import platform
import struct
from collections import deque

import numpy as np

from enkflow.shm_names import new_segment

HEADER_BYTES = 4096
NOTICE_SLOTS = 1024
NOTICE_BYTES = 1024


def queue_supported() -> bool:
    """Whether the counters may be published by plain stores (x86-64's total store order)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def unmap(mapping: mmap.mmap, owner: object, *views: str) -> None:
    """Close ``mapping`` once ``owner``'s arrays over it (the attributes ``views``) are gone: mmap.close
    refuses while one lives. Where another view still lives (an array in flight), the mapping goes with
    the process. Nothing of ``owner``'s mapping may be used afterwards; a second call does nothing more."""
    for name in views:
        vars(owner).pop(name, None)
    try:
        mapping.close()
    except BufferError:
        pass


class Ring:
    """The sender's side: ``alloc(n)`` -> data offset or None (full); ``publish(notice)``; ``consumed()``
    and ``free_oldest()`` as the writer finishes pieces."""

    def __init__(self, nbytes: int) -> None:
        self.size = int(nbytes)
        total = HEADER_BYTES + NOTICE_SLOTS * NOTICE_BYTES + self.size
        self.path = new_segment("output")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, total)
            self._map = mmap.mmap(fd, total)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        whole = np.frombuffer(self._map, dtype=np.uint8)
        # Touch every page now: the first write to a page of shared memory faults, which would
        # otherwise double the cost of each add until the ring has wrapped once.
        whole[:: mmap.PAGESIZE] = 0
        self._counters = whole[:24].view(np.uint64)
        self.buf = whole[HEADER_BYTES + NOTICE_SLOTS * NOTICE_BYTES :]
        self._slots: deque[tuple[int, int]] = deque()  # (offset, bytes reserved)
        self._head = 0
        self.published = 0

    def unlink(self) -> None:
        """Remove the name (both sides keep their mappings)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def alloc(self, n: int) -> int | None:
        """Offset of ``n`` free contiguous data bytes, or None while the ring is too full."""
        if n > self.size:
            raise ValueError(f"{n} bytes do not fit a ring of {self.size}")
        n = max(n, 1)
        if not self._slots:
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

    def notice_room(self) -> bool:
        return self.published - self.consumed() < NOTICE_SLOTS

    def publish(self, notice: bytes) -> int:
        """Write the next notice and make it (and the data it names) visible; returns its number (1, 2, ...)."""
        if len(notice) > NOTICE_BYTES - 4:
            raise ValueError(f"a notice of {len(notice)} bytes, more than {NOTICE_BYTES - 4}")
        at = HEADER_BYTES + (self.published % NOTICE_SLOTS) * NOTICE_BYTES
        struct.pack_into("<I", self._map, at, len(notice))
        self._map[at + 4 : at + 4 + len(notice)] = notice
        self.published += 1
        self._counters[0] = self.published  # last: the writer reads nothing before it sees this
        return self.published

    def consumed(self) -> int:
        return int(self._counters[1])

    def told(self) -> int:
        return int(self._counters[2])

    @property
    def in_use(self) -> int:
        """Data slots allocated and not yet freed."""
        return len(self._slots)

    def close(self) -> None:
        self.unlink()
        unmap(self._map, self, "buf", "_counters")


class RingView:
    """The writer's side: ``pending()`` yields (number, notice) not yet consumed; ``view(offset, n)`` is
    a zero-copy slice of the data; ``consume(number)`` frees everything up to that notice."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            total = os.fstat(fd).st_size
            self._map = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        whole = np.frombuffer(self._map, dtype=np.uint8)
        self._counters = whole[:24].view(np.uint64)
        self._notices = whole[HEADER_BYTES : HEADER_BYTES + NOTICE_SLOTS * NOTICE_BYTES].reshape(NOTICE_SLOTS, NOTICE_BYTES)
        self.buf = whole[HEADER_BYTES + NOTICE_SLOTS * NOTICE_BYTES :]
        self.read = int(self._counters[1])

    def published(self) -> int:
        return int(self._counters[0])

    def next(self) -> tuple[int, bytes] | None:
        """The next unread notice (number, bytes), or None."""
        if self.read >= self.published():
            return None
        slot = self._notices[self.read % NOTICE_SLOTS]
        (n,) = struct.unpack("<I", slot[:4].tobytes())
        self.read += 1
        return self.read, slot[4 : 4 + n].tobytes()

    def consume(self, number: int) -> None:
        self._counters[1] = number

    def tell(self) -> None:
        """Count one more message sent to this ring's sender (after it is sent)."""
        self._counters[2] = self._counters[2] + 1

    def view(self, offset: int, n: int) -> np.ndarray:
        return self.buf[offset : offset + n]
