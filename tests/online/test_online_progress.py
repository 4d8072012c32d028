"""The supervisor's progress of an online study, from the events its server writes: a line per change off a
terminal (as offline mode's), a bar on one; only what was appended since the run began."""

from __future__ import annotations

import io
import json
from pathlib import Path

from enkflow.online.study_progress import StudyProgress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _append(path: Path, *events: dict) -> None:
    with open(path, "a") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")


CYCLE = [
    {"event": "server_start", "t": 0.0},
    {"event": "online_start", "t": 1.0, "recovered_forecasts": [3]},
    {"event": "cycle_start", "t": 1.0, "cycle": 2},
    {"event": "runner_join", "t": 1.5, "id": 11},
    {"event": "runner_join", "t": 1.6, "id": 12},
    {"event": "task_done", "t": 2.0, "cycle": 2, "member": 1},
    {"event": "task_requeue", "t": 2.1, "cycle": 2, "member": 2, "reason": "failed", "error": "runner a:1: ValueError: x"},
    {"event": "runner_leave", "t": 2.2, "id": 11},
    {"event": "task_done", "t": 3.0, "cycle": 2, "member": 2},
    {"event": "online_cycle_end", "t": 3.5, "cycle": 2, "analysis_s": 0.0123, "omb_rms": 0.01058, "oma_rms": 0.009206},
]


def test_lines_off_a_terminal_from_the_events_appended_since_the_start(tmp_path) -> None:
    events = tmp_path / "events.jsonl"
    _append(events, {"event": "cycle_start", "t": 0.0, "cycle": 1}, {"event": "runner_join", "t": 0.1, "id": 9})
    lines: list[str] = []
    progress = StudyProgress(events, 3, lines.append, bar_stream=io.StringIO())
    with open(events, "a") as fh:
        fh.write(json.dumps(CYCLE[0]))  # a line still being written: read once complete
    progress.poll()
    assert lines == [] and not progress.any_joined
    with open(events, "a") as fh:
        fh.write("\n")
    _append(events, *CYCLE[1:])
    progress.poll()
    assert progress.any_joined
    assert lines == [
        "cycle 2: 1/3 members done, 0 runners alive (0.0 s)",  # member 3 recovered from the checkpoints
        "cycle 2: 1/3 members done, 1 runner alive (0.5 s)",
        "cycle 2: 1/3 members done, 2 runners alive (0.6 s)",
        "cycle 2: 2/3 members done, 2 runners alive (1.0 s)",
        "cycle 2: member 2 rescheduled (failed): runner a:1: ValueError: x",
        "cycle 2: 2/3 members done, 1 runner alive (1.2 s)",
        "cycle 2: 3/3 members done, 1 runner alive (2.0 s)",
        "cycle 2: analysis done (0.01 s), omb 0.01058 -> oma 0.009206",
    ], lines


def test_a_bar_on_a_terminal(tmp_path) -> None:
    events = tmp_path / "events.jsonl"
    lines: list[str] = []
    tty = Tty()
    progress = StudyProgress(events, 3, lines.append, bar_stream=tty)
    _append(events, *CYCLE)
    progress.poll()
    assert lines == ["cycle 2: member 2 rescheduled (failed): runner a:1: ValueError: x",
                     "cycle 2: analysis done (0.01 s), omb 0.01058 -> oma 0.009206"], lines
    assert "cycle 2: members done" in tty.getvalue() and "/3 [" in tty.getvalue() and "1 runner alive" in tty.getvalue()
