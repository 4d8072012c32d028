"""Crash-safe in-place update: a write-ahead log of the new bytes, a commit marker, idempotent redo.

Protocol of one update (see docs/io.md):

1. *log*: every byte range about to change is written, with its final content, to log files
   (default ``.enkflow-wal/`` beside the member files, which every node sees; ``/dev/shm``, an
   explicit choice, is faster but lost with its node).
   Each record carries a CRC-32 of every one of its bytes (:func:`checksum`).
2. *commit*: a small JSON marker listing the files, the log files and every record is written
   beside the first member file, atomically (temporary file + ``rename``).
3. *write*: the member files are updated in place.
4. *clear*: the marker is removed.

A kill before step 2 leaves no marker: the files were never touched and the half-written log
is ignored. A kill after step 2 leaves the marker: the next :func:`recover` (run by every
``EnsembleFiles`` open) verifies every record's checksum, then writes every record again and
removes the marker. Writing a record twice gives the same bytes, so recovery may itself be
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
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enkflow.errors import RecoveryError
from enkflow.fsutil import fsync_dir, pid_alive, write_bytes_atomic, write_json_atomic
from enkflow.io import library
from enkflow.io.logrecord import LogRecord, Slab
from enkflow.io.rowio import pread_full, pwrite_full

MAGIC = b"ENKWAL02"  # 02: full CRC-32 per record (01: one sampled word per page; not read)
HEADER = 64  # bytes: MAGIC + update id (ascii) + padding
MARKER_PREFIX = ".enkflow-update-"


CRC_CHUNK = 1 << 18  # bytes copied into the log, then checksummed while still in cache


def checksum(data: np.ndarray | memoryview, value: int = 0) -> int:
    """CRC-32 (``zlib.crc32``) of every byte of ``data``, a C-contiguous log record.

    ``value`` is the CRC of the bytes before ``data``: chained calls over consecutive pieces of a
    record give the CRC of the whole record. Any damage to a record is caught (a torn, zeroed or
    stale page anywhere in it, a single changed byte), except with probability 2**-32 for
    damage that is not a burst of at most 32 bits. zlib's CRC runs at about 4 GB/s per core
    (releasing the GIL, so the I/O threads checksum in parallel): 3-4x the time of the copy
    into the log (measured in docs/io.md, "Crash-safe in-place update").
    """
    return zlib.crc32(memoryview(data).cast("B"), value)


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

    The log file stays mapped in memory (shared mapping, populated when the space is
    prepared): each record is one ``memcpy`` into the mapping plus a CRC-32 of its bytes
    (:func:`checksum`), with no page fault and no page-cache lookup during the update. Records
    start at multiples of 8 bytes.
    """

    def __init__(self, view: np.ndarray, log_index: int):
        self.view = view  # the whole log file, uint8
        self.log_index = log_index
        self.pos = HEADER
        self.records: list[LogRecord] = []
        self._staged: np.ndarray | None = None

    def close(self) -> None:
        """Nothing to release: the mapping belongs to the :class:`WriteAheadLog`."""
        self._staged = None

    def staging(self, dtype: np.dtype, count: int, scratch: object) -> np.ndarray:
        """The next record's place in the log itself: converted bytes land there directly."""
        n = count * dtype.itemsize
        if self.pos + n > self.view.size:
            raise RecoveryError(f"log capacity {self.view.size} bytes exceeded (internal error)", path="log")
        self._staged = self.view[self.pos : self.pos + n].view(dtype)
        return self._staged

    def _append(self, data: np.ndarray) -> tuple[int, int, int]:
        """Copy ``data`` into the log (unless it was staged there); returns
        ``(log offset, bytes, checksum)``. The CRC is taken of the bytes in the log, chained
        over pieces of :data:`CRC_CHUNK` bytes each checksummed right after its copy."""
        lo = self.pos
        if data is self._staged:
            n = data.nbytes
            self._staged = None
            cs = checksum(self.view[lo : lo + n])
        else:
            src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
            n = src.size
            if lo + n > self.view.size:
                raise RecoveryError(f"log capacity {self.view.size} bytes exceeded (internal error)", path="log")
            cs = 0
            for a in range(0, n, CRC_CHUNK):
                b = min(a + CRC_CHUNK, n)
                dst = self.view[lo + a : lo + b]
                np.copyto(dst, src[a:b])
                cs = checksum(dst, cs)
        self.pos = lo + n + (-n % 8)
        return lo, n, cs

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
    allocated once (:meth:`prepare`) and reused by every update until :meth:`close`."""

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
            if need > self.capacity[k]:
                self._unmap(k)
                try:
                    os.posix_fallocate(self.fds[k], 0, need)
                except OSError:  # file systems without fallocate: the writes allocate
                    os.ftruncate(self.fds[k], need)
                self.capacity[k] = need
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
        head = (MAGIC + update_id.encode()).ljust(HEADER, b"\0")
        out = []
        for k, (fd, view) in enumerate(zip(self.fds, self.views)):
            if view is None:
                raise RecoveryError(f"log {k} was not prepared (internal error)", path=self.paths[k])
            os.pwrite(fd, head, 0)
            out.append(LogSink(view, k))
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
        "version": 1, "id": update_id, "host": socket.gethostname(), "time": time.time(),
        "files": [os.path.abspath(f) for f in files], "logs": logs, "durable": durable,
        "records": [r.encode() for r in records],
        "completion": completion,
    }
    write_bytes_atomic(path, json.dumps(body, separators=(",", ":")).encode(), durable=durable)
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
    elsewhere): delete its logs, then its marker."""
    body = json.loads(marker.read_text())
    for log in body.get("logs", []):
        Path(log).unlink(missing_ok=True)
    marker.unlink()


