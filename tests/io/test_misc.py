"""Small pieces: the serial Comm's non-blocking stand-ins, Lustre hints off Lustre (the log's
checksum: test_wal_checksum.py)."""

from __future__ import annotations

import numpy as np

from enkflow.io.lustre import filesystem_type, is_lustre, setstripe
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

