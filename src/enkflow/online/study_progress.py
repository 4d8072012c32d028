"""The progress of an online study as its supervisor shows it, read from the events the server writes.

The server runs in a job of its own, so ``enkflow run`` follows ``EXPDIR/events.jsonl`` from where it
ended when the run began: per cycle the members whose forecast is in and the runners alive (a bar of
:mod:`enkflow.progress` on a terminal, else a line whenever either changes, as offline mode's ``cycle 1: 3/8 members done``),
each rescheduled member with its cause, then the analysis's time and OmB -> OmA. It also keeps what
tells why a runner ended (:mod:`enkflow.online.process_ends`): whether any runner joined the server, the
HELLOs the server refused, and the runner whose failure made the server stop the study.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from enkflow.progress import Counter

ERROR_CHARS = 300  # of a rescheduled member's error, on its progress line


class StudyProgress:
    """Follows the event log ``events`` of a study of ``members`` members; ``say`` receives the lines, and
    ``bar_stream``, where it is a terminal, shows the members done as a bar instead of a line per change."""

    def __init__(self, events: Path, members: int, say: Callable[[str], None], bar_stream: TextIO | None = None):
        self.path, self.members, self.say = events, members, say
        self._tty = bar_stream if bar_stream is not None and bar_stream.isatty() else None
        self._offset = events.stat().st_size if events.exists() else 0
        self.any_joined = False  # some runner joined the server since this run began
        self.refused: dict[int, str] = {}  # runner id -> why the server refused its HELLO
        self.failed_by: int | None = None  # the id of the runner whose failure made a member fail for good
        self._alive: set[int] = set()  # the ids of the runners joined to the current server
        self._recovered: set[int] = set()  # forecasts a restarted server found checkpointed
        self._cycle: int | None = None
        self._t0 = 0.0  # the cycle's start, the server's clock (s)
        self._done: set[int] = set()
        self._shown: tuple[int, int] | None = None
        self._bar: Counter | None = None

    def poll(self) -> None:
        """Read the events appended since the last call; say what changed."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return
        complete = data[:data.rfind(b"\n") + 1]  # a line still being written waits for the next call
        self._offset += len(complete)
        for raw in complete.splitlines():
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict):
                self._on(rec)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _on(self, rec: dict[str, Any]) -> None:
        event = rec.get("event")
        if event == "server_start":
            self._alive.clear()  # a new server: its runners greet it again
        elif event == "online_start":
            self._recovered = set(rec.get("recovered_forecasts") or ())
        elif event == "cycle_start":
            self.close()
            self._cycle, self._t0, self._shown = rec.get("cycle"), float(rec.get("t", 0.0)), None
            self._done, self._recovered = set(self._recovered), set()
        elif event == "task_done" and rec.get("cycle") == self._cycle:
            self._done.add(int(rec.get("member", 0)))
        elif event == "runner_join":
            self.any_joined = True
            self._alive.add(int(rec.get("id", 0)))
        elif event in ("runner_lost", "runner_leave"):
            self._alive.discard(int(rec.get("id", 0)))
        elif event in ("online_reject", "experiment_fail"):
            self._on_failure(rec)
            return
        elif event == "task_requeue":
            error = str(rec.get("error") or "")[:ERROR_CHARS]
            self._line(f"cycle {rec.get('cycle')}: member {rec.get('member')} rescheduled ({rec.get('reason')})"
                       + (f": {error}" if error else ""))
        elif event == "online_cycle_end":
            self.close()
            self._line(f"cycle {rec.get('cycle')}: analysis done ({float(rec.get('analysis_s', 0.0)):.2f} s), "
                       f"omb {float(rec.get('omb_rms', float('nan'))):.4g} -> oma {float(rec.get('oma_rms', float('nan'))):.4g}")
            self._cycle = None
            return
        else:
            return
        self._show(float(rec.get("t", self._t0)))

    def _on_failure(self, rec: dict[str, Any]) -> None:
        """A HELLO refused, or the member failed for good, with the runner's id where the server knew it."""
        who = rec.get("id")
        if not isinstance(who, int):
            return
        if rec.get("event") == "online_reject":
            self.refused[who] = str(rec.get("reason") or "")
        else:
            self.failed_by = who

    def _show(self, t: float) -> None:
        """The current cycle's members done and runners alive, where they changed."""
        if self._cycle is None or (len(self._done), len(self._alive)) == self._shown:
            return
        self._shown = (len(self._done), len(self._alive))
        if self._tty is None:
            self.say(f"cycle {self._cycle}: {len(self._done)}/{self.members} members done, {self._runners()} "
                     f"({t - self._t0:.1f} s)")
            return
        if self._bar is None:
            self._bar = Counter(f"cycle {self._cycle}: members done", self._tty)
        self._bar(len(self._done), self.members, self._runners())

    def _runners(self) -> str:
        n = len(self._alive)
        return f"{n} runner{'' if n == 1 else 's'} alive"

    def _line(self, text: str) -> None:
        if self._bar is not None:
            self._bar.clear()  # the line above the bar, not through it; the next count draws it again
        self.say(text)
