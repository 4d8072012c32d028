"""A server rank's task slots: shared-memory segments into which runners on its node write forecasts.

A slot holds one task's forecast on this rank: every field's share, one
column's worth (:mod:`enkflow.online.segments`). It is bound to a task from
the task's first GET_SLOT until the forecast is accepted and copied into the
member's columns (then it is free for another task), or until the task is
dropped, found stale or its cycle ends: then it is *retired*, unlinked and
unmapped, never reused, so a late writer that still has it mapped writes into
memory nobody reads. The free pool grows on demand, and ahead of it: while no
slot is free, the rank's loop makes a spare one in small steps when it has
nothing else to do (:meth:`SlotPool.prepare`), so that a task's GET_SLOT
rarely waits for a new slot (for a 52 MB slot, its making and first touch take
30 ms or more, which a model would otherwise pay inside its restart read). The
price: one slot's memory that may go unused (a rank whose runners all exchange
over TCP makes one spare and never binds it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enkflow.online.fields import Field
from enkflow.online.segments import SLOT_MAGIC, Segment, SegmentMaker


@dataclass
class Slot:
    """A slot segment; ``member`` of the task bound to it (0: free). ``views[k]``: field ``k``'s share,
    ``(hi - lo,)`` elements of ``ranges[k]``."""

    segment: Segment
    views: list[np.ndarray]
    member: int = 0

    def offset(self, field: int, element: int, lo: int, itemsize: int) -> int:
        """Byte offset in the slot of element ``element`` of field ``field`` (whose share starts at ``lo``)."""
        return self.segment.regions[field] + (element - lo) * itemsize


class SlotPool:
    """This rank's slots for ``fields`` with the share ``ranges[k] = (lo, hi)``; ``nonce`` and ``epoch`` go in
    every slot's header."""

    def __init__(self, fields: tuple[Field, ...], ranges: list[tuple[int, int]], nonce: bytes, epoch: int):
        self._fields, self._ranges, self.nonce, self._epoch = fields, ranges, nonce, epoch
        self._free: list[Slot] = []
        self._bound: dict[int, Slot] = {}
        self._making: SegmentMaker | None = None  # the spare slot under way
        self._spares = True  # False once making a spare failed (/dev/shm full): slots are then made on demand

    def bind(self, task: int, member: int) -> Slot:
        """The slot of ``task`` (member ``member``): the one bound to it, else a free one, else a new one.
        OSError when a new one cannot be made (/dev/shm full)."""
        slot = self._bound.get(task)
        if slot is None:
            slot = self._free.pop() if self._free else self._new()
            slot.member = member
            self._bound[task] = slot
        return slot

    def bound(self, task: int) -> Slot | None:
        """The slot bound to ``task`` (None: none, or it was retired)."""
        return self._bound.get(task)

    @property
    def wants_spare(self) -> bool:
        """Whether :meth:`prepare` has work: no slot is free (and spares can be made)."""
        return self._spares and not self._free

    def prepare(self, budget: int) -> None:
        """Idle time: about ``budget`` more bytes of a spare slot made; once complete, it is free. A failure
        (/dev/shm full) ends the making of spares: a later GET_SLOT then reports it."""
        try:
            if self._making is None:
                self._making = self._maker()
            if self._making.step(budget):
                self._free.append(self._slot(self._making))
                self._making = None
        except OSError:
            self._making, self._spares = None, False

    def release(self, task: int) -> None:
        """``task``'s forecast was copied out of its slot: the slot is free for another task."""
        slot = self._bound.pop(task, None)
        if slot is not None:
            slot.member = 0
            self._free.append(slot)

    def retire(self, task: int) -> None:
        """``task`` is dropped or stale: its slot is unlinked and unmapped, never reused."""
        slot = self._bound.pop(task, None)
        if slot is not None:
            slot.views.clear()
            slot.segment.close()

    def retire_bound(self) -> None:
        """The cycle ended: retire every slot still bound (their tasks are stale)."""
        for task in list(self._bound):
            self.retire(task)

    def close(self) -> None:
        """Unlink and unmap every slot, and the spare under way."""
        self.retire_bound()
        for slot in self._free:
            slot.views.clear()
            slot.segment.close()
        self._free.clear()
        if self._making is not None:
            self._making.abandon()
            self._making = None

    def _new(self) -> Slot:
        """A slot now: the spare under way finished, or a new one. What is left is not touched: with many
        runners starting at once, their models clear their slots' pages in parallel, not this rank."""
        maker, self._making = self._making or self._maker(), None
        maker.step(None, touch=False)
        return self._slot(maker)

    def _maker(self) -> SegmentMaker:
        return SegmentMaker(SLOT_MAGIC, [(hi - lo) * f.itemsize for f, (lo, hi) in zip(self._fields, self._ranges)],
                            self.nonce, self._epoch)

    def _slot(self, maker: SegmentMaker) -> Slot:
        seg = maker.made()
        views = [seg.array(k, f.dtype, (hi - lo, 1))[:, 0] for k, (f, (lo, hi)) in enumerate(zip(self._fields, self._ranges))]
        return Slot(seg, views)
