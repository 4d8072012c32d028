"""Shared-memory segments of the online data plane: the server rank's store and its task slots.

A runner on the server's node exchanges member states through these files in
``/dev/shm`` instead of its TCP connection: it copies a member's state out of
the server rank's *store segment* and its forecast into the task's *slot
segment*, and only a small notification (GET_SLOT, SLOT, PUT_SLOT) goes over
the data socket (:mod:`enkflow.online.wire`). Both kinds are
``shm_dir()/enkflow-online-PID-HEX8`` (:func:`enkflow.shm_names.new_segment`),
mode 0600 (no other user can open them), a 4096-byte header page then the data,
each field's region 4096-aligned. The header, little-endian::

    magic    8s   b"ENKFSTOR" (store) or b"ENKFSLOT" (slot)
    version  u32  SEGMENT_VERSION
    pad      u32
    nonce    16s  random, one per server rank incarnation, the same in its store and its slots
    epoch    u64  the server's incarnation (as in the wire header)

The server unlinks its segments on every exit path; a killed server's names
are removed by the next process of the study on the node
(:func:`enkflow.shm_names.remove_dead_segments`).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from enkflow.online.wire import ProtocolError
from enkflow.shm_names import maker_pid, new_segment, shm_dir

STORE_MAGIC = b"ENKFSTOR"
SLOT_MAGIC = b"ENKFSLOT"
SEGMENT_VERSION = 1
HEADER_BYTES = 4096
ALIGN = 4096
_HEADER = "<8sII16sQ"


@dataclass(frozen=True)
class SegmentHeader:
    """A segment's first bytes; ``nonce`` 16 bytes."""

    magic: bytes
    nonce: bytes
    epoch: int
    version: int = SEGMENT_VERSION

    def pack(self) -> bytes:
        return struct.pack(_HEADER, self.magic, self.version, 0, self.nonce, self.epoch)

    @classmethod
    def unpack(cls, b: bytes) -> "SegmentHeader":
        magic, version, _, nonce, epoch = struct.unpack_from(_HEADER, b)
        return cls(magic, nonce, epoch, version)


