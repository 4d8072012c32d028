"""Crash-safe in-place update: a write-ahead log of the new bytes, a commit marker, idempotent redo.

Protocol of one update (see docs/io.md):

1. *log*: every byte range about to change is written, with its final content, to log files
   (default ``.enkflow-wal/`` beside the member files, which every node sees; ``/dev/shm``, an
   explicit choice, is faster but lost with its node).
   Each record carries a checksum of every one of its bytes (:mod:`enkflow.io.walformat`).
2. *commit*: a small JSON marker listing the files, the log files and every record is written
   beside the first member file, atomically (temporary file + ``rename``).
3. *write*: the member files are updated in place.
4. *clear*: the marker is removed.

A kill before step 2 leaves no marker: the files were never touched and the half-written log
is ignored. A kill after step 2 leaves the marker: the next :func:`recover` (run by every
``EnsembleFiles`` open) verifies every record's checksum, then writes every record again and
removes the marker. A log of a format this release does not read is refused, never ignored.
Writing a record twice gives the same bytes, so recovery may itself be
killed and rerun. With ``durable=True`` the logs and marker are fsync'ed before step 3 and the
files before step 4, which extends the guarantee from process kills to power loss, provided the
log directory is on persistent storage.
"""

from __future__ import annotations

import glob
import hashlib
import json
import mmap
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enkflow.errors import RecoveryError
from enkflow.fsutil import fsync_dir, pid_alive, pwrite_full, write_bytes_atomic, write_json_atomic
from enkflow.io import library, shadow_plan
from enkflow.io.logrecord import LogRecord, Slab
from enkflow.io.lustre import filesystem_type
from enkflow.io.rowio import Scratch, pread_full
from enkflow.io.walformat import HEADER, Digest, LogFormat, log_header, marker_log_format, padding, read_header, seal_marker

MARKER_PREFIX = ".enkflow-update-"
# Bytes of a record checksummed at a time while in cache: right after their copy into a mapped
# log; right before their pwrite (whose copy reads them from the cache) into a log file. Both
# measured best for their way (benchmarks/wal_checksum.py; docs/io.md).
PIECE = 1 << 18
WRITE_PIECE = 1 << 22
_ZEROS = np.zeros(8, dtype=np.uint8)  # a record's padding
_MAPPED_FS = ("tmpfs", "ramfs")  # log file systems where a mapped log is faster than pwrite


def ensemble_key(paths: list[str]) -> str:
    """A short stable name for one ensemble of files (their absolute paths)."""
    h = hashlib.sha1("\n".join(os.path.abspath(p) for p in paths).encode())
    return h.hexdigest()[:16]


def marker_path(paths: list[str]) -> Path:
    """Where the commit marker of an update of ``paths`` lives: beside the first member file."""
    first = Path(os.path.abspath(paths[0]))
    return first.parent / f"{MARKER_PREFIX}{ensemble_key(paths)}.json"


def default_log_dir(first_file: str) -> Path:
    """The log directory when ``[io.safe_update] log_dir`` is unset: ``.enkflow-wal/`` beside the first
    member file, a place every node that can open the files sees, so a rerun on another node after a
    node loss finishes a committed update (``/dev/shm`` is faster but node-local: an explicit choice)."""
    return Path(os.path.abspath(first_file)).parent / ".enkflow-wal"