def pending_markers(files: list[str]) -> list[Path]:
    """Commit markers, in the directories of ``files``, of updates that touch any of ``files``."""
    mine = {os.path.abspath(f) for f in files}
    found = []
    for d in sorted({os.path.dirname(os.path.abspath(f)) for f in files}):
        _remove_stale_tmp(d)
        for m in sorted(glob.glob(os.path.join(glob.escape(d), MARKER_PREFIX + "*.json"))):
            try:
                with open(m) as fh:
                    body = json.load(fh)
            except (OSError, ValueError):
                raise RecoveryError("unreadable commit marker of an interrupted update", path=m) from None
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

    @classmethod
    def read(cls, marker: Path) -> _Pending:
        with open(marker) as fh:
            body = json.load(fh)
        records = [LogRecord.decode(r, str(marker)) for r in body["records"]]
        return cls(marker, list(body["files"]), list(body["logs"]), records, str(body["id"]), body.get("host"),
                   bool(body.get("durable")), body.get("completion"))

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
                if not os.pread(fd, HEADER, 0).startswith(MAGIC + self.update_id.encode()):
                    raise RecoveryError(f"log does not belong to update {self.update_id} of marker {self.marker}", path=lp)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds


def _read_record(lfds: list[int], logs: list[str], rec: LogRecord) -> np.ndarray:
    """The record's bytes as they are in its log."""
    out = np.empty(rec.nbytes, dtype=np.uint8)
    pread_full(lfds[rec.log], out, rec.log_offset, logs[rec.log], None)
    return out


def _redo(update: _Pending, lfds: list[int]) -> int:
    """Write every record of ``update`` into its member file; returns the bytes written."""
    ffds: dict[int, int] = {}
    written = 0
    try:
        for rec in update.records:
            m = rec.member
            data = _read_record(lfds, update.logs, rec)
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
    update = _Pending.read(marker)
    lfds = update.open_logs()
    try:
        for rec in update.records:  # verify everything before writing anything
            if checksum(_read_record(lfds, update.logs, rec)) != rec.crc:
                raise RecoveryError(
                    f"log record for {update.files[rec.member]} (log offset {rec.log_offset}, {rec.nbytes} bytes) fails its checksum",
                    path=update.logs[rec.log],
                )
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
