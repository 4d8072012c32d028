"""One sender's connection to one writer (:class:`WriterChannel`): its socket, its shared-memory ring,
and the pieces in flight (sent, not yet written), which bound what ``add`` may send (``buffer_mb``)."""

from __future__ import annotations

import os
import socket
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from enkflow.errors import ConfigError
from enkflow.output import protocol as P
from enkflow.output.config import OutputConfig
from enkflow.output.piece import Piece, wire_copy
from enkflow.output.ring import NOTICE_BYTES, Ring
from enkflow.output.writer_process import WriterProcess


@dataclass(slots=True)
class InFlight:
    """A piece sent and not yet written: its number (``seq``, or the ring's notice), bytes as sent,
    the copy ZeroMQ sends (None: it is in the ring), and what it is (named if the writer hangs on it)."""

    seq: int
    nbytes: int
    keep: np.ndarray | None
    name: str
    time: float
    member: int | None

    def describe(self) -> str:
        return (f"the oldest piece not written: field {self.name} time {self.time:g}"
                + (f" member {self.member}" if self.member is not None else ""))


@dataclass
class WriterChannel:
    """``writer`` as this sender talks to it: ``sock`` (a DEALER), ``ring`` (shared memory, or None:
    the arrays go over the socket), at most ``limit`` bytes in flight."""

    writer: WriterProcess
    sock: Any
    ring: Ring | None
    limit: int
    seq: int = 0
    pending: deque[InFlight] = field(default_factory=deque)
    outstanding: int = 0
    heard: int = 0  # messages received from the writer (its ring counts those it sent: Ring.told)
    alive: bool = True
    lost_why: str = ""  # how it was lost, for every later call under on_writer_failure = "stop"
    writer_stats: dict[str, Any] = field(default_factory=dict)
    # P.put_fixed per field, dtype and shape: the part of a ring's notice that is the same for each piece
    notice_fixed: dict[tuple[str, str, tuple[int, ...]], str] = field(default_factory=dict)

    def hello(self) -> None:
        """The first message: where the ring is, and who this sender is."""
        ring = self.ring
        self.sock.send(P.encode(P.HELLO, ring=str(ring.path) if ring else None,
                                client=f"{socket.gethostname()}:{os.getpid()}"))

    def send(self, kind: str, **extra: Any) -> None:
        """A request after the pieces published so far (``upto``: the ring's notices)."""
        self.seq += 1
        upto = self.ring.published if self.ring is not None else 0
        self.sock.send(P.encode(kind, seq=self.seq, upto=upto, **extra))

    def put(self, piece: Piece, slot: int | None) -> None:
        """Copy ``piece`` into its ring ``slot`` and publish its notice, or send it over the socket."""
        a, wire, nbytes = piece.array, piece.wire, piece.nbytes
        region = piece.region_json()
        if self.ring is not None:
            assert slot is not None
            wire_copy(a, wire, self.ring.buf[slot : slot + nbytes].view(wire).reshape(a.shape))
            key = (piece.name, wire.str, a.shape)
            fixed = self.notice_fixed.get(key)
            if fixed is None:
                fixed = self.notice_fixed[key] = P.put_fixed(field=piece.name, dtype=wire.str, shape=list(a.shape))
            seq = self.ring.publish(P.put_notice(slot, nbytes, piece.time, piece.member, region, fixed))
            keep = None
        else:
            self.seq += 1
            seq = self.seq
            keep = wire_copy(a, wire)
            meta = P.encode(P.PUT, seq=seq, field=piece.name, time=piece.time, member=piece.member, region=region,
                            dtype=wire.str, shape=list(a.shape))
            self.sock.send_multipart([meta, memoryview(keep.reshape(-1).view(np.uint8))], copy=False)
        self.pending.append(InFlight(seq, nbytes, keep, piece.name, piece.time, piece.member))
        self.outstanding += nbytes

    def release(self) -> None:
        """Free the ring slots of the pieces the writer has finished with (read from the ring, no call)."""
        if self.ring is None or not self.pending:
            return
        done = self.ring.consumed()
        while self.pending and self.pending[0].seq <= done:
            self.outstanding -= self.pending.popleft().nbytes
            self.ring.free_oldest()

    def forget(self) -> tuple[int, int]:
        """Drop the pieces in flight (the writer is lost); their count and bytes."""
        lost = (len(self.pending), self.outstanding)
        self.pending.clear()
        self.outstanding = 0
        return lost

    def close(self) -> None:
        self.writer.close_view()
        self.sock.close(linger=0)
        if self.ring is not None:
            self.ring.close()


def check_notices(cfg: OutputConfig, shapes: dict[str, tuple[int, ...]], limit: int) -> None:
    """Every field's longest notice fits a ring slot (checked once at the start, not at each add);
    ``limit``: the ring's bytes."""
    for name, shape in shapes.items():
        member = cfg.members if cfg.fields[name].ensemble else None
        worst = P.put_notice(limit, limit, -2.2250738585072014e-308, member,
                             [[n, n] for n in shape], P.put_fixed(field=name, dtype="<f8", shape=list(shape)))
        if len(worst) > NOTICE_BYTES - 4:
            raise ConfigError(f"output.fields.{name}: the metadata of a piece can take {len(worst)} bytes, more "
                              f"than a notice of the shared-memory ring holds ({NOTICE_BYTES - 4}); use a shorter "
                              "field name, or transport = 'ipc'", key=f"output.fields.{name}")