class LogSink:
    """Appends records to one log file (one per I/O thread, so threads never share a file).

    Each record is followed by zero padding to a multiple of 8 bytes and carries the checksum of
    both (:class:`~enkflow.io.walformat.Digest`), taken piece by piece while the piece is in cache.
    Two ways to write, chosen per file system by :class:`WriteAheadLog`:

    * ``view`` given (a log on tmpfs): the file stays mapped (shared, populated when the space is
      prepared); a piece (:data:`PIECE`) is copied into the mapping, then checksummed;
    * ``view`` None (a log on a disk file system): a piece (:data:`WRITE_PIECE`) is checksummed,
      then ``pwrite``; a copy
      into a mapping would take a write fault on every page the kernel has written back since the
      last update, which costs more than the copy itself (3 against 8 GB/s measured here).
    """

    def __init__(self, fd: int, view: np.ndarray | None, capacity: int, log_index: int):
        self.fd = fd
        self.view = view  # the whole log file, uint8, when mapped
        self.capacity = capacity
        self.log_index = log_index
        self.pos = HEADER
        self.records: list[LogRecord] = []
        self._staged: np.ndarray | None = None

    def close(self) -> None:
        """Nothing to release: the file and its mapping belong to the :class:`WriteAheadLog`."""
        self._staged = None

    def staging(self, dtype: np.dtype, count: int, scratch: Scratch) -> np.ndarray:
        """Where converted bytes are prepared: the next record's place in a mapped log, else ``scratch``."""
        if self.view is None:
            return scratch.view(dtype, count)
        n = count * dtype.itemsize
        self._check_room(n)
        self._staged = self.view[self.pos : self.pos + n].view(dtype)
        return self._staged

    def _check_room(self, n: int) -> None:
        if self.pos + n + padding(n) > self.capacity:
            raise RecoveryError(f"log capacity {self.capacity} bytes exceeded (internal error)", path="log")

    def _append(self, data: np.ndarray) -> tuple[int, int, int]:
        """Write ``data`` and its padding into the log (unless staged in place); returns
        ``(log offset, bytes, checksum)``."""
        lo = self.pos
        src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        n = src.size
        self._check_room(n)
        digest = Digest()
        staged, self._staged = data is self._staged, None
        step = PIECE if self.view is not None else WRITE_PIECE
        for a in range(0, n, step):
            self._put(digest, lo + a, src[a : a + step], staged)
        self._put(digest, lo + n, _ZEROS[: padding(n)], False)
        self.pos = lo + n + padding(n)
        return lo, n, digest.value

    def _put(self, digest: Digest, at: int, piece: np.ndarray, in_place: bool) -> None:
        """One piece into the log at byte ``at`` (already there when ``in_place``), and into ``digest``."""
        if self.view is None:
            digest.update(piece)
            pwrite_full(self.fd, piece, at)
            return
        dst = self.view[at : at + piece.size]
        if not in_place:
            np.copyto(dst, piece)
        digest.update(dst)

    def put_bytes(self, member: int, offset: int, data: np.ndarray) -> None:
        lo, n, cs = self._append(data)
        self.records.append(LogRecord(member, offset, self.log_index, lo, n, cs))

    def put_slab(self, member: int, var: str, i0: int, i1: int, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values)
        lo, n, cs = self._append(values)
        self.records.append(LogRecord(member, Slab(var, i0, i1, values.dtype.str), self.log_index, lo, n, cs))


