"""Every server rank's data socket: runners PUT their forecasts into it and GET member states from it.

A PUT's pieces are checked (fields known, elements owned by this rank, frame
sizes, no element sent twice for a task, no NaN or Inf in a float or
assimilated field) and staged under the task's id. A rank whose staged pieces
of a task cover its whole share reports PART_DONE to rank 0, a refused PUT
PART_REJECT; rank 0 then orders the staged frames moved into the member's
columns (:meth:`DataPlane.accept`) or forgotten (:meth:`DataPlane.unstage`).
A refused message gets an ERROR naming the reason and an ``online_reject``
event, from whichever rank refused it.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import zmq

from enkflow.errors import EnkflowError
from enkflow.jobs.events import EventLog
from enkflow.online.bus import BusMessage, BusOp
from enkflow.online.checkpoint import Checkpointer
from enkflow.online.sockets import Incarnation, send_error
from enkflow.online.store import MemoryStore
from enkflow.online.wire import Header, Kind, ProtocolError, decode_index, encode_index


@dataclass(frozen=True)
class Piece:
    """Elements ``offset:offset + count`` of the flattened field ``field`` (its index), as received."""

    field: int
    offset: int
    count: int
    frame: zmq.Frame


@dataclass
class Staged:
    """A task's pieces received so far; ``covered``: per field, the element ranges [a, b) they hold."""

    member: int
    cycle: int
    pieces: list[Piece] = field(default_factory=list)
    covered: list[list[tuple[int, int]]] = field(default_factory=list)


