"""The server ranks' internal bus: rank 0 a ROUTER on loopback, every other rank a DEALER connected to it.

Ranks report to rank 0 (their part of a task's forecast arrived complete and
valid, or was refused; their verdict on the statelessness check) and rank 0
orders them (take or drop a task's staged frames, compare a repeated forecast,
the forecast phase is over, stop). A message is the sender's credential (from
a rank; rank 0 routes by the rank's identity ``rank-R`` instead), the record
:data:`_BUS` and, when there is one, a UTF-8 reason::

    op u16, task i64, member i64, cycle i64, rank i64 (the sender)
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import zmq

from enkflow.online.sockets import bind
from enkflow.parallel import Comm

_BUS = struct.Struct("<Hqqqq")  # op, task, member, cycle, rank


class BusOp(IntEnum):
    REGISTER = 0  # rank -> 0, once at the start: rank 0 can route to the rank from then on
    PART_DONE = 1  # rank -> 0: its part of the task's forecast arrived complete and valid
    PART_REJECT = 2  # rank -> 0: its part was refused (the reason says why)
    ACCEPT = 3  # 0 -> rank: move the task's staged frames into the member's columns
    DROP = 4  # 0 -> rank: forget the task's staged frames
    END_FORECAST = 5  # 0 -> rank: every member's forecast of the cycle is in
    STOP = 6  # 0 -> rank: the server stopped (the reason says why)
    COMPARE = 7  # 0 -> rank: compare the task (a repeated run) with the member's first forecast
    SAME = 8  # rank -> 0: its part of the repeated run equals the first
    DIFFER = 9  # rank -> 0: it differs (the reason says where)

    @property
    def is_report(self) -> bool:
        """Whether a rank sends it to rank 0 (the others rank 0 sends)."""
        return self in (BusOp.PART_DONE, BusOp.PART_REJECT, BusOp.SAME, BusOp.DIFFER)


@dataclass(frozen=True)
class BusMessage:
    """One bus message: ``op`` about ``task`` (the scheduler's id) of ``member`` in ``cycle``, from
    rank ``rank``, with ``reason`` (words, for PART_REJECT, DIFFER and STOP)."""

    op: BusOp
    task: int = 0
    member: int = 0
    cycle: int = 0
    rank: int = 0  # the sender: on receipt; frames() writes the sender it is given
    reason: str = ""

    def frames(self, sender: int) -> list[bytes]:
        record = _BUS.pack(self.op, self.task, self.member, self.cycle, sender)
        return [record, self.reason.encode()] if self.reason else [record]


def _parsed(record: bytes, reason: str) -> BusMessage | None:
    """The message in a bus record, or None for an unknown operation."""
    op, task, member, cycle, rank = _BUS.unpack(record)
    try:
        return BusMessage(BusOp(op), task, member, cycle, rank, reason)
    except ValueError:
        return None


class Bus:
    """This rank's end of the bus (there is none on a server of one rank)."""

    def __init__(self, sock: zmq.Socket, address: str, comm: Comm, cred: bytes, emit: Callable[..., None]):
        self.socket, self.address = sock, address
        self.rank, self.size = comm.rank, comm.size
        self._cred, self._emit = cred, emit

    @classmethod
    def open(cls, ctx: zmq.Context, comm: Comm, cred: bytes, emit: Callable[..., None]) -> Bus | None:
        """Collective: rank 0 binds on loopback, the other ranks connect and register; ``emit``
        (rank 0) logs what is refused."""
        if comm.size == 1:
            return None
        sock = bind(ctx, zmq.ROUTER, "127.0.0.1") if comm.rank == 0 else ctx.socket(zmq.DEALER)
        address = comm.bcast(sock.getsockopt_string(zmq.LAST_ENDPOINT) if comm.rank == 0 else None, root=0)
        bus = cls(sock, address, comm, cred, emit)
        if comm.rank != 0:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IDENTITY, b"rank-%d" % comm.rank)
            sock.connect(address)
            bus.send(0, BusMessage(BusOp.REGISTER))
            return bus
        registered: set[int] = set()
        while len(registered) < comm.size - 1:
            msg = bus.receive_report()
            if msg is not None and msg.op is BusOp.REGISTER:
                registered.add(msg.rank)
        return bus

    def send(self, rank: int, msg: BusMessage) -> None:
        """``msg`` to rank ``rank`` (from a rank other than 0: always to rank 0)."""
        if self.rank == 0:
            self.socket.send_multipart([b"rank-%d" % rank, *msg.frames(self.rank)])
        else:
            self.socket.send_multipart([self._cred, *msg.frames(self.rank)])

    def receive_report(self) -> BusMessage | None:
        """Rank 0: a rank's report, or None for a message that is not one. The bus listens on
        loopback, where any local process can connect."""
        frames = self.socket.recv_multipart()[1:]  # after the sender's identity
        if len(frames) in (2, 3) and hmac.compare_digest(frames[0], self._cred) and len(frames[1]) == _BUS.size:
            msg = _parsed(frames[1], frames[2].decode(errors="replace") if len(frames) > 2 else "")
            if msg is not None and 0 < msg.rank < self.size:
                return msg
        self._emit("online_reject", reason="not a server rank's message", socket="bus", rank=0)
        return None

    def receive_order(self) -> BusMessage | None:
        """A rank other than 0: rank 0's next order (None: not one this server sends)."""
        frames = self.socket.recv_multipart()
        return _parsed(frames[0], frames[1].decode() if len(frames) > 1 else "")

    def stop_ranks(self, reason: str) -> None:
        """Rank 0: STOP to every other rank, without waiting for a rank that is gone."""
        for rank in range(1, self.size):
            try:
                self.socket.send_multipart([b"rank-%d" % rank, *BusMessage(BusOp.STOP, reason=reason).frames(0)],
                                           zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def close(self, linger_ms: int) -> None:
        self.socket.close(linger=linger_ms)