@dataclass
class WriteAheadLog:
    """The log files of one I/O task. ``n_logs`` files of up to ``capacity`` bytes each are
    allocated once (:meth:`prepare`) and reused by every update until :meth:`close`. On tmpfs
    they stay mapped (``maps``, ``views``); elsewhere they are written with ``pwrite`` (:class:`LogSink`)."""

    directory: Path
    tag: str
    durable: bool = False
    fds: list[int] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    capacity: list[int] = field(default_factory=list)
    maps: list[mmap.mmap | None] = field(default_factory=list)
    views: list[np.ndarray | None] = field(default_factory=list)
    committed: bool = False  # a commit marker names these logs and the writes have not finished

    def prepare(self, sizes: list[int]) -> float:
        """Make sure log ``k`` can hold ``sizes[k]`` bytes of records, allocating the space now
        (``posix_fallocate``) so the update does not pay for it; returns the seconds spent."""
        t0 = time.perf_counter()
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.fds:
            _remove_stale_logs(self.directory, self.tag)
        for k, size in enumerate(sizes):
            need = HEADER + int(size)
            if k >= len(self.fds):
                p = self.directory / f"enkflow-wal-{self.tag}-{os.getpid()}-{k}.log"
                self.fds.append(os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600))
                self.paths.append(str(p))
                self.capacity.append(0)
                self.maps.append(None)
                self.views.append(None)
                if self.durable:  # a committed log must not lose its name in a power cut
                    fsync_dir(self.directory)
            if need > self.capacity[k]:
                self._unmap(k)
                try:
                    os.posix_fallocate(self.fds[k], 0, need)
                except OSError:  # file systems without fallocate: the writes allocate
                    os.ftruncate(self.fds[k], need)
                self.capacity[k] = need
                if filesystem_type(self.directory) not in _MAPPED_FS:
                    continue
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                mm = mmap.mmap(self.fds[k], need, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                self.maps[k] = mm
                self.views[k] = np.frombuffer(mm, dtype=np.uint8)
        return time.perf_counter() - t0

    def _unmap(self, k: int) -> None:
        self.views[k] = None
        mm = self.maps[k]
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # a view is still referenced (by an exception's traceback): unmapped when it goes
            self.maps[k] = None

    def sinks(self, update_id: str) -> list[LogSink]:
        """Fresh sinks, one per log file, after stamping each log with ``update_id``."""
        head = log_header(update_id)
        out = []
        for k, (fd, view, cap) in enumerate(zip(self.fds, self.views, self.capacity)):
            if cap == 0:
                raise RecoveryError(f"log {k} was not prepared (internal error)", path=self.paths[k])
            os.pwrite(fd, head, 0)
            out.append(LogSink(fd, view, cap, k))
        return out

    def sync(self) -> None:
        for mm, fd in zip(self.maps, self.fds):
            if mm is not None:
                mm.flush()
            os.fsync(fd)

    def close(self) -> None:
        """Close and delete the log files (they hold a copy of the state: free the tier), unless
        a committed update still needs them (``committed``: an error or a kill came between the
        commit and the end of the writes; the next open's recovery consumes and deletes them)."""
        for k in range(len(self.fds)):
            self._unmap(k)
        for fd, p in zip(self.fds, self.paths):
            os.close(fd)
            if self.committed:
                continue
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        self.fds.clear()
        self.paths.clear()
        self.capacity.clear()
        self.maps.clear()
        self.views.clear()


def _remove_stale_logs(directory: Path, tag: str) -> None:
    """Delete logs left by dead processes before they committed (they would hold tier space);
    committed logs were already consumed by :func:`recover` when the files were opened."""
    for p in glob.glob(os.path.join(glob.escape(str(directory)), f"enkflow-wal-{tag}-*-*.log")):
        try:
            pid = int(Path(p).name[len(f"enkflow-wal-{tag}-"):].split("-")[0])
            if pid == os.getpid():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                os.unlink(p)
            except OSError:
                pass
        except (ValueError, PermissionError):
            continue


def _remove_stale_tmp(directory: str) -> None:
    """Delete half-written markers of dead processes (the temporaries of
    :func:`enkflow.fsutil.write_bytes_atomic`, ``.<marker>.tmp.<pid>.<thread>``): a kill during the
    commit leaves one; it was never renamed, so the update was never committed."""
    for t in glob.glob(os.path.join(glob.escape(directory), "." + MARKER_PREFIX + "*.json.tmp.*")):
        try:
            pid = int(t.rsplit(".tmp.", 1)[1].split(".")[0])
        except (ValueError, IndexError):
            continue
        if pid != os.getpid() and not pid_alive(pid):
            try:
                os.unlink(t)
            except OSError:
                pass


def commit(files: list[str], logs: list[str], records: list[LogRecord], update_id: str, durable: bool,
           completion: dict[str, object] | None = None) -> Path:
    """Write the commit marker atomically; from now on the update will be finished whatever happens.

    ``records`` refer to ``logs`` by index (:attr:`LogRecord.log`). ``completion`` (``{"path": ..., "body":
    {...}}``) is a JSON record that is written atomically once every file is written, by the
    update or by :func:`recover`, before the marker goes: it commits together with the update, so
    its existence proves the update was applied (the analysis uses it to never apply a cycle twice)."""
    path = marker_path(files)
    body = {
        "id": update_id, "host": socket.gethostname(), "time": time.time(),
        "files": [os.path.abspath(f) for f in files], "logs": logs, "durable": durable,
        "records": [r.encode() for r in records],
        "completion": completion,
    }
    write_bytes_atomic(path, seal_marker(body), durable=durable)
    return path


def write_completion(completion: dict[str, object] | None) -> None:
    """Write an update's completion record (see :func:`commit`); nothing when there is none.
    Always durable: it is what later runs trust."""
    if completion:
        write_json_atomic(str(completion["path"]), completion["body"])


def clear(marker: Path, durable: bool) -> None:
    """The update is complete: remove its marker."""
    try:
        os.unlink(marker)
    except FileNotFoundError:
        pass
    if durable:
        fsync_dir(marker.parent)


def discard(marker: Path) -> None:
    """Drop a committed update without finishing it (the member files are being restored from
    elsewhere): delete its logs or shadows, then its marker."""
    body = json.loads(marker.read_text())
    for log in body.get("logs", []):
        Path(log).unlink(missing_ok=True)
    shadow_plan.discard_shadows(body)
    marker.unlink()


def _read_marker(marker: Path) -> dict[str, object]:
    """The JSON object of commit marker ``marker``; :class:`RecoveryError` naming it when unreadable."""
    try:
        with open(marker) as fh:
            body = json.load(fh)
    except (OSError, ValueError):
        raise RecoveryError("unreadable commit marker of an interrupted update", path=str(marker)) from None
    if not isinstance(body, dict):
        raise RecoveryError("commit marker of an interrupted update is not a JSON object", path=str(marker))
    return body


def pending_markers(files: list[str]) -> list[Path]:
    """Commit markers, in the directories of ``files``, of updates that touch any of ``files``."""
    mine = {os.path.abspath(f) for f in files}
    found = []
    for d in sorted({os.path.dirname(os.path.abspath(f)) for f in files}):
        _remove_stale_tmp(d)
        for m in sorted(glob.glob(os.path.join(glob.escape(d), MARKER_PREFIX + "*.json"))):
            body = _read_marker(Path(m))
            marker_log_format(body, m)  # a damaged marker is refused here: its file list may no longer name ours
            if mine & set(body.get("files", [])):
                found.append(Path(m))
    return found


@dataclass(frozen=True)
class _Pending:
    """A committed update read back from its marker (:func:`commit`)."""

    marker: Path
    files: list[str]
    logs: list[str]
    records: list[LogRecord]
    update_id: str
    host: str | None
    durable: bool
    completion: dict[str, object] | None
    log_format: LogFormat

    @classmethod
    def read(cls, marker: Path, body: dict[str, object]) -> _Pending:
        fmt = marker_log_format(body, str(marker))
        try:
            records = [LogRecord.decode(r, str(marker)) for r in body["records"]]
            pending = cls(marker, list(body["files"]), list(body["logs"]), records, str(body["id"]), body.get("host"),
                          bool(body.get("durable")), body.get("completion"), fmt)
        except (KeyError, TypeError, ValueError) as exc:
            # Every rank must get an EnkflowError (agreed on collectively), never a stray exception.
            raise RecoveryError(f"commit marker of an interrupted update lacks or garbles {exc}", path=str(marker)) from None
        for rec in records:
            if not (0 <= rec.log < len(pending.logs) and 0 <= rec.member < len(pending.files)):
                raise RecoveryError(f"commit marker names log {rec.log} or member file {rec.member}, which it does not "
                                    "list", path=str(marker))
        return pending

    def open_logs(self) -> list[int]:
        """Descriptors of the logs, each checked to belong to this update; :class:`RecoveryError` otherwise."""
        fds: list[int] = []
        try:
            for lp in self.logs:
                try:
                    fd = os.open(lp, os.O_RDONLY)
                except OSError as exc:
                    raise RecoveryError(
                        f"the log of an interrupted update (committed on host {self.host}) is unreachable: {exc.strerror}; "
                        f"run again on that host, or restore the member files from another copy and delete the marker {self.marker}",
                        path=lp,
                    ) from None
                fds.append(fd)
                fmt = read_header(os.pread(fd, HEADER, 0), lp, self.update_id, str(self.marker))
                if fmt is not self.log_format:
                    raise RecoveryError(f"log of format {int(fmt)} where marker {self.marker} names format {int(self.log_format)}", path=lp)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds


def _read_record(lfds: list[int], logs: list[str], rec: LogRecord, padded: bool) -> np.ndarray:
    """The record's bytes as they are in its log, with its padding if ``padded``."""
    out = np.empty(rec.nbytes + (padding(rec.nbytes) if padded else 0), dtype=np.uint8)
    pread_full(lfds[rec.log], out, rec.log_offset, logs[rec.log], None)
    return out


def _checked_record(update: _Pending, lfds: list[int], rec: LogRecord) -> np.ndarray:
    """The record's bytes, checked against its checksum (format 3: with its padding); :class:`RecoveryError`
    naming the log otherwise."""
    padded = update.log_format is LogFormat.XXH3
    data = _read_record(lfds, update.logs, rec, padded)
    digest = Digest(update.log_format)
    digest.update(data)
    if digest.value != rec.checksum:
        raise RecoveryError(
            f"log record for {update.files[rec.member]} (log offset {rec.log_offset}, {rec.nbytes} bytes) fails its checksum",
            path=update.logs[rec.log],
        )
    return data[:rec.nbytes]


def _verify(update: _Pending, lfds: list[int]) -> None:
    """Check every record before any is written (all or nothing)."""
    for rec in update.records:
        _checked_record(update, lfds, rec)


def _redo(update: _Pending, lfds: list[int]) -> int:
    """Write every record of ``update`` into its member file; returns the bytes written."""
    ffds: dict[int, int] = {}
    written = 0
    try:
        for rec in update.records:
            m = rec.member
            data = _checked_record(update, lfds, rec)  # what is written is what was checked, read once
            if isinstance(rec.dest, Slab):
                sl = rec.dest
                library.write_slab(update.files[m], sl.var, sl.i0, sl.i1, data.view(np.dtype(sl.dtype)))
            else:
                if m not in ffds:
                    try:
                        ffds[m] = os.open(update.files[m], os.O_WRONLY)
                    except OSError as exc:
                        raise RecoveryError(f"cannot reopen the member file to finish the update: {exc.strerror}", path=update.files[m]) from None
                pwrite_full(ffds[m], data, rec.dest)
            written += rec.nbytes
        if update.durable:
            for fd in ffds.values():
                os.fsync(fd)
    finally:
        for fd in ffds.values():
            os.close(fd)
    return written


def recover(marker: Path) -> int:
    """Finish the interrupted update described by ``marker``: verify every log record, then write
    them all and remove the marker. Returns the number of bytes written.

    Raises :class:`RecoveryError` naming the log or file when a log is unreachable (for example
    on another node's ``/dev/shm``) or damaged; nothing is written then."""
    body = _read_marker(marker)
    if shadow_plan.is_shadow_marker(body):
        plan = shadow_plan.ShadowPlan.read(marker, body)
        written = plan.recover()
        write_completion(plan.completion)
        clear(marker, plan.durable)
        return written
    update = _Pending.read(marker, body)
    lfds = update.open_logs()
    try:
        _verify(update, lfds)  # everything before writing anything
        written = _redo(update, lfds)
    finally:
        for fd in lfds:
            os.close(fd)
    write_completion(update.completion)
    clear(marker, update.durable)
    for lp in update.logs:
        try:
            os.unlink(lp)
        except OSError:
            pass
    return written
