"""Every server rank's data socket: runners PUT their forecasts into it and GET member states from it.

A PUT's pieces are checked (fields known, elements owned by this rank, frame
sizes, no element sent twice for a task, no NaN or Inf in a float or
assimilated field) and staged under the task's id. A rank whose staged pieces
of a task cover its whole share reports PART_DONE to rank 0, a refused PUT
PART_REJECT; rank 0 then orders the staged frames moved into the member's
columns (:meth:`DataPlane.accept`) or forgotten (:meth:`DataPlane.unstage`).
A refused message gets an ERROR naming the reason and an ``online_reject``
event, from whichever rank refused it.

A runner on the rank's node exchanges through shared memory instead
(:mod:`enkflow.online.segments`): GET_SLOT binds a slot to the task
(:mod:`enkflow.online.slots`) and answers where the member's elements are (the
store segment) and where the forecast goes (the slot); PUT_SLOT announces the
pieces written there, which get the same checks on the slot's bytes (but for
the pieces its *finite* frame says the runner found finite while it copied them
there: those the rank does not read again). The copy
of an accepted forecast into the member's columns is deferred
(:meth:`DataPlane.flush`): the rank's loop runs it when nothing else is ready,
before a GET of that member and before the forecast phase ends.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import zmq

from enkflow.analysis.validate import first_bad
from enkflow.errors import EnkflowError
from enkflow.jobs.events import EventLog
from enkflow.online.bus import BusMessage, BusOp
from enkflow.online.checkpoint import Checkpointer
from enkflow.online.slots import Slot, SlotPool
from enkflow.online.sockets import Incarnation, send_error
from enkflow.online.store import MemoryStore
from enkflow.online.wire import (NO_SLOT, Header, Kind, ProtocolError, decode_finite, decode_index, encode_index,
                                encode_json)


@dataclass(frozen=True)
class Piece:
    """Elements ``offset:offset + count`` of the flattened field ``field`` (its index), as received:
    ``values`` a view of the message's frame (TCP) or of the task's slot (shared memory)."""

    field: int
    offset: int
    count: int
    values: np.ndarray


@dataclass
class Staged:
    """A task's pieces received so far; ``covered``: per field, the element ranges [a, b) they hold."""

    member: int
    cycle: int
    pieces: list[Piece] = field(default_factory=list)
    covered: list[list[tuple[int, int]]] = field(default_factory=list)


@dataclass
class Accepted:
    """Rank 0's order to take task ``task``'s staged forecast as member ``member``'s, not yet carried
    out; the copy into the store has reached element ``done`` of piece ``piece``."""

    task: int
    member: int
    cycle: int
    staged: Staged
    piece: int = 0
    done: int = 0


