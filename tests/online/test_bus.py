"""The server ranks' bus record: the same bytes as ever (every rank of one server runs the same
enkflow, but a record must not change by accident: it is part of the protocol's documentation)."""

from __future__ import annotations

import struct

from enkflow.online.bus import BusMessage, BusOp


def test_a_bus_message_is_the_op_task_member_cycle_sender_record_then_its_reason():
    assert BusMessage(BusOp.PART_REJECT, 7, 3, 2, reason="bad piece").frames(1) == [
        struct.pack("<Hqqqq", 2, 7, 3, 2, 1), b"bad piece"]
    assert BusMessage(BusOp.STOP).frames(0) == [struct.pack("<Hqqqq", 6, 0, 0, 0, 0)]


def test_the_operations_keep_their_numbers_and_only_reports_go_to_rank_0():
    assert [(op.name, op.value) for op in BusOp] == [
        ("REGISTER", 0), ("PART_DONE", 1), ("PART_REJECT", 2), ("ACCEPT", 3), ("DROP", 4), ("END_FORECAST", 5),
        ("STOP", 6), ("COMPARE", 7), ("SAME", 8), ("DIFFER", 9), ("BEAT", 10)]
    assert {op for op in BusOp if op.is_report} == {BusOp.PART_DONE, BusOp.PART_REJECT, BusOp.SAME, BusOp.DIFFER}
