"""The write-ahead log's record: the commit marker's JSON lists stay the format that crash recovery
of earlier runs reads (byte for byte), and a malformed one is refused naming the marker."""

from __future__ import annotations

import json

import pytest

from enkflow.errors import RecoveryError
from enkflow.io.logrecord import LogRecord, Slab, Target

# Records as the marker of the format before LogRecord stored them.
BYTES = [0, "b", 100, 0, 64, 8000, 3671964092]
SLAB = [3, "s", ["temp", 2, 5, "<f4"], 1, 8064, 120, 2908228089]


@pytest.mark.parametrize("raw", [BYTES, SLAB])
def test_marker_lists_decode_and_encode_to_the_same_bytes(raw):
    rec = LogRecord.decode(json.loads(json.dumps(raw)), "m.json")
    assert json.dumps(rec.encode(), separators=(",", ":")) == json.dumps(raw, separators=(",", ":"))


def test_fields_are_named():
    b = LogRecord.decode(BYTES, "m.json")
    assert (b.member, b.dest, b.log, b.log_offset, b.nbytes, b.checksum, b.target) == (0, 100, 0, 64, 8000, 3671964092, Target.BYTES)
    s = LogRecord.decode(SLAB, "m.json")
    assert s.dest == Slab("temp", 2, 5, "<f4") and s.target is Target.SLAB
    assert s.in_log(4).encode() == [3, "s", ["temp", 2, 5, "<f4"], 4, 8064, 120, 2908228089]


@pytest.mark.parametrize("raw", [BYTES[:6], [0, "x", *BYTES[2:]], [0, "b", "100", *BYTES[3:]],
                                 [3, "s", ["temp", 2, 5], *SLAB[3:]], [True, *BYTES[1:]], {"member": 0}])
def test_a_malformed_record_names_the_marker(raw):
    with pytest.raises(RecoveryError, match="malformed") as ei:
        LogRecord.decode(raw, "/x/.enkflow-update-k.json")
    assert ei.value.path == "/x/.enkflow-update-k.json"
