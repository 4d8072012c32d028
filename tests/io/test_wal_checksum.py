"""The write-ahead log's record checksum: a CRC-32 of every byte, checked by recovery.

A committed update is built with the log's own API (log, commit; the process then "dies"
before writing the file); its log is damaged, and :func:`enkflow.io.wal.recover` must refuse
it with :class:`RecoveryError` before writing anything. The damage is one byte in the middle
of a log page (not at a page start, where the former sampled checksum looked).
"""

from __future__ import annotations

import os
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest

from enkflow.errors import RecoveryError
from enkflow.io import wal

PAGE = 4096


def test_checksum_is_the_crc32_of_every_byte_and_chains():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, 5 * PAGE + 123, dtype=np.uint8)
    assert wal.checksum(a) == zlib.crc32(a.tobytes())
    assert wal.checksum(a[:0]) == 0
    assert wal.checksum(a[3000:], wal.checksum(a[:3000])) == wal.checksum(a)
    assert wal.checksum(a.view(np.uint8)[: 8 * 100].view(np.float64)) == zlib.crc32(a[:800].tobytes())
    base = wal.checksum(a)
    for pos in (0, 1, PAGE - 1, PAGE + 1, 2 * PAGE + 2048, a.size - 1):
        b = a.copy()
        b[pos] ^= 0x10
        assert wal.checksum(b) != base, pos
    b = a.copy()
    b[PAGE : 2 * PAGE] = 0  # a page lost (zeroed)
    assert wal.checksum(b) != base


def _log_sink(tmp_path: Path, size: int) -> tuple[wal.WriteAheadLog, wal.LogSink, str]:
    log = wal.WriteAheadLog(tmp_path / "wal", "t")
    log.prepare([size])
    uid = str(uuid.uuid4())
    return log, log.sinks(uid)[0], uid


def test_records_carry_the_crc_of_their_bytes_in_the_log(tmp_path):
    """Copied records (chained over CRC_CHUNK pieces) and staged ones."""
    rng = np.random.default_rng(1)
    big = rng.standard_normal(3 * wal.CRC_CHUNK // 8 + 5)  # more than 3 chunks, a partial last one
    small = rng.integers(0, 256, 13, dtype=np.uint8)
    log, sink, _ = _log_sink(tmp_path, big.nbytes + 64 + 4096)
    sink.put_bytes(0, 0, big)
    sink.put_bytes(0, 100, small)
    staged = sink.staging(np.dtype("<f4"), 1000, None)
    staged[:] = np.arange(1000, dtype="<f4")
    sink.put_slab(0, "v", 0, 1000, staged)
    view = sink.view
    for rec, want in zip(sink.records, (big.tobytes(), small.tobytes(), np.arange(1000, dtype="<f4").tobytes())):
        lo, n, cs = rec.log_offset, rec.nbytes, rec.crc
        assert view[lo : lo + n].tobytes() == want
        assert cs == zlib.crc32(want)
    log.close()


def _committed_update(tmp_path: Path) -> tuple[Path, Path, Path, list, bytes, bytes]:
    """A member file and a committed update of 5 pages of it whose writes never happened:
    ``(member, marker, log file, records, old bytes, bytes after the update)``."""
    rng = np.random.default_rng(2)
    member = tmp_path / "member.bin"
    old = rng.integers(0, 256, 8 * PAGE, dtype=np.uint8).tobytes()
    member.write_bytes(old)
    new = rng.integers(0, 256, 5 * PAGE, dtype=np.uint8)
    log, sink, uid = _log_sink(tmp_path, new.nbytes)
    sink.put_bytes(0, 1000, new)
    marker = wal.commit([str(member)], list(log.paths), sink.records, uid, False)
    log.committed = True  # the process dies here: the logs stay for recovery
    log_path = Path(log.paths[0])
    log.close()
    expected = old[:1000] + new.tobytes() + old[1000 + new.nbytes :]
    assert wal.pending_markers([str(member)]) == [marker]
    return member, marker, log_path, sink.records, old, expected


def _flip(path: Path, offset: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        b = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([b[0] ^ 0x01]), offset)
    finally:
        os.close(fd)


def test_recovery_refuses_a_log_with_one_byte_changed_mid_page(tmp_path):
    member, marker, log_path, records, old, expected = _committed_update(tmp_path)
    (rec,) = records
    lo, n = rec.log_offset, rec.nbytes
    # a byte in the middle of a page of the log, inside the record: neither the record's first
    # word nor a page start
    at = (lo // PAGE + 2) * PAGE + PAGE // 2 + 3
    assert lo + 8 <= at < lo + n and at % PAGE not in range(8)
    _flip(log_path, at)
    with pytest.raises(RecoveryError, match="fails its checksum") as ei:
        wal.recover(marker)
    assert ei.value.path == str(log_path)
    assert member.read_bytes() == old  # nothing written
    assert marker.exists() and log_path.exists()  # still there for an operator
    # The same log undamaged is recovered: the files end as the update meant.
    _flip(log_path, at)
    assert wal.recover(marker) == n
    assert member.read_bytes() == expected
    assert not marker.exists() and not log_path.exists()


def test_recovery_refuses_a_stale_page(tmp_path):
    """A page of the log left from an earlier content (here: zeroed, as a page never written back)."""
    member, marker, log_path, records, old, _ = _committed_update(tmp_path)
    (rec,) = records
    page = (rec.log_offset // PAGE + 3) * PAGE
    fd = os.open(log_path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes(PAGE), page)
    finally:
        os.close(fd)
    with pytest.raises(RecoveryError, match="fails its checksum"):
        wal.recover(marker)
    assert member.read_bytes() == old


def test_a_log_of_the_former_format_is_refused(tmp_path):
    """A log written with the sampled checksum (format ENKWAL01) is not read as a CRC one."""
    member, marker, log_path, _, old, _ = _committed_update(tmp_path)
    head = log_path.read_bytes()[: wal.HEADER]
    assert head.startswith(wal.MAGIC) and wal.MAGIC != b"ENKWAL01"
    fd = os.open(log_path, os.O_RDWR)
    try:
        os.pwrite(fd, b"ENKWAL01", 0)
    finally:
        os.close(fd)
    with pytest.raises(RecoveryError, match="does not belong"):
        wal.recover(marker)
    assert member.read_bytes() == old
