"""Time accounting from synthetic event logs."""

from __future__ import annotations

import pytest

from enkflow.report import _union_length, cycle_timings


def test_union_length_merges_and_clips() -> None:
    assert _union_length([(0, 2), (1, 3), (5, 6)], 0, 10) == pytest.approx(4.0)
    assert _union_length([(0, 2), (1, 3), (5, 6)], 1.5, 5.5) == pytest.approx(2.0)
    assert _union_length([], 0, 1) == 0.0


def test_cycle_figures_add_up_and_queue_is_time_without_running_jobs() -> None:
    ev = [
        {"t": 0.0, "event": "cycle_start", "cycle": 1},
        {"t": 0.1, "event": "job_submit", "cycle": 1, "job": "a"},
        {"t": 0.1, "event": "job_submit", "cycle": 1, "job": "b"},
        {"t": 4.0, "event": "job_start", "cycle": 1, "job": "a", "worker": "wa"},
        {"t": 4.1, "event": "task_start", "cycle": 1, "task": 1, "member": 1, "worker": "wa"},
        {"t": 6.0, "event": "job_start", "cycle": 1, "job": "b", "worker": "wb"},
        {"t": 6.1, "event": "task_start", "cycle": 1, "task": 2, "member": 2, "worker": "wb"},
        {"t": 7.1, "event": "task_end", "cycle": 1, "task": 1, "member": 1, "worker": "wa", "run_s": 3.0, "io_s": 0.5},
        {"t": 9.1, "event": "task_end", "cycle": 1, "task": 2, "member": 2, "worker": "wb", "run_s": 3.0, "io_s": 0.25},
        {"t": 9.2, "event": "job_end", "cycle": 1, "job": "a", "worker": "wa"},
        {"t": 9.2, "event": "task_start", "cycle": 1, "task": 3, "member": None, "worker": "wb"},
        {"t": 11.2, "event": "task_end", "cycle": 1, "task": 3, "member": None, "worker": "wb", "run_s": 2.0,
         "timings": {"read_s": 0.5, "write_s": 0.5, "compute_s": 1.0}},
        {"t": 11.3, "event": "job_end", "cycle": 1, "job": "b", "worker": "wb"},
        {"t": 11.5, "event": "cycle_end", "cycle": 1},
    ]
    (c,) = cycle_timings(ev)
    assert c.total == pytest.approx(11.5)
    assert c.queuing == pytest.approx(4.0 + 0.2)  # before job a started, and after job b ended
    assert c.io == pytest.approx(1.0)
    assert c.running == pytest.approx((9.1 - 4.1) + (11.2 - 9.2) - 1.0)  # union of task intervals, less analysis I/O
    assert c.queuing + c.running + c.io + c.overhead == pytest.approx(c.total)
    assert c.member_io == pytest.approx(0.75)
    assert c.analysis_compute == pytest.approx(1.0)
    assert c.members[1]["wait_s"] == pytest.approx(4.1) and c.members[2]["wait_s"] == pytest.approx(6.1)
