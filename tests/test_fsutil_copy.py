"""``fsutil.copy_range``: a byte range of one open file to the same place of another, in the kernel
where the file systems allow it, else through the process; and the way it took."""

from __future__ import annotations

import errno
import os

import pytest

from enkflow import fsutil
from enkflow.fsutil import CopyWay, copy_range

SIZE = 3 * (1 << 20) + 12345


def _files(tmp_path, size: int = SIZE) -> tuple[bytes, int, int]:
    data = os.urandom(size)
    (tmp_path / "src").write_bytes(data)
    (tmp_path / "dst").write_bytes(bytes(size))
    return data, os.open(tmp_path / "src", os.O_RDONLY), os.open(tmp_path / "dst", os.O_RDWR)


def _no_kernel_copy(*a: object) -> int:
    raise OSError(errno.EXDEV, "Invalid cross-device link")


@pytest.mark.parametrize("kernel", [True, False])
def test_a_range_lands_at_its_offset_and_nothing_else_changes(tmp_path, monkeypatch, kernel):
    data, src, dst = _files(tmp_path)
    if not kernel:
        monkeypatch.setattr(fsutil, "_PROCESS_COPY_BYTES", 1 << 20)  # several rounds of the buffer
        monkeypatch.setattr(os, "copy_file_range", _no_kernel_copy)
    try:
        way = copy_range(src, dst, 1000, SIZE - 2000)
    finally:
        os.close(src), os.close(dst)
    got = (tmp_path / "dst").read_bytes()
    assert got[1000:SIZE - 1000] == data[1000:SIZE - 1000]
    assert got[:1000] == bytes(1000) and got[SIZE - 1000:] == bytes(1000)
    # Linux copies between two files of one file system in the kernel (its generic splice at the least).
    assert way is (CopyWay.KERNEL if kernel else CopyWay.PROCESS)


def test_a_source_that_ends_before_the_range_is_an_error(tmp_path):
    _, src, dst = _files(tmp_path, 5000)
    try:
        with pytest.raises(OSError, match="ends at byte 5000") as err:
            copy_range(src, dst, 0, 8000)
    finally:
        os.close(src), os.close(dst)
    assert err.value.errno == errno.EIO


def test_a_real_error_of_the_kernel_copy_is_raised(tmp_path, monkeypatch):
    def broken(*a: object) -> int:
        raise OSError(errno.EIO, "Input/output error")

    _, src, dst = _files(tmp_path, 5000)
    monkeypatch.setattr(os, "copy_file_range", broken)
    try:
        with pytest.raises(OSError, match="Input/output error"):
            copy_range(src, dst, 0, 5000)
    finally:
        os.close(src), os.close(dst)
