"""The write-ahead log's checksums (format 3: XXH3-64 of every byte) and its older formats.

A committed update is built with the log's own API (log, commit; the process then "dies" before
writing the file); one byte of it is changed (the log header, a record's data or padding, the
commit marker that holds the record table), and :func:`enkflow.io.wal.recover` must refuse it with
:class:`RecoveryError` before writing anything. A log of format 2 (CRC-32, the release before) is
still recovered; format 1 and unknown formats are refused naming the log and its version.
"""

from __future__ import annotations

import json
import re
import os
import shutil
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest
import xxhash

from enkflow.errors import RecoveryError
from enkflow.io import wal, walformat
from enkflow.io.lustre import filesystem_type

PAGE = 4096


def test_checksum_is_the_xxh3_of_every_byte_and_streams():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, 5 * PAGE + 123, dtype=np.uint8)
    assert walformat.checksum(a) == xxhash.xxh3_64_intdigest(a.tobytes())
    assert walformat.checksum(a, walformat.LogFormat.CRC32) == zlib.crc32(a.tobytes())
    for fmt in walformat.LogFormat:
        d = walformat.Digest(fmt)
        for lo in range(0, a.size, 3000):
            d.update(a[lo : lo + 3000])
        assert d.value == walformat.checksum(a, fmt)
    assert walformat.checksum(a[: 8 * 100].view(np.float64)) == xxhash.xxh3_64_intdigest(a[:800].tobytes())
    base = walformat.checksum(a)
    for pos in (0, 1, PAGE - 1, PAGE + 1, 2 * PAGE + 2048, a.size - 1):
        b = a.copy()
        b[pos] ^= 0x10
        assert walformat.checksum(b) != base, pos
    b = a.copy()
    b[PAGE : 2 * PAGE] = 0  # a page lost (zeroed)
    assert walformat.checksum(b) != base


@pytest.fixture(params=["disk", "tmpfs"])
def log_dir(request, tmp_path):
    """A log directory on the test's file system (logs written with pwrite) or on /dev/shm (mapped)."""
    if request.param == "disk":
        yield tmp_path / "wal"
        return
    if filesystem_type("/dev/shm") != "tmpfs":
        pytest.skip("/dev/shm is not a tmpfs here: no mapped log to test")
    d = Path("/dev/shm") / f"enkflow-test-wal-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _log_sink(directory: Path, size: int) -> tuple[wal.WriteAheadLog, wal.LogSink, str]:
    log = wal.WriteAheadLog(directory, "t")
    log.prepare([size])
    uid = str(uuid.uuid4())
    return log, log.sinks(uid)[0], uid


