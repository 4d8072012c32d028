"""Crash-safe small-file primitives used by every layer.

A state file is replaced atomically (write a temporary sibling, fsync, rename
over the old one, fsync the directory): a reader, or a process started after a
``kill -9``, sees the old or the new content, never a mixture. A write that
fails (disk full, quota, read-only file system) raises
:class:`~enkflow.errors.StorageError` naming the file and what to do, and
leaves the old content in place.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any

from enkflow.errors import StorageError


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this node (the owner of a temporary file, say); one that
    exists but belongs to another user counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename inside directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_full(fd: int, buf, offset: int) -> None:
    """Write every byte of ``buf`` (any contiguous buffer) at byte ``offset`` of ``fd`` (pwrite may write less)."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    mv = mv.cast("B")
    done = 0
    while done < len(mv):
        done += os.pwrite(fd, mv[done:], offset + done)


class CopyWay(str, Enum):
    """How :func:`copy_range` moved the bytes."""

    KERNEL = "copy_file_range"  # the file system copied them (server-side on NFS 4.2 and Lustre)
    PROCESS = "copy"  # read into this process and written from it, for all or part of the range


_PROCESS_COPY_BYTES = 16 << 20  # the buffer of a copy through this process
# copy_file_range's ways of saying "not between these files": then this process copies.
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP)


def copy_range(src: int, dst: int, offset: int, nbytes: int) -> CopyWay:
    """Bytes ``[offset, offset + nbytes)`` of the open file ``src`` to the same place of ``dst``: by
    ``copy_file_range`` (no byte passes through this process) where the file systems allow it, else
    through a buffer of 16 MiB. A ``src`` that ends before ``offset + nbytes`` raises ``OSError(EIO)``."""
    done, way, buf = 0, CopyWay.KERNEL, None
    while done < nbytes:
        k = 0
        if way is CopyWay.KERNEL:
            try:
                k = os.copy_file_range(src, dst, nbytes - done, offset + done, offset + done)
            except OSError as exc:
                if exc.errno not in _NO_KERNEL_COPY:
                    raise
        if k == 0:  # no kernel copy between these files (or src ends here): through this process
            way = CopyWay.PROCESS
            if buf is None:
                buf = bytearray(min(nbytes - done, _PROCESS_COPY_BYTES))
            view = memoryview(buf)[: min(nbytes - done, len(buf))]
            k = os.preadv(src, [view], offset + done)
            if k <= 0:
                raise OSError(errno.EIO, f"the file ends at byte {offset + done}, before byte {offset + nbytes}")
            pwrite_full(dst, view[:k], offset + done)
        done += k
    return way


@contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path`` for a library that writes a file by name (netCDF,
    HDF5); on success fsync it and rename it over ``path``. On any exception the temporary file is
    removed and ``path`` is untouched (OSErrors pass through: the caller names the file)."""
    final = Path(path)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(final.parent)


def write_bytes_atomic(path: str | os.PathLike[str], payload: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``payload`` atomically.

    ``durable=False`` skips the fsyncs: for files (heartbeats) whose loss in a
    power cut is harmless, where the rename alone gives atomicity.
    """
    p = Path(path)
    # pid and thread id make the temporary name unique among concurrent writers.
    tmp = p.with_name(f".{p.name}.tmp.{os.getpid()}.{threading.get_ident()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, p)
        if durable:
            fsync_dir(p.parent)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StorageError.from_os_error(exc, path=str(p)) from None


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, durable: bool = True) -> None:
    """Replace ``path`` with the JSON of ``data`` atomically (see :func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, json.dumps(data, sort_keys=True, separators=(",", ":")).encode(), durable=durable)


def append_line(path: str | os.PathLike[str], line: bytes) -> None:
    """Append one line with a single ``write`` on an ``O_APPEND`` descriptor, so lines of
    concurrent writers never interleave. A failure raises :class:`StorageError`; a partial
    line (disk full mid-write) is left unterminated, and readers skip it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            n = os.write(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StorageError.from_os_error(exc, path=str(path)) from None
    if n != len(line):
        raise StorageError(f"only {n} of {len(line)} bytes could be appended (file system full?)", path=str(path))


def read_json(path: str | os.PathLike[str], default: Any = None) -> Any:
    """The JSON content of ``path``, or ``default`` when the file does not exist."""
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except FileNotFoundError:
        return default