class DataPlane:
    """This rank's data socket and the forecasts staged on it.

    ``report`` sends a message to rank 0; ``state_for(member)`` is what a GET of the member
    serves instead of the store's columns (None: the store's); ``log`` records refusals;
    ``keep_alive()`` is called every fraction of a second while an order waits for the analysis
    checkpoint (the rank's heartbeats); ``slots``: the rank's slot pool when its store is in
    shared memory (None: TCP only).
    """

    def __init__(self, sock: zmq.Socket, store: MemoryStore, me: Incarnation, *, log: EventLog | None,
                 ckpt: Checkpointer | None, report: Callable[[BusMessage], None],
                 state_for: Callable[[int], list[np.ndarray] | None], keep_alive: Callable[[], None],
                 slots: SlotPool | None = None):
        self.socket, self.store, self.me, self.slots = sock, store, me, slots
        self.fields = store.own.fields
        self.rank = store.comm.rank
        self._log, self._ckpt, self._report, self._state_for = log, ckpt, report, state_for
        self._keep_alive = keep_alive
        self.cycle = -1
        self.staged: dict[int, Staged] = {}
        self.accepted: list[Accepted] = []  # copies into the store not yet made (:meth:`flush`)
        self.transfer_s = 0.0  # the cycle's seconds spent handling data messages

    def start_cycle(self, cycle: int) -> None:
        self.cycle = cycle
        self.staged.clear()
        self.transfer_s = 0.0

    def end_forecast(self) -> None:
        """The forecast phase ends: every accepted forecast copied in, every slot still bound retired."""
        self.flush()
        self.staged.clear()
        if self.slots is not None:
            self.slots.retire_bound()

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
            elif hdr.kind is Kind.PUT_SLOT and self.slots is not None:
                self._put_slot(identity, hdr, frames[2:], self.slots)
            elif hdr.kind is Kind.GET_SLOT and self.slots is not None:
                self._get_slot(identity, hdr, frames[2:], self.slots)
            else:
                raise ProtocolError(f"unexpected {hdr.kind.name} on a data socket"
                                    + (" (this server rank has no shared memory)" if hdr.kind in _SLOT_KINDS else ""))
        except ProtocolError as exc:
            self._refuse(identity, hdr, str(exc))
        self.transfer_s += time.perf_counter() - t0

    def accept(self, task: int, member: int, cycle: int) -> None:
        """Rank 0's order: the task's staged forecast becomes the member's columns (checkpointed), copied
        by :meth:`flush`."""
        st = self.staged.pop(task, None)
        if st is None or cycle != self.cycle:
            raise EnkflowError(f"server rank {self.rank}: accepted task {task} (member {member}) is not staged")
        self.accepted.append(Accepted(task, member, cycle, st))
        # The member's other staged tasks stay: the statelessness check's repeated run may have arrived
        # before this order and is compared next; a stale one gets rank 0's DROP when it reports.

    def flush(self, member: int | None = None, budget: int | None = None) -> None:
        """Copy the accepted forecasts (of ``member`` only, unless None) into their members' columns;
        their slots are free again. With ``budget`` (bytes), stop once about that much was copied:
        the loop copies in such steps while it is idle, so a runner's next request waits for one step
        at most, not for a whole member."""
        todo = [a for a in self.accepted if member is None or a.member == member]
        if not todo:
            return
        if self._ckpt is not None:
            # The first accepted forecast of a cycle waits until the analysis checkpoint is written (a large
            # state on a slow file system: longer than rank_timeout), beating meanwhile.
            self._ckpt.wait_analysis(self._keep_alive)
        left = budget
        for a in todo:
            left = self._copy(a, left)
            if left is not None and left <= 0:
                return

    def _copy(self, a: Accepted, budget: int | None) -> int | None:
        """Copy ``a``'s pieces into the store from where it stopped, ``budget`` bytes at most (None: all);
        the budget left. Once complete, ``a`` is done: its slot is freed and the member checkpointed."""
        pieces = a.staged.pieces
        while a.piece < len(pieces):
            p = pieces[a.piece]
            n = p.count - a.done
            if budget is not None:
                n = min(n, max(1, budget // p.values.itemsize))
                budget -= n * p.values.itemsize
            lo = self.store.ranges[p.field][0] - p.offset
            self.store.column(p.field, a.member)[a.done - lo:a.done - lo + n] = p.values[a.done:a.done + n]
            a.done += n
            if a.done == p.count:
                a.piece, a.done = a.piece + 1, 0
            if budget is not None and budget <= 0 and a.piece < len(pieces):
                return budget
        self.accepted = [x for x in self.accepted if x is not a]
        if self.slots is not None:
            self.slots.release(a.task)
        if self._ckpt is not None:
            self._ckpt.forecast(a.cycle, a.member, [self.store.column(k, a.member) for k in range(len(self.fields))])
        return budget

    def unstage(self, task: int) -> Staged | None:
        """The task's staged pieces, no longer staged (None: none were); its slot is retired (the
        pieces' views of it stay readable)."""
        if self.slots is not None:
            self.slots.retire(task)
        return self.staged.pop(task, None)

    # -- checks -------------------------------------------------------------------------

    def _admitted(self, identity: bytes, frames: list[zmq.Frame]) -> Header | None:
        """The message's header if it is readable, carries the credential and (PUT, GET and their
        shared-memory kinds) this incarnation's epoch; else None, the message refused."""
        try:
            hdr = Header.unpack(frames[1].buffer) if len(frames) > 1 else Header.unpack(b"")
        except ProtocolError as exc:
            self._refuse(identity, None, str(exc))
            return None
        if not hmac.compare_digest(hdr.credential, self.me.cred):
            self._refuse(identity, hdr, "authentication failed: wrong token")
            return None
        if hdr.kind in _DATA_KINDS and hdr.epoch != self.me.epoch:
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

    def _frame_values(self, k: int, cnt: int, fr: zmq.Frame) -> np.ndarray:
        """A PUT frame's elements of field ``k``, its size checked (``cnt`` elements)."""
        f = self.fields[k]
        if fr.buffer.nbytes != cnt * f.itemsize:
            raise ProtocolError(f"field {f.name!r}: a frame of {fr.buffer.nbytes} bytes for {cnt} {f.dtype} elements "
                                f"({cnt * f.itemsize} bytes; truncated or oversize, or another dtype)")
        return np.frombuffer(fr.buffer, dtype=f.dtype)

    def _piece(self, member: int, st: Staged, k: int, off: int, cnt: int, a: np.ndarray, finite: bool = False) -> Piece:
        """A forecast's piece ``a``, checked: not sent before for the task, finite (unless the runner found it
        so while it copied it into the slot: ``finite``)."""
        f = self.fields[k]
        if any(lo < off + cnt and off < hi for lo, hi in st.covered[k]):
            raise ProtocolError(f"field {f.name!r}: elements [{off}, {off + cnt}) were already sent for this task")
        if not finite and a.dtype.kind == "f":
            bad = first_bad(a)
            if bad is not None:
                raise ProtocolError(f"member {member}, field {f.name!r}: element {off + bad[0]} is {a[bad]} (NaN or "
                                    "Inf in the forecast)")
        return Piece(k, off, cnt, a)

    # -- PUT and GET --------------------------------------------------------------------

    def _put(self, identity: bytes, hdr: Header, frames: list[zmq.Frame]) -> None:
        def pieces(st: Staged) -> list[Piece]:
            idx = self._pieces(hdr, frames, with_data=True)
            return [self._piece(hdr.member, st, int(k), int(off), int(cnt), self._frame_values(int(k), int(cnt), fr))
                    for (k, off, cnt), fr in zip(idx, frames[1:])]

        self._stage(identity, hdr, pieces)

    def _put_slot(self, identity: bytes, hdr: Header, frames: list[zmq.Frame], slots: SlotPool) -> None:
        def pieces(st: Staged) -> list[Piece]:
            if len(frames) > 2:
                raise ProtocolError(f"{len(frames)} frames after the header of a PUT_SLOT (its index, then at most "
                                    "its finite frame)")
            idx = self._pieces(hdr, frames[:1], with_data=False)
            finite = decode_finite(frames[1].buffer, hdr.count) if len(frames) == 2 else np.zeros(hdr.count, bool)
            slot = slots.bound(hdr.task)
            if slot is None:
                raise ProtocolError(f"task {hdr.task} (member {hdr.member}) {NO_SLOT} {self.rank}: stale, or its "
                                    "state was never fetched")
            self._check_member(hdr, slot)
            out = []
            for (k, off, cnt), ok in zip(idx.tolist(), finite.tolist()):
                lo = self.store.ranges[k][0]
                out.append(self._piece(hdr.member, st, k, off, cnt, slot.views[k][off - lo:off - lo + cnt], ok))
            return out

        self._stage(identity, hdr, pieces)

    def _stage(self, identity: bytes, hdr: Header, pieces: Callable[[Staged], list[Piece]]) -> None:
        """Stage a forecast's ``pieces`` (checked: a ProtocolError refuses the message and reports the
        task's part rejected); ACK; PART_DONE once this rank's share of the task is complete."""
        if hdr.cycle != self.cycle:
            # A forecast of another cycle (a late runner): acknowledged and forgotten.
            self.socket.send_multipart([identity, hdr.reply(Kind.ACK, epoch=self.me.epoch).pack()])
            return
        try:
            st = self.staged.get(hdr.task) or Staged(hdr.member, hdr.cycle, covered=[[] for _ in self.fields])
            if st.member != hdr.member:
                raise ProtocolError(f"task {hdr.task} is member {st.member}, not {hdr.member}")
            new = pieces(st)
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

    def _check_member(self, hdr: Header, slot: Slot) -> None:
        if slot.member != hdr.member:
            raise ProtocolError(f"task {hdr.task} is member {slot.member}, not {hdr.member}")

    def _get(self, identity: bytes, hdr: Header, frames: list[zmq.Frame]) -> None:
        idx = self._get_pieces(hdr, frames)
        out: list[bytes | np.ndarray] = [identity, hdr.reply(Kind.DATA, epoch=self.me.epoch).pack(), encode_index(idx)]
        kept = self._state_for(hdr.member)
        for k, off, cnt in idx:
            lo = self.store.ranges[k][0]
            col = kept[k] if kept is not None else self.store.column(k, hdr.member)
            out.append(col[off - lo:off - lo + cnt])
        self.socket.send_multipart(out, copy=False)

    def _get_slot(self, identity: bytes, hdr: Header, frames: list[zmq.Frame], slots: SlotPool) -> None:
        """Where the member's pieces are (the store, or the slot holding a kept state) and where the task's
        forecast goes (its slot, bound now): the SLOT reply."""
        idx = self._get_pieces(hdr, frames)
        try:
            slot = slots.bind(hdr.task, hdr.member)
        except OSError as exc:
            raise ProtocolError(f"server rank {self.rank} cannot make a slot for task {hdr.task}: {exc}") from None
        self._check_member(hdr, slot)
        kept = self._state_for(hdr.member)
        at = []
        for k, off, cnt in idx.tolist():
            lo = self.store.ranges[k][0]
            f = self.fields[k]
            write = slot.offset(k, off, lo, f.itemsize)
            if kept is not None:  # the kept state goes into the slot, which the runner then reads and writes
                slot.views[k][off - lo:off - lo + cnt] = kept[k][off - lo:off - lo + cnt]
            at.append([write if kept is not None else self.store.offset(k, hdr.member, off), write])
        assert self.store.segment is not None  # a rank with slots has its store in shared memory
        where = {"read": str(slot.segment.path if kept is not None else self.store.segment.path),
                 "write": str(slot.segment.path), "at": at}
        self.socket.send_multipart([identity, hdr.reply(Kind.SLOT, epoch=self.me.epoch).pack(), encode_index(idx),
                                    encode_json(where)])

    def _get_pieces(self, hdr: Header, frames: list[zmq.Frame]) -> np.ndarray:
        """A GET's (or GET_SLOT's) checked index; the member's accepted forecast copied in first."""
        if hdr.cycle != self.cycle:
            raise ProtocolError(f"asked for cycle {hdr.cycle}, the server is in cycle {self.cycle}")
        idx = self._pieces(hdr, frames, with_data=False)
        self.flush(hdr.member)
        return idx


_SLOT_KINDS = (Kind.GET_SLOT, Kind.PUT_SLOT)
_DATA_KINDS = (Kind.PUT, Kind.GET, *_SLOT_KINDS)
