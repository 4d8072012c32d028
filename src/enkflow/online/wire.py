"""The online wire protocol: one fixed binary header, then raw frames.

Every message is a multipart ZeroMQ message whose first frame is a
:class:`Header` of exactly :data:`HEADER_SIZE` bytes (little-endian)::

    magic      4s   b"ENKF"
    version    u16  PROTOCOL_VERSION; a peer speaking another version gets an error naming both
    kind       u16  a :class:`Kind`
    credential 32s  SHA-256 of the shared token (every message carries it: any server rank can check it)
    runner     u64  the runner's id, chosen at random by the runner
    task       u64  the task id the server gave out (0: none)
    member     i64  1-based member, 0 for none
    cycle      i64
    nsteps     i64  steps to run (TASK), 0 = stop; in READY the runner's previous wait for a task, microseconds
    count      u64  the number of pieces that follow (PUT/GET/DATA, PUT_SLOT/GET_SLOT/SLOT)
    epoch      u64  the server's incarnation (a restarted server has a new one)

Then, by kind: a UTF-8 JSON frame (HELLO, WELCOME, ERROR: metadata only,
never pickle), or a piece index (``count`` x 3 int64: field, offset, element
count) followed by ``count`` raw array frames, sent and received without copies.
GET_SLOT and PUT_SLOT carry the index, not the bytes, which are in shared memory
(:mod:`enkflow.online.segments`); PUT_SLOT may add a *finite* frame, a byte per
piece (:func:`encode_finite`); SLOT echoes the index, then a JSON frame
``{"read": PATH, "write": PATH, "at": [[read_byte_offset, write_byte_offset], ...]}``
(one pair per piece, in the index's order).
"""

from __future__ import annotations

from enkflow import tokens
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import IntEnum

import numpy as np

from enkflow.errors import EnkflowError

MAGIC = b"ENKF"
PROTOCOL_VERSION = 2
_FMT = "<4sHH32sQQqqqQQ"
HEADER_SIZE = struct.calcsize(_FMT)
MAX_JSON_BYTES = 1 << 20
# The refusal of a PUT_SLOT whose task has no slot (a stale task: its runner was declared lost, its
# slot retired); the runner forgets that task as a late PUT's ACK would have it do.
NO_SLOT = "has no slot on server rank"


class ProtocolError(EnkflowError):
    """A message that does not follow the protocol (or fails authentication)."""


class VersionMismatch(ProtocolError):
    """A well-formed message of another protocol version: the peer runs another enkflow."""


class Kind(IntEnum):
    HELLO = 1  # runner -> control: JSON {fields, name, ranks}; reply WELCOME or ERROR
    WELCOME = 2  # control -> runner: JSON {data addresses, ownership, heartbeat, shm: per rank {segment, nonce} or null}
    READY = 3  # runner -> control: idle, wants a task; reply TASK (deferred until one is free) or STOP
    TASK = 4  # control -> runner: member, cycle, nsteps, task
    STOP = 5  # control -> runner: the study is over (nsteps = 0)
    PUT = 6  # runner -> data rank: index + frames of a forecast; reply ACK or ERROR
    ACK = 7
    GET = 8  # runner -> data rank: index; reply DATA (+ frames) or ERROR
    DATA = 9
    HEARTBEAT = 10  # runner -> control, from the runner's heartbeat thread; no reply
    FAIL = 11  # runner -> control: the model failed on this task, JSON {error}
    BYE = 12  # runner -> control: leaving (its task, if any, goes to another runner)
    ERROR = 13  # any reply: JSON {error}
    GET_SLOT = 14  # runner -> data rank: index, as GET; reply SLOT or ERROR
    SLOT = 15  # data rank -> runner: index (echo) + JSON {read, write, at}: where the pieces are in shared memory
    PUT_SLOT = 16  # runner -> data rank: index; the pieces are in the task's slot; reply ACK or ERROR


