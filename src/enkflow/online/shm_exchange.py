"""A runner's exchange through shared memory with the server ranks on its node.

Per data rank, the runner decides at its greeting whether it reaches the rank
through shared memory (:func:`choose_ranks`): the rank's store segment named in
the WELCOME must open read-only here and carry the WELCOME's nonce and epoch
(same node, same user, the same server incarnation). With such a rank, GET is
GET_SLOT, whose SLOT reply says where each piece of the member's state is and
where its forecast goes (:class:`Extent`); the runner copies once each way
(:class:`ShmExchange`), and PUT is PUT_SLOT, a notification.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import zmq

from enkflow.errors import ConfigError
from enkflow.online.segments import HEADER_BYTES, MappedSegments, check_store
from enkflow.transport import Transport
from enkflow.online.wire import Header, ProtocolError, decode_index, decode_json


@dataclass(frozen=True)
class Extent:
    """Elements ``[lo, hi)`` of field ``field`` (its index; offsets in the whole flattened field) of the
    member held: their first element at byte ``read_offset`` of the segment ``read_path`` (the member's
    state) and at ``write_offset`` of ``write_path`` (the task's slot, where its forecast goes)."""

    field: int
    lo: int
    hi: int
    read_path: str
    read_offset: int
    write_path: str
    write_offset: int


def choose_ranks(welcome: dict, transport: Transport) -> list[bytes | None]:
    """Per data rank of the WELCOME, the nonce of its segments when this runner reaches it through
    shared memory, None when over TCP. With ``transport`` SHM a rank it cannot reach so is a
    ConfigError naming the rank, the segment and why."""
    ranks = int(welcome["ranks"])
    shm = welcome.get("shm") or [None] * ranks
    use: list[bytes | None] = []
    for r, info in enumerate(shm):
        why, path = None, "(none)"
        if transport is Transport.TCP:
            use.append(None)
            continue
        if not isinstance(info, dict):
            why = "the server rank has no shared memory (its transport is tcp, or it could not make a segment)"
        else:
            path = str(info.get("segment"))
            why = check_store(path, str(info.get("nonce")), int(welcome["epoch"]))
        if why is not None and transport is Transport.SHM:
            raise ConfigError(f"shared memory was asked for, but server rank {r}'s store segment {path} cannot be "
                              f"used: {why}", key="ENKFLOW_TRANSPORT (or the Runner's transport)")
        use.append(None if why is not None else bytes.fromhex(str(info["nonce"])))
    return use


class ShmExchange:
    """The runner's side: which data ranks go through shared memory (``use``), the segments mapped,
    and the extents of the task held, per data rank."""

    def __init__(self) -> None:
        self.maps = MappedSegments()
        self.nonces: list[bytes | None] = []
        self.extents: dict[int, list[Extent]] = {}

    def over_shm(self, rank: int) -> bool:
        """Whether data rank ``rank`` is reached through shared memory."""
        return self.nonces[rank] is not None

    def reset(self, nonces: list[bytes | None]) -> None:
        """A new greeting: reach the ranks with a nonce (:func:`choose_ranks`) through shared memory."""
        self.close()
        self.nonces = nonces

    def answer(self, rank: int, pieces: Sequence[tuple[int, int, int]], hdr: Header, frames: list[zmq.Frame]) -> list[Extent]:
        """The extents of server rank ``rank``'s SLOT reply to a GET_SLOT of ``pieces`` (field, offset, count)."""
        try:
            idx = decode_index(frames[0].buffer, hdr.count)
            where = decode_json(frames[1].buffer, "slot")
            at = [(_offset(a), _offset(b)) for a, b in where["at"]]
            read, write = str(where["read"]), str(where["write"])
        except (ProtocolError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"server rank {rank} sent a malformed SLOT reply: {exc}") from None
        if len(idx) != len(pieces) or len(at) != len(pieces) or not np.array_equal(idx, np.array(pieces).reshape(-1, 3)):
            raise ProtocolError(f"server rank {rank} answered with other pieces than asked for")
        out = [Extent(k, off, off + cnt, read, a, write, b) for (k, off, cnt), (a, b) in zip(pieces, at)]
        # The slot is mapped now, while it is surely there: a runner that later finds it gone (retired while
        # the runner was stopped) knows its task is stale.
        nonce, byte = self.nonces[rank] or b"", np.dtype(np.uint8)
        self.maps.view(read, HEADER_BYTES, byte, 0, writable=read == write, nonce=nonce)
        self.maps.view(write, HEADER_BYTES, byte, 0, writable=True, nonce=nonce)
        self.extents[rank] = out
        return out

    def read(self, extents: list[Extent], arrays: list[np.ndarray], starts: list[int]) -> None:
        """Copy the member's state out of shared memory into ``arrays`` (field ``k``'s slice starts at
        element ``starts[k]``)."""
        for e in extents:
            dst = arrays[e.field][e.lo - starts[e.field]:e.hi - starts[e.field]]
            dst[...] = self.maps.view(e.read_path, e.read_offset, dst.dtype, e.hi - e.lo,
                                      writable=e.read_path == e.write_path)

    def write(self, extents: list[Extent], arrays: list[np.ndarray], starts: list[int]) -> None:
        """Copy the forecast in ``arrays`` into the task's slot."""
        for e in extents:
            src = arrays[e.field][e.lo - starts[e.field]:e.hi - starts[e.field]]
            self.maps.view(e.write_path, e.write_offset, src.dtype, e.hi - e.lo, writable=True)[...] = src

    def close(self) -> None:
        """Unmap every segment (the server is lost or changed, or the runner leaves)."""
        self.maps.clear()
        self.extents = {}


def _offset(v: object) -> int:
    """A byte offset of a SLOT reply: a non-negative JSON integer."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"offset {v!r} is not a non-negative integer")
    return v
