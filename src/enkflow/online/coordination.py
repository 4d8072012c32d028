"""Rank 0's two-phase accept of a task's forecast, which the server's ranks hold in parts.

Phase one: every rank that owns elements stages its part of the forecast and
reports PART_DONE (or PART_REJECT) over the bus. Phase two: once every such
rank has its part, rank 0 records the member's forecast as done and orders
every rank to ACCEPT the task (move the staged frames into the member's
columns), or, for the repeated run of the statelessness check, to COMPARE it
with the first. A report about a task that is no longer current (requeued,
another member's data under its id) is answered with DROP: a result counts only
once, for the member's current task, so results are idempotent.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from enkflow.online.bus import BusMessage, BusOp
from enkflow.online.control import Control
from enkflow.online.probe import StatelessProbe
from enkflow.online.scheduler import Task


class Coordinator:
    """Rank 0's view of the ranks' parts. ``active``: the ranks that own elements; ``send(rank, msg)``
    delivers a bus message (to rank 0 itself at once); ``say`` reports progress."""

    def __init__(self, control: Control, probe: StatelessProbe, active: list[int], n_members: int, *,
                 send: Callable[[int, BusMessage], None], emit: Callable[..., None], say: Callable[[str], None]):
        self.control, self.sched, self.probe = control, control.sched, probe
        self.active, self.n_members = active, n_members
        self._send, self._emit, self._say = send, emit, say

    def on_report(self, msg: BusMessage) -> None:
        """A rank's report: its part of a task arrived (or was refused), or its verdict on a repeated run."""
        if msg.op in (BusOp.SAME, BusOp.DIFFER):
            self.probe.verdict(msg, self.sched, len(self.active))
            return
        t = self.sched.current(msg.task, msg.cycle)
        if t is None or t.member != msg.member:  # stale, or another member's data under this task id
            self._send(msg.rank, BusMessage(BusOp.DROP, msg.task, msg.member, msg.cycle))
            return
        if msg.op is BusOp.PART_REJECT:
            self.control.requeue(msg.task, "rejected", f"server rank {msg.rank} rejected the forecast: {msg.reason}")
            return
        t.parts.add(msg.rank)
        if len(t.parts) == len(self.active):
            self._complete(self.sched.finish(msg.task, time.monotonic()))

    def _complete(self, t: Task) -> None:
        """Every rank has its part of the task: the member's forecast is in (or, repeated, to compare)."""
        if t.repeat:
            self._order(BusOp.COMPARE, t)
            return
        self._order(BusOp.ACCEPT, t)
        self._emit("task_done", cycle=t.cycle, member=t.member, task=t.id)
        n_done = len(self.sched.done)
        if n_done % max(1, self.n_members // 10) == 0 or n_done == self.n_members:
            self._say(f"cycle {t.cycle}: {n_done}/{self.n_members} forecasts in")

    def drop(self, t: Task) -> None:
        """Every rank forgets what it staged for the task (it was taken back from its runner)."""
        self._order(BusOp.DROP, t)

    def _order(self, op: BusOp, t: Task) -> None:
        for rank in self.active:
            self._send(rank, BusMessage(op, t.id, t.member, t.cycle))