class DataPlane:
    """This rank's data socket and the forecasts staged on it.

    ``report`` sends a message to rank 0; ``state_for(member)`` is what a GET of the member
    serves instead of the store's columns (None: the store's); ``log`` records refusals;
    ``keep_alive()`` is called every fraction of a second while an order waits for the analysis
    checkpoint (the rank's heartbeats).
    """

    def __init__(self, sock: zmq.Socket, store: MemoryStore, me: Incarnation, *, log: EventLog | None,
                 ckpt: Checkpointer | None, report: Callable[[BusMessage], None],
                 state_for: Callable[[int], list[np.ndarray] | None], keep_alive: Callable[[], None]):
        self.socket, self.store, self.me = sock, store, me
        self.fields = store.own.fields
        self.rank = store.comm.rank
        self._log, self._ckpt, self._report, self._state_for = log, ckpt, report, state_for
        self._keep_alive = keep_alive
        self.cycle = -1
        self.staged: dict[int, Staged] = {}
        self.transfer_s = 0.0  # the cycle's seconds spent handling data messages

    def start_cycle(self, cycle: int) -> None:
        self.cycle = cycle
        self.staged.clear()
        self.transfer_s = 0.0

    def receive(self) -> None:
        """Handle the next message on the data socket."""
        self._on_message(self.socket.recv_multipart(copy=False))

    def _on_message(self, frames: list[zmq.Frame]) -> None:
        """A message on the data socket: identity, header, then the PUT's or GET's frames."""
        t0 = time.perf_counter()
        identity = frames[0].bytes
        hdr = self._admitted(identity, frames)
        if hdr is None:
            return
        try:
            if hdr.kind is Kind.PUT:
                self._put(identity, hdr, frames[2:])
            elif hdr.kind is Kind.GET:
                self._get(identity, hdr, frames[2:])
            else:
                raise ProtocolError(f"unexpected {hdr.kind.name} on a data socket")
        except ProtocolError as exc:
            self._refuse(identity, hdr, str(exc))
        self.transfer_s += time.perf_counter() - t0

    def accept(self, task: int, member: int, cycle: int) -> None:
        """Rank 0's order: the task's staged frames become the member's columns (checkpointed)."""
        st = self.staged.pop(task, None)
        if st is None or cycle != self.cycle:
            raise EnkflowError(f"server rank {self.rank}: accepted task {task} (member {member}) is not staged")
        if self._ckpt is not None:
            # The first accepted forecast of a cycle waits until the analysis checkpoint is written (a large
            # state on a slow file system: longer than rank_timeout), beating meanwhile.
            self._ckpt.wait_analysis(self._keep_alive)
        for p in st.pieces:
            lo = self.store.ranges[p.field][0]
            col = self.store.column(p.field, member)
            col[p.offset - lo:p.offset - lo + p.count] = np.frombuffer(p.frame.buffer, dtype=col.dtype)
        # The member's other staged tasks stay: the statelessness check's repeated run may have arrived
        # before this order and is compared next; a stale one gets rank 0's DROP when it reports.
        if self._ckpt is not None:
            self._ckpt.forecast(cycle, member, [self.store.column(k, member) for k in range(len(self.fields))])

    def unstage(self, task: int) -> Staged | None:
        """The task's staged frames, no longer staged (None: none were)."""
        return self.staged.pop(task, None)

    # -- checks -------------------------------------------------------------------------

    def _admitted(self, identity: bytes, frames: list[zmq.Frame]) -> Header | None:
        """The message's header if it is readable, carries the credential and (PUT, GET) this
        incarnation's epoch; else None, the message refused."""
        try:
            hdr = Header.unpack(frames[1].buffer) if len(frames) > 1 else Header.unpack(b"")
        except ProtocolError as exc:
            self._refuse(identity, None, str(exc))
            return None
        if not hmac.compare_digest(hdr.credential, self.me.cred):
            self._refuse(identity, hdr, "authentication failed: wrong token")
            return None
        if hdr.kind in (Kind.PUT, Kind.GET) and hdr.epoch != self.me.epoch:
            # Meant for an earlier incarnation of this server and delivered to this one when the runner's
            # socket reconnected: its task ids are not this server's. Refused without touching any task;
            # the runner greets again.
            self._refuse(identity, hdr, f"stale {hdr.kind.name}: the runner was welcomed by another incarnation of "
                                        f"the server (epoch {hdr.epoch}, now {self.me.epoch}); greet again")
            return None
        return hdr

    def _refuse(self, identity: bytes, hdr: Header | None, message: str) -> None:
        """A data message refused: ERROR to the sender, ``online_reject`` in the event log (from any rank)."""
        if self._log is not None:
            self._log.emit("online_reject", reason=message, socket="data", rank=self.rank,
                           runner=hdr.runner if hdr else None, kind=hdr.kind.name if hdr else None)
        send_error(self.socket, identity, hdr, message, self.me)

    def _pieces(self, hdr: Header, frames: list[zmq.Frame], with_data: bool) -> np.ndarray:
        """The checked piece index of a PUT/GET, (count, 3) rows (field, offset, count): fields
        known, ranges owned by this rank."""
        if not frames:
            raise ProtocolError("the piece index frame is missing (truncated message)")
        if hdr.count > 4 * len(self.fields) * 1024:
            raise ProtocolError(f"{hdr.count} pieces announced; too many")
        idx = decode_index(frames[0].buffer, hdr.count)
        want = 1 + (hdr.count if with_data else 0)
        if len(frames) != want:
            raise ProtocolError(f"{len(frames) - 1} data frames for {hdr.count} announced pieces (truncated or oversize message)")
        if not 1 <= hdr.member <= self.store.n_members:
            raise ProtocolError(f"member {hdr.member} outside 1..{self.store.n_members}")
        for k, off, cnt in idx:
            if not 0 <= k < len(self.fields):
                raise ProtocolError(f"field index {k} outside 0..{len(self.fields) - 1}")
            lo, hi = self.store.ranges[k]
            if cnt <= 0 or off < lo or off + cnt > hi:
                raise ProtocolError(f"field {self.fields[k].name!r}: elements [{off}, {off + cnt}) are not within "
                                    f"[{lo}, {hi}), which server rank {self.rank} owns")
        return idx

    def _piece(self, member: int, st: Staged, k: int, off: int, cnt: int, fr: zmq.Frame) -> Piece:
        """A PUT's piece, checked: its frame's size, not sent before for the task, finite."""
        f = self.fields[k]
        if fr.buffer.nbytes != cnt * f.itemsize:
            raise ProtocolError(f"field {f.name!r}: a frame of {fr.buffer.nbytes} bytes for {cnt} {f.dtype} elements "
                                f"({cnt * f.itemsize} bytes; truncated or oversize, or another dtype)")
        if any(a < off + cnt and off < b for a, b in st.covered[k]):
            raise ProtocolError(f"field {f.name!r}: elements [{off}, {off + cnt}) were already sent for this task")
        if f.assimilated or f.dtype.startswith("float"):
            a = np.frombuffer(fr.buffer, dtype=f.dtype)
            if not np.isfinite(np.add.reduce(a, dtype=np.float64)):
                bad = np.flatnonzero(~np.isfinite(a))
                if bad.size:
                    raise ProtocolError(f"member {member}, field {f.name!r}: element {off + int(bad[0])} is "
                                        f"{a[bad[0]]} (NaN or Inf in the forecast)")
        return Piece(k, off, cnt, fr)

    # -- PUT and GET --------------------------------------------------------------------

    def _put(self, identity: bytes, hdr: Header, frames: list[zmq.Frame]) -> None:
        if hdr.cycle != self.cycle:
            # A forecast of another cycle (a late runner): acknowledged and forgotten.
            self.socket.send_multipart([identity, hdr.reply(Kind.ACK, epoch=self.me.epoch).pack()])
            return
        try:
            idx = self._pieces(hdr, frames, with_data=True)
            st = self.staged.get(hdr.task) or Staged(hdr.member, hdr.cycle, covered=[[] for _ in self.fields])
            if st.member != hdr.member:
                raise ProtocolError(f"task {hdr.task} is member {st.member}, not {hdr.member}")
            new = [self._piece(hdr.member, st, int(k), int(off), int(cnt), fr) for (k, off, cnt), fr in zip(idx, frames[1:])]
        except ProtocolError as exc:
            self._refuse(identity, hdr, str(exc))  # first: the report may stop the study (max_failures)
            self.staged.pop(hdr.task, None)
            self._report(BusMessage(BusOp.PART_REJECT, hdr.task, hdr.member, hdr.cycle, reason=str(exc)))
            return
        for p in new:
            st.pieces.append(p)
            st.covered[p.field].append((p.offset, p.offset + p.count))
        self.staged[hdr.task] = st
        self.socket.send_multipart([identity, hdr.reply(Kind.ACK, epoch=self.me.epoch).pack()])
        if all(sum(b - a for a, b in st.covered[k]) == hi - lo for k, (lo, hi) in enumerate(self.store.ranges)):
            self._report(BusMessage(BusOp.PART_DONE, hdr.task, hdr.member, hdr.cycle))

    def _get(self, identity: bytes, hdr: Header, frames: list[zmq.Frame]) -> None:
        if hdr.cycle != self.cycle:
            raise ProtocolError(f"asked for cycle {hdr.cycle}, the server is in cycle {self.cycle}")
        idx = self._pieces(hdr, frames, with_data=False)
        out: list[bytes | np.ndarray] = [identity, hdr.reply(Kind.DATA, epoch=self.me.epoch).pack(), encode_index(idx)]
        kept = self._state_for(hdr.member)
        for k, off, cnt in idx:
            lo = self.store.ranges[k][0]
            col = kept[k] if kept is not None else self.store.column(k, hdr.member)
            out.append(col[off - lo:off - lo + cnt])
        self.socket.send_multipart(out, copy=False)
