"""Small pieces: the serial Comm's non-blocking stand-ins, Lustre hints off Lustre, checksums."""

from __future__ import annotations

import numpy as np

from enkflow.io.lustre import filesystem_type, is_lustre, setstripe
from enkflow.io.wal import checksum
from enkflow.parallel import SerialComm


def test_serial_comm_scatter_gather():
    c = SerialComm()
    src = np.arange(5.0)
    dst = np.empty(5)
    c.iscatterv(src, [5], dst).wait()
    np.testing.assert_array_equal(dst, src)
    out = np.empty(5)
    c.igatherv(dst, out, [5]).wait()
    np.testing.assert_array_equal(out, src)
    assert c.split(3) is c


def test_setstripe_is_a_noop_off_lustre(tmp_path):
    assert filesystem_type(tmp_path) != ""
    assert not is_lustre(tmp_path)
    assert setstripe(tmp_path / "new.nc") is False
    assert not (tmp_path / "new.nc").exists()


def test_checksum_samples_a_word_per_page():
    rng = np.random.default_rng(0)
    a = rng.random(3000).view(np.uint8)  # 24000 bytes: 6 pages
    lo = 4096 * 3 - 40  # the record starts 40 bytes before a page boundary of the log
    base = checksum(a, lo)
    b = a.copy()
    b[40 + 4096 * 2 : 40 + 4096 * 3] = 0  # one lost (zeroed) page of the log
    assert checksum(b, lo) != base
    c = a.copy()
    c[:8] = 0  # the record's first word
    assert checksum(c, lo) != base
    assert checksum(a[:5], 0) == int.from_bytes(bytes(a[:5]) + b"\0\0\0", "little")
    words = [0, 40, 40 + 4096, 40 + 8192, 40 + 3 * 4096, 40 + 4 * 4096, 40 + 5 * 4096]
    want = sum(int.from_bytes(bytes(a[w : w + 8]), "little") for w in words if w + 8 <= a.size) % (1 << 64)
    assert base == want