def credential(token: str | bytes) -> bytes:
    """The 32-byte credential every message carries: SHA-256 of the token."""
    return tokens.credential(token, b"enkflow-online-token")


@dataclass(frozen=True, slots=True)
class Header:
    kind: Kind
    credential: bytes = b"\0" * 32
    runner: int = 0
    task: int = 0
    member: int = 0
    cycle: int = 0
    nsteps: int = 0
    count: int = 0
    epoch: int = 0
    version: int = PROTOCOL_VERSION

    def pack(self) -> bytes:
        return struct.pack(_FMT, MAGIC, self.version, int(self.kind), self.credential, self.runner, self.task,
                           self.member, self.cycle, self.nsteps, self.count, self.epoch)

    def reply(self, kind: Kind, **kw: int) -> "Header":
        """A reply to this message: same runner/task/member/cycle unless overridden."""
        return replace(self, kind=kind, **kw)

    @classmethod
    def unpack(cls, frame: bytes | memoryview) -> "Header":
        """Parse and check a header frame; a wrong size, magic, version or kind raises ProtocolError."""
        b = memoryview(frame)
        if b.nbytes != HEADER_SIZE:
            raise ProtocolError(f"the header frame has {b.nbytes} bytes, expected {HEADER_SIZE} (not an enkflow message, "
                                "or a truncated one)")
        magic, version, kind, cred, runner, task, member, cycle, nsteps, count, epoch = struct.unpack(_FMT, b)
        if magic != MAGIC:
            raise ProtocolError(f"bad magic {magic!r}: not an enkflow online message")
        if version != PROTOCOL_VERSION:
            raise VersionMismatch(f"protocol version mismatch: the message speaks version {version}, this side "
                                  f"version {PROTOCOL_VERSION}; install the same enkflow on server and runners")
        try:
            k = Kind(kind)
        except ValueError:
            raise ProtocolError(f"unknown message kind {kind}") from None
        return cls(k, cred, runner, task, member, cycle, nsteps, count, epoch, version)


def encode_json(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_json(frame: bytes | memoryview, what: str) -> dict:
    b = bytes(frame)
    if len(b) > MAX_JSON_BYTES:
        raise ProtocolError(f"the {what} metadata frame has {len(b)} bytes, more than {MAX_JSON_BYTES}")
    try:
        obj = json.loads(b.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"the {what} metadata frame is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"the {what} metadata frame is not a JSON object")
    return obj


def encode_index(pieces: np.ndarray) -> bytes:
    """Piece index ``(k, 3)`` int64 rows (field, offset, count) as bytes."""
    return np.ascontiguousarray(pieces, dtype="<i8").tobytes()


def encode_finite(flags: Sequence[bool]) -> bytes:
    """PUT_SLOT's finite frame: a byte per piece, 1 when the runner, copying the piece into the slot, found
    every element finite (the server then does not read it again), 0 when it did not check or found one
    that is not (the server checks the piece)."""
    return bytes(1 if f else 0 for f in flags)


def decode_finite(frame: bytes | memoryview, count: int) -> np.ndarray:
    """The finite frame of a PUT_SLOT of ``count`` pieces, a bool per piece (ProtocolError if malformed)."""
    b = np.frombuffer(memoryview(frame), dtype=np.uint8)
    if b.size != count or (b > 1).any():
        raise ProtocolError(f"the finite frame holds {b.size} bytes for {count} pieces, each 0 or 1 expected")
    return b.astype(bool)


def decode_index(frame: bytes | memoryview, count: int) -> np.ndarray:
    """The piece index of a PUT/GET/DATA message announcing ``count`` pieces."""
    b = memoryview(frame)
    if b.nbytes != 24 * count:
        raise ProtocolError(f"the piece index has {b.nbytes} bytes, expected {24 * count} for {count} pieces "
                            "(truncated or oversize message)")
    return np.frombuffer(b, dtype="<i8").reshape(count, 3).astype(np.int64)
