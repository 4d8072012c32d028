"""The statelessness check: in the first cycle of a new study one member runs twice from the same
state, and the two forecasts must agree bit for bit.

Runners get any member in turn, so a model that keeps state of its own between
exposes would give members the wrong history. The scheduler hands the probe
member out first and second in line; every rank keeps its share of the
member's state, which GETs serve until the comparison (the first forecast is
accepted into the store meanwhile), compares its part of the repeated run with
the first forecast and reports SAME or DIFFER; rank 0 stops the study on a
difference.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from enkflow.errors import MemberError
from enkflow.online.bus import BusMessage, BusOp
from enkflow.online.data_plane import Staged
from enkflow.online.scheduler import Scheduler
from enkflow.online.store import MemoryStore


class StatelessProbe:
    """This rank's part of the check (``emit``: rank 0's event log)."""

    def __init__(self, store: MemoryStore, emit: Callable[..., None]):
        self.store, self._emit = store, emit
        self.member: int | None = None  # to run twice in the next cycle
        self._kept: dict[int, list[np.ndarray]] = {}  # by member: its state, each field's share
        self._same: set[int] = set()  # rank 0: the ranks whose part of the repeated run equals the first

    def arm(self, member: int) -> None:
        """Run ``member`` twice in the next cycle, both times from its state now."""
        self.member = member
        self._kept = {member: [self.store.column(k, member).copy() for k in range(len(self.store.own.fields))]}

    def take(self) -> int | None:
        """Rank 0, at a cycle's start: the member to run twice in it (then none)."""
        member, self.member = self.member, None
        self._same = set()
        return member

    def state_for(self, member: int) -> list[np.ndarray] | None:
        """The state a GET of ``member`` serves instead of the store's (None: the store's)."""
        return self._kept.get(member)

    def compare(self, staged: Staged | None, member: int) -> str | None:
        """This rank's part of the repeated run (``staged``) against the member's first forecast:
        where they differ, or None where they agree bit for bit."""
        self._kept.pop(member, None)
        if staged is None:
            return "its part did not arrive"
        for p in staged.pieces:
            lo = self.store.ranges[p.field][0]
            first = self.store.column(p.field, member)[p.offset - lo:p.offset - lo + p.count]
            again = p.values
            if first.tobytes() != again.tobytes():
                bad = np.flatnonzero(first.view(f"u{first.itemsize}") != again.view(f"u{first.itemsize}"))
                i = int(bad[0])
                name = self.store.own.fields[p.field].name
                return f"field {name!r}, element {p.offset + i}: {first[i].item()!r} then {again[i].item()!r}"
        return None

    def verdict(self, msg: BusMessage, sched: Scheduler, n_active: int) -> None:
        """Rank 0: a rank's SAME or DIFFER; a difference stops the study (:class:`MemberError`), the
        last of ``n_active`` SAMEs resolves the scheduler's probe."""
        if msg.op is BusOp.DIFFER:
            self._emit("stateless_check", cycle=sched.cycle, member=msg.member, ok=False, reason=msg.reason)
            raise MemberError(f"the model is not stateless: run twice from the same state, member {msg.member} gave "
                              f"different forecasts ({msg.reason}). Runners get any member in turn, so the model must "
                              "keep no state of its own between exposes (set [online] stateless_check = false only if "
                              "the difference is expected, e.g. a stochastic model)",
                              member=msg.member, cycle=sched.cycle)
        self._same.add(msg.rank)
        if len(self._same) == n_active:
            sched.probe_resolved()
            self._emit("stateless_check", cycle=sched.cycle, member=msg.member, ok=True)
