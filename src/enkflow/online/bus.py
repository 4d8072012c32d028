"""The server ranks' internal bus: rank 0 a ROUTER, every other rank a DEALER connected to it.

Rank 0 listens on loopback when every rank runs on its node, else on an address of its node's
interface that the other nodes reach (:class:`BusSettings`; with CURVE when the server has a key).

Ranks report to rank 0 (their part of a task's forecast arrived complete and
valid, or was refused; their verdict on the statelessness check) and rank 0
orders them (take or drop a task's staged frames, compare a repeated forecast,
the forecast phase is over, stop). During a forecast phase rank 0 and every
other rank send each other heartbeats: a rank that hears nothing from a peer
for ``timeout_s`` raises :class:`RankLost` (a lost node, a hung rank), so the
server stops and its launcher restarts it from the checkpoints. Silence is judged only after
every queued message has been read (:meth:`Bus.pending`), and not at all after this rank's own
loop stalled longer than the timeout (its peers' beats may not have been sent, or not read):
the clocks restart instead. A message is the sender's credential (from
a rank; rank 0 routes by the rank's identity ``rank-R`` instead), the record
:data:`_BUS` and, when there is one, a UTF-8 reason::

    op u16, task i64, member i64, cycle i64, rank i64 (the sender)
"""

from __future__ import annotations

import hmac
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import IntEnum

import zmq

from enkflow.errors import EnkflowError
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
    BEAT = 10  # either way: the sender is alive (during a forecast phase)

    @property
    def is_report(self) -> bool:
        """Whether a rank sends it to rank 0 (the others rank 0 sends)."""
        return self in (BusOp.PART_DONE, BusOp.PART_REJECT, BusOp.SAME, BusOp.DIFFER)


class RankLost(EnkflowError):
    """Server ranks ``ranks`` (on nodes ``nodes``, where known) are gone: the server stops, to be
    restarted from its checkpoints."""

    def __init__(self, message: str, *, ranks: list[int], nodes: list[str]):
        super().__init__(message)
        self.ranks, self.nodes = ranks, nodes