def test_records_carry_the_checksum_of_their_bytes_and_padding(log_dir):
    """Records written in pieces (more than 3, a partial last one), a small one, a staged one."""
    rng = np.random.default_rng(1)
    big = rng.standard_normal(3 * max(wal.PIECE, wal.WRITE_PIECE) // 8 + 5)
    small = rng.integers(0, 256, 13, dtype=np.uint8)
    log, sink, _ = _log_sink(log_dir, big.nbytes + 64 + 4096)
    assert (sink.view is not None) == (filesystem_type(log_dir) == "tmpfs")
    sink.put_bytes(0, 0, big)
    sink.put_bytes(0, 100, small)
    staged = sink.staging(np.dtype("<f4"), 1001, wal.Scratch(8192))
    staged[:] = np.arange(1001, dtype="<f4")
    sink.put_slab(0, "v", 0, 1001, staged)
    data = Path(log.paths[0]).read_bytes()
    for rec, want in zip(sink.records, (big.tobytes(), small.tobytes(), np.arange(1001, dtype="<f4").tobytes())):
        lo, n = rec.log_offset, rec.nbytes
        assert lo % 8 == 0 and n == len(want)
        padded = want + bytes(walformat.padding(n))
        assert data[lo : lo + len(padded)] == padded
        assert rec.checksum == xxhash.xxh3_64_intdigest(padded)
    log.close()


def _committed_update(directory: Path, member: Path) -> tuple[Path, Path, list, bytes, bytes]:
    """A member file and a committed update of it whose writes never happened: two records (5 pages
    and 13 bytes, so the second has padding). ``(marker, log file, records, old bytes, bytes after
    the update)``."""
    rng = np.random.default_rng(2)
    old = rng.integers(0, 256, 8 * PAGE, dtype=np.uint8).tobytes()
    member.write_bytes(old)
    new = rng.integers(0, 256, 5 * PAGE, dtype=np.uint8)
    tail = rng.integers(0, 256, 13, dtype=np.uint8)
    log, sink, uid = _log_sink(directory, new.nbytes + 64)
    sink.put_bytes(0, 1000, new)
    sink.put_bytes(0, 7 * PAGE, tail)
    marker = wal.commit([str(member)], list(log.paths), sink.records, uid, False)
    log.committed = True  # the process dies here: the logs stay for recovery
    log_path = Path(log.paths[0])
    log.close()
    b = bytearray(old)
    b[1000 : 1000 + new.nbytes] = new.tobytes()
    b[7 * PAGE : 7 * PAGE + 13] = tail.tobytes()
    assert wal.pending_markers([str(member)]) == [marker]
    return marker, log_path, sink.records, old, bytes(b)


def _flip(path: Path, offset: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        b = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([b[0] ^ 0x01]), offset)
    finally:
        os.close(fd)


def _log_positions(records: list) -> dict[str, int]:
    big, small = records
    return {
        "header magic": 0, "header update id": 20, "header padding": 50, "header checksum": 60,
        "record 1 first byte": big.log_offset, "record 1 mid-page": (big.log_offset // PAGE + 2) * PAGE + PAGE // 2 + 3,
        "record 1 last byte": big.log_offset + big.nbytes - 1, "record 2 first byte": small.log_offset,
        "record 2 last byte": small.log_offset + small.nbytes - 1, "record 2 padding": small.log_offset + small.nbytes + 1,
    }


@pytest.mark.parametrize("where", list(_log_positions([wal.LogRecord(0, 0, 0, 64, 5 * PAGE, 0), wal.LogRecord(0, 0, 0, 64 + 5 * PAGE, 13, 0)])))
def test_a_byte_changed_anywhere_in_the_log_is_caught(tmp_path, log_dir, where):
    member = tmp_path / "member.bin"
    marker, log_path, records, old, expected = _committed_update(log_dir, member)
    at = _log_positions(records)[where]
    _flip(log_path, at)
    with pytest.raises(RecoveryError) as ei:
        wal.recover(marker)
    assert ei.value.path == str(log_path)
    assert member.read_bytes() == old  # nothing written
    assert marker.exists() and log_path.exists()  # still there for an operator
    _flip(log_path, at)  # the same log undamaged is recovered: the file ends as the update meant
    assert wal.recover(marker) == 5 * PAGE + 13
    assert member.read_bytes() == expected
    assert not marker.exists() and not log_path.exists()


@pytest.mark.parametrize("where", ["version", "files", "records", "record checksum", "own checksum"])
def test_a_byte_changed_in_the_commit_marker_is_caught(tmp_path, where):
    member = tmp_path / "member.bin"
    marker, log_path, records, old, expected = _committed_update(tmp_path / "wal", member)
    text = marker.read_text()
    anchor, past = {"version": ('"version":', 10), "files": ("member.bin", 2), "records": ('"records":[[0,"b",1000', 18),
                    "record checksum": (str(records[0].checksum), 2), "own checksum": ('"checksum":', 12)}[where]
    at = text.index(anchor) + past
    _flip(marker, at)
    for find_or_finish in (lambda: wal.pending_markers([str(member)]), lambda: wal.recover(marker)):
        with pytest.raises(RecoveryError) as ei:
            find_or_finish()
        assert ei.value.path == str(marker)
    assert member.read_bytes() == old
    _flip(marker, at)
    wal.recover(marker)
    assert member.read_bytes() == expected


def _format2_update(tmp_path: Path, damage: bool = False) -> tuple[Path, Path, Path, bytes, bytes]:
    """A committed update as the release before format 3 left it: marker version 1, log ``ENKWAL02``,
    CRC-32 per record, no padding in the checksum. ``(member, marker, log, old bytes, new file bytes)``."""
    rng = np.random.default_rng(3)
    member = tmp_path / "member.bin"
    old = rng.integers(0, 256, 4 * PAGE, dtype=np.uint8).tobytes()
    member.write_bytes(old)
    new = rng.integers(0, 256, 2 * PAGE + 5, dtype=np.uint8).tobytes()
    uid = str(uuid.uuid4())
    log = tmp_path / "wal" / "enkflow-wal-old-1-0.log"
    log.parent.mkdir()
    stored = bytearray(new)
    if damage:
        stored[PAGE + 7] ^= 0x01
    log.write_bytes((b"ENKWAL02" + uid.encode()).ljust(64, b"\0") + bytes(stored))
    body = {"version": 1, "id": uid, "host": "h", "time": 1.0, "files": [str(member)], "logs": [str(log)], "durable": False,
            "records": [[0, "b", 100, 0, 64, len(new), zlib.crc32(new)]], "completion": None}
    marker = wal.marker_path([str(member)])
    marker.write_text(json.dumps(body))
    return member, marker, log, old, old[:100] + new + old[100 + len(new) :]


def test_an_update_committed_in_log_format_2_is_still_finished(tmp_path):
    member, marker, log, old, expected = _format2_update(tmp_path)
    assert wal.recover(marker) == 2 * PAGE + 5
    assert member.read_bytes() == expected
    assert not marker.exists() and not log.exists()


def test_a_damaged_log_of_format_2_is_refused(tmp_path):
    member, marker, log, old, _ = _format2_update(tmp_path, damage=True)
    with pytest.raises(RecoveryError, match="fails its checksum"):
        wal.recover(marker)
    assert member.read_bytes() == old


@pytest.mark.parametrize("magic, says", [(b"ENKWAL01", "version 1 (ENKWAL01) was written by an earlier enkflow release"),
                                         (b"ENKWAL09", "version 9 (ENKWAL09) was written by a later enkflow release"),
                                         (b"GARBAGE!", "not an enkflow log")])
def test_a_log_of_a_format_not_read_is_refused_naming_it(tmp_path, magic, says):
    member, marker, log, old, _ = _format2_update(tmp_path)
    _overwrite(log, magic)
    with pytest.raises(RecoveryError, match=re.escape(says)) as ei:
        wal.recover(marker)
    assert ei.value.path == str(log)
    assert "delete the marker" in str(ei.value) and str(marker) in str(ei.value)
    assert member.read_bytes() == old and marker.exists()  # never silently ignored


def _overwrite(path: Path, head: bytes) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, head, 0)
    finally:
        os.close(fd)


@pytest.mark.parametrize("garble, says", [(lambda b: [1, 2], "not a JSON object"),
                                          (lambda b: {k: v for k, v in b.items() if k != "logs"}, "lacks or garbles"),
                                          (lambda b: {**b, "records": [[3, *b["records"][0][1:]]]}, "does not list")])
def test_a_format_2_marker_that_is_json_but_not_a_marker_is_refused_naming_it(tmp_path, garble, says):
    """A marker without a checksum of its own (format 2) that parses but is not what it should be: a
    RecoveryError naming it (every rank agrees on an EnkflowError; another exception would hang MPI ranks)."""
    member, marker, log, old, _ = _format2_update(tmp_path)
    marker.write_text(json.dumps(garble(json.loads(marker.read_text()))))
    with pytest.raises(RecoveryError, match=says) as ei:
        wal.recover(marker)
    assert ei.value.path == str(marker)
    assert member.read_bytes() == old