def region_offsets(nbytes: Sequence[int]) -> tuple[list[int], int]:
    """Byte offsets of regions of ``nbytes`` each after the header page, each 4096-aligned, and the total size."""
    offsets, at = [], HEADER_BYTES
    for n in nbytes:
        offsets.append(at)
        at += -(-int(n) // ALIGN) * ALIGN
    return offsets, max(at, HEADER_BYTES + ALIGN)


def _unmap(mapping: mmap.mmap) -> None:
    """Unmap ``mapping`` unless arrays over it still live (then it goes with the last of them)."""
    try:
        mapping.close()
    except BufferError:
        pass


class Segment:
    """A segment the server made: ``regions[k]`` byte offset of region ``k``; :meth:`close` unlinks and unmaps."""

    def __init__(self, path: Path, mapping: mmap.mmap, regions: list[int]):
        self.path, self._map, self.regions = path, mapping, regions

    @classmethod
    def create(cls, magic: bytes, nbytes: Sequence[int], nonce: bytes, epoch: int) -> "Segment":
        """A new segment with regions of ``nbytes`` bytes, all at once (:class:`SegmentMaker`)."""
        maker = SegmentMaker(magic, nbytes, nonce, epoch)
        maker.step(None, touch=False)
        return maker.made()

    def array(self, region: int, dtype: str, shape: tuple[int, int]) -> np.ndarray:
        """Region ``region`` as a Fortran-order ``shape`` array (a view of the shared memory)."""
        flat = np.frombuffer(self._map, dtype=dtype, count=shape[0] * shape[1], offset=self.regions[region])
        return flat.reshape(shape, order="F")

    def close(self) -> None:
        """Unlink the name and unmap (a runner that still has it mapped keeps its own mapping); twice is harmless."""
        self.path.unlink(missing_ok=True)
        _unmap(self._map)


class SegmentMaker:
    """A new segment with regions of ``nbytes`` bytes, made in steps (:meth:`step`) so that a server can
    make one while it has nothing else to do.

    Each step allocates its bytes (``posix_fallocate``: a full /dev/shm fails here with ENOSPC, never
    with a SIGBUS later) and, with ``touch``, touches every page of them through this process's
    mapping. The touch is what makes a fresh segment cheap to use: an allocated tmpfs page is only
    cleared at its first access, one page fault per 4 KiB, which costs several times the copy of the
    page (for a 52 MB slot, about 20 ms, which a model mapping the slot would pay inside its restart
    read). The name is handed to no one before :meth:`made`; :meth:`abandon` removes it.
    """

    def __init__(self, magic: bytes, nbytes: Sequence[int], nonce: bytes, epoch: int):
        self.regions, self.size = region_offsets(nbytes)
        self.header = SegmentHeader(magic, nonce, epoch)
        self.path = new_segment("online")
        self.done = 0  # bytes allocated and touched
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            self._fd = fd
            os.ftruncate(fd, self.size)
            self._map = mmap.mmap(fd, self.size, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise

    def step(self, budget: int | None, *, touch: bool = True) -> bool:
        """Allocate (and ``touch``) the next ``budget`` bytes (None: all that is left); True once complete.
        OSError (ENOSPC: /dev/shm is full) abandons the segment."""
        n = self.size - self.done if budget is None else min(budget, self.size - self.done)
        try:
            os.posix_fallocate(self._fd, self.done, n)
        except BaseException:
            self.abandon()
            raise
        if touch:
            pages = np.frombuffer(self._map, dtype=np.uint8, count=n, offset=self.done)
            pages[::mmap.PAGESIZE] = 0  # the first write to each page (the allocation left it unwritten)
        self.done += n
        return self.done == self.size

    def made(self) -> Segment:
        """The complete segment, its header written (after :meth:`step` returned True)."""
        assert self.done == self.size, "the segment is not complete"
        self._map[:HEADER_BYTES] = self.header.pack().ljust(HEADER_BYTES, b"\0")
        os.close(self._fd)
        return Segment(self.path, self._map, self.regions)

    def abandon(self) -> None:
        """Unlink and unmap the unfinished segment."""
        os.close(self._fd)
        self.path.unlink(missing_ok=True)
        _unmap(self._map)


def _header_problem(head: bytes, magic: bytes, nonce: bytes, epoch: int | None = None) -> str | None:
    """Why ``head`` (a segment's first bytes) is not the header of a segment of kind ``magic`` of the
    server rank with ``nonce`` (b"": any) and ``epoch`` (None: any); None when it is."""
    if len(head) < struct.calcsize(_HEADER):
        return "it is shorter than its header"
    h = SegmentHeader.unpack(head)
    if h.magic != magic:
        return f"bad magic {h.magic!r}, expected {magic!r}"
    if h.version != SEGMENT_VERSION:
        return f"segment layout version {h.version}, this runner reads version {SEGMENT_VERSION}"
    if (nonce and h.nonce != nonce) or (epoch is not None and h.epoch != epoch):
        return "it belongs to another server (its nonce or epoch differs from the WELCOME's)"
    return None


def check_store(path: str, nonce: str, epoch: int) -> str | None:
    """Why a runner cannot use the store segment ``path`` of a server rank whose WELCOME gave ``nonce``
    (hex) and ``epoch``; None when it can (same node, same user, the same incarnation)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        return f"cannot open it ({exc.strerror}: another node, or another user)"
    try:
        head = os.pread(fd, struct.calcsize(_HEADER), 0)
    finally:
        os.close(fd)
    try:
        want = bytes.fromhex(nonce)
    except ValueError:
        return f"the WELCOME's nonce {nonce!r} is not hexadecimal"
    return _header_problem(head, STORE_MAGIC, want or b"\0", epoch)


def available() -> str | None:
    """Why this node has no shared memory for segments (None: it has)."""
    if shm_dir() != Path("/dev/shm"):
        return "no writable /dev/shm"
    return None


SLOT_GONE = "is gone (retired by the server: the task is stale)"


class SlotGone(ProtocolError):
    """The task's slot no longer exists: the server retired it (the task went stale meanwhile)."""


class MappedSegments:
    """A runner's mappings of the server's segments, by path, each mapped once: the store read-only
    (its pages fault in as members are read), slots read-write and pre-faulted (MAP_POPULATE: a slot
    is written whole, and reused by the runner's later tasks)."""

    def __init__(self) -> None:
        self._maps: dict[str, mmap.mmap] = {}

    def view(self, path: str, offset: int, dtype: np.dtype, count: int, *, writable: bool,
             nonce: bytes = b"") -> np.ndarray:
        """``count`` elements of ``dtype`` at byte ``offset`` of the segment ``path``, mapped on first use
        after checking that it is a segment of this node's shared memory with the header of a slot
        (``writable``) or a store and the server rank's ``nonce`` (b"": any). A slot that is gone raises
        :class:`SlotGone`."""
        m = self._maps.get(path)
        if m is None:
            self._forget_unlinked()
            m = self._maps[path] = self._map(path, writable, nonce)
        if offset < HEADER_BYTES or offset + count * dtype.itemsize > len(m):
            raise ProtocolError(f"the server named bytes [{offset}, {offset + count * dtype.itemsize}) of segment "
                                f"{path}, which has {len(m)}")
        return np.frombuffer(m, dtype=dtype, count=count, offset=offset)

    def _forget_unlinked(self) -> None:
        """Unmap the segments the server has removed (retired slots): their memory goes once unmapped."""
        for path in [p for p in self._maps if not os.path.exists(p)]:
            _unmap(self._maps.pop(path))

    @staticmethod
    def _map(path: str, writable: bool, nonce: bytes) -> mmap.mmap:
        """``path`` mapped, once it is known to be an enkflow online segment of this node with the
        expected header (the server is authenticated, but a runner must not map just any file)."""
        p = Path(path)
        if p.parent != shm_dir() or maker_pid(p.name) is None or not p.name.startswith("enkflow-online-"):
            raise ProtocolError(f"the server named {path}, which is not an online segment in {shm_dir()}")
        try:
            fd = os.open(p, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW)
        except FileNotFoundError:
            if writable:
                raise SlotGone(f"the task's slot {path} {SLOT_GONE}") from None
            raise ProtocolError(f"the server's store segment {path} is gone") from None
        except OSError as exc:
            raise ProtocolError(f"cannot open the server's segment {path}: {exc.strerror or exc}") from None
        try:
            why = _header_problem(os.pread(fd, struct.calcsize(_HEADER), 0), SLOT_MAGIC if writable else STORE_MAGIC,
                                  nonce)
            if why is not None:
                raise ProtocolError(f"the server's segment {path}: {why}")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            populate = getattr(mmap, "MAP_POPULATE", 0) if writable else 0
            return mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | populate, prot=prot)
        finally:
            os.close(fd)

    def clear(self) -> None:
        """Unmap every segment (the server's incarnation changed, or the runner leaves)."""
        for m in self._maps.values():
            _unmap(m)
        self._maps.clear()