@dataclass(frozen=True)
class BusSettings:
    """Where rank 0 listens and how the ranks watch each other; times in seconds.

    ``host``: rank 0's bind address (loopback, or an address or interface of its node that the other
    ranks reach); ``curve_secret_key`` (Z85): the server's CURVE key, which every rank has (the others
    connect with its public key and a key pair of their own); ``beat_s``: the heartbeat period;
    ``timeout_s``: a peer silent this long during a forecast phase (or not registered this long after
    the start) is lost."""

    host: str
    beat_s: float
    timeout_s: float
    curve_secret_key: str | None = None


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

    def __init__(self, sock: zmq.Socket, address: str, comm: Comm, cred: bytes, emit: Callable[..., None],
                 settings: BusSettings):
        self.socket, self.address = sock, address
        self.rank, self.size = comm.rank, comm.size
        self._cred, self._emit = cred, emit
        self.beat_s, self.timeout_s = settings.beat_s, settings.timeout_s
        self._last_beat = 0.0
        self._judged = time.monotonic()  # when :meth:`silent` last looked (a longer gap: this rank stalled)
        # When each peer (rank 0: every other rank; another rank: rank 0) was last heard from (monotonic s).
        self._heard = dict.fromkeys(range(1, self.size) if self.rank == 0 else (0,), time.monotonic())

    @classmethod
    def open(cls, ctx: zmq.Context, comm: Comm, cred: bytes, emit: Callable[..., None],
             settings: BusSettings, nodes: list[str]) -> Bus | None:
        """Collective: rank 0 binds, the other ranks connect and register; ``emit`` (rank 0) logs what
        is refused; ``nodes``: every rank's node. Raises :class:`RankLost` on rank 0 when a rank does
        not register in time."""
        if comm.size == 1:
            return None
        key = settings.curve_secret_key
        if comm.rank == 0:
            sock = bind(ctx, zmq.ROUTER, settings.host, curve_secret_key=key)
        else:
            sock = ctx.socket(zmq.DEALER)
            if key:
                sock.curve_serverkey = zmq.curve_public(key.encode())
                sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        address = comm.bcast(sock.getsockopt_string(zmq.LAST_ENDPOINT) if comm.rank == 0 else None, root=0)
        bus = cls(sock, address, comm, cred, emit, settings)
        if comm.rank != 0:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IDENTITY, b"rank-%d" % comm.rank)
            sock.connect(address)
            bus.send(0, BusMessage(BusOp.REGISTER))
            return bus
        registered: set[int] = set()
        deadline = time.monotonic() + settings.timeout_s
        while len(registered) < comm.size - 1:
            if not sock.poll(max(1, int(1000 * (deadline - time.monotonic())))):
                missing = sorted(set(range(1, comm.size)) - registered)
                sock.close(linger=0)
                raise RankLost(f"server ranks {missing} did not reach rank 0's bus at {address} within "
                               f"{settings.timeout_s:g} s ([online] rank_timeout; [online] bind: an address they reach)",
                               ranks=missing, nodes=[nodes[r] for r in missing])
            msg = bus.receive_report()
            if msg is not None and msg.op is BusOp.REGISTER:
                registered.add(msg.rank)
        return bus

    def send(self, rank: int, msg: BusMessage, flags: int = 0) -> None:
        """``msg`` to rank ``rank`` (from a rank other than 0: always to rank 0); ``flags``: ZeroMQ's."""
        if self.rank == 0:
            self.socket.send_multipart([b"rank-%d" % rank, *msg.frames(self.rank)], flags)
        else:
            self.socket.send_multipart([self._cred, *msg.frames(self.rank)], flags)

    def receive_report(self) -> BusMessage | None:
        """Rank 0: a rank's report, or None for a heartbeat or a message that is not a rank's (any
        process that reaches the bus's address can connect: the credential tells the ranks)."""
        frames = self.socket.recv_multipart()[1:]  # after the sender's identity
        if len(frames) in (2, 3) and hmac.compare_digest(frames[0], self._cred) and len(frames[1]) == _BUS.size:
            msg = _parsed(frames[1], frames[2].decode(errors="replace") if len(frames) > 2 else "")
            if msg is not None and 0 < msg.rank < self.size:
                self._heard[msg.rank] = time.monotonic()
                return None if msg.op is BusOp.BEAT else msg
        self._emit("online_reject", reason="not a server rank's message", socket="bus", rank=0)
        return None

    def receive_order(self) -> BusMessage | None:
        """A rank other than 0: rank 0's next order (None: a heartbeat, or not one this server sends)."""
        frames = self.socket.recv_multipart()
        self._heard[0] = time.monotonic()
        msg = _parsed(frames[0], frames[1].decode() if len(frames) > 1 else "")
        return None if msg is None or msg.op is BusOp.BEAT else msg

    def pending(self) -> Iterator[BusMessage]:
        """Every message queued now, without waiting (rank 0: the ranks' reports; another rank: rank
        0's orders); heartbeats only refresh when their sender was heard."""
        receive = self.receive_report if self.rank == 0 else self.receive_order
        while self.socket.poll(0):
            msg = receive()
            if msg is not None:
                yield msg

    def rearm(self, now: float | None = None) -> None:
        """At the start of a forecast phase (the peers could not be heard during the analysis), and
        after this rank stalled: every peer's clock restarts at ``now`` (monotonic s)."""
        now = time.monotonic() if now is None else now
        self._heard = dict.fromkeys(self._heard, now)
        self._judged = now
        self._last_beat = 0.0

    def beat(self, now: float) -> None:
        """A heartbeat to the peers once a period has passed since the last (never waiting for a peer)."""
        if now - self._last_beat < self.beat_s:
            return
        self._last_beat = now
        for rank in self._heard:
            try:
                self.send(rank, BusMessage(BusOp.BEAT), zmq.NOBLOCK)
            except zmq.Again:
                pass  # rank 0 is gone and the queue to it full: silent() says so

    def silent(self, now: float) -> list[int]:
        """The peers not heard from for longer than the timeout (call after reading :meth:`pending`).
        Empty when this rank itself last looked longer than the timeout ago: its loop stalled (a long
        step), so its peers' silence says nothing about them; their clocks restart."""
        if now - self._judged > self.timeout_s:
            self.rearm(now)
            return []
        self._judged = now
        return [r for r, t in self._heard.items() if now - t > self.timeout_s]

    def stop_ranks(self, reason: str) -> None:
        """Rank 0: STOP to every other rank, without waiting for a rank that is gone."""
        for rank in range(1, self.size):
            try:
                self.send(rank, BusMessage(BusOp.STOP, reason=reason), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def close(self, linger_ms: int) -> None:
        self.socket.close(linger=linger_ms)
