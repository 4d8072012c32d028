"""Crash-safe update by shadow files: the new bytes are written once, into a new copy of each member
file (its *shadow*), which replaces the file by ``rename`` at the commit.

Protocol of one update (docs/io.md "Crash-safe update"):

1. *write*: every I/O task writes the final bytes of its rows into ``.NAME.enkflow-new-ID`` beside each
   member file NAME (the file's size; mode and group of the file), each piece checksummed (XXH3-64)
   just before its ``pwrite`` while in cache (:class:`ShadowSink`). Then one task per file copies the
   byte ranges no task wrote (metadata, other variables, points outside a mask) from the file into
   the shadow with ``copy_file_range`` (in the kernel; :meth:`ShadowSet.fill`), unless the shadow is a
   spare that holds them already (below).
2. *commit*: a marker listing every shadow (path, inode, size) and every written range with its
   checksum is written atomically beside the first member file, as the log's marker.
3. *replace*: each shadow is renamed over its file (atomic per file).
4. *clear*: the marker is removed.

A kill before 2 leaves the files untouched; the shadows are leftovers that the next ``r+`` open
removes (:func:`remove_leftovers`). A kill after 2 leaves the marker: :meth:`ShadowPlan.recover` checks every
shadow still there (its inode and size, the written ranges against their checksums, every other byte
against the file it replaces) before it renames any, then renames them; a shadow already renamed is
known by its inode at the file's name. Renaming again what is left is idempotent, so recovery may
itself be killed and rerun. With ``durable`` the shadows are fsynced before the commit and the
directories after the renames.

Each replaced file stays as its member's *spare* while the ``EnsembleFiles`` object lives, and the
object's next update renames it in as its shadow: it writes into pages that exist (allocating those of
new files, and freeing the old ones, costs more than the copy), and a spare known to hold its file's
unwritten bytes (:class:`Spares`) needs no copy of them.

Against the write-ahead log (:mod:`enkflow.io.wal`) it writes the state once instead of twice, but a
member file becomes a new inode: see :func:`shadow_fits` and :func:`choose` for when it is chosen.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from enkflow.errors import FileFormatError, StorageError
from enkflow.fsutil import copy_range, pwrite_full, write_bytes_atomic
from enkflow.io.config import UpdateMethod
from enkflow.io.rowio import Scratch
from enkflow.io.shadow_plan import INFIX, METHOD, SPARE_INFIX, ShadowEntry, ShadowPlan, Written, gaps
from enkflow.io.walformat import SHADOW_MARKER_VERSION, Digest, seal_marker

# Bytes checksummed, then written, at a time: the piece the log's pwrite was measured best with
# (enkflow.io.wal.WRITE_PIECE).
PIECE = 1 << 22


def shadow_path(target: str, update_id: str) -> str:
    """Where the shadow of member file ``target`` (its real path) lives during update ``update_id``."""
    d, name = os.path.split(target)
    return os.path.join(d, f".{name}{INFIX}{update_id}")


def spare_path(target: str, spare_id: str) -> str:
    """Where the file that ``target`` replaced last waits to be the next update's shadow (``spare_id``: one
    :class:`~enkflow.io.ensemble.EnsembleFiles` object's)."""
    d, name = os.path.split(target)
    return os.path.join(d, f".{name}{SPARE_INFIX}{spare_id}")


def _file_print(fd: int) -> tuple[int, int, int, int]:
    """A member file as this object left it: inode, size, mtime and ctime (ns)."""
    st = os.fstat(fd)
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _spare_print(fd: int) -> tuple[int, int, int]:
    """A spare as this object left it: inode, size and mtime (ns; a rename changes its ctime, not its mtime).
    A new file in its place differs, even on a reused inode number."""
    st = os.fstat(fd)
    return st.st_ino, st.st_size, st.st_mtime_ns


@dataclass
class Spares:
    """What one I/O task knows of its members' spares: ``known[m]`` = (member ``m``'s file, its spare) as
    this object left them when the spare held the file's unwritten bytes (everything an update does not
    write: metadata, other variables, points outside a mask), because this object wrote or copied both.
    While both are as left (same inode, size and times), a shadow made from that spare needs no copy of
    those bytes; anything else (another writer, a spare deleted or replaced) copies them. (On kernels
    without fine-grained timestamps, before Linux 6.13, a write by another process in the same clock
    tick as this object's last one goes unseen: no other process may write the files of an ``r+`` object.)"""

    known: dict[int, tuple[tuple[int, int, int, int], tuple[int, int, int]]] = field(default_factory=dict)

    def note(self, m: int, file_fd: int, spare_fd: int) -> None:
        self.known[m] = (_file_print(file_fd), _spare_print(spare_fd))

    def holds_unwritten(self, m: int, file_fd: int, shadow_fd: int) -> bool:
        """Whether the shadow open as ``shadow_fd``, not yet written, is member ``m``'s spare as this object
        left it, and its file too."""
        return self.known.get(m) == (_file_print(file_fd), _spare_print(shadow_fd))

    def still(self, members: list[int], file_fds: list[int]) -> dict[int, tuple[int, int, int]]:
        """The spares of ``members`` whose files are as noted (before this object writes them in place)."""
        out = {}
        for m in members:
            k = self.known.get(m)
            if k is not None and k[0] == _file_print(file_fds[m]):
                out[m] = k[1]
        return out

    def renew(self, kept: dict[int, tuple[int, int, int]], file_fds: list[int]) -> None:
        """After this object wrote state bytes only in place: ``kept`` (from :meth:`still`) hold, the rest not."""
        self.known = {m: (_file_print(file_fds[m]), spare) for m, spare in kept.items()}

    def make(self, targets: list[str], members: list[int], spare_id: str) -> None:
        """Give ``members`` a spare now, a copy of the file (``copy_file_range``), so that their first update
        writes into pages that exist and copies nothing else. Spares only save time: where one cannot be
        made (a full disk), it is not, and the update itself says whether the shadows fit."""
        for m in members:
            p = spare_path(targets[m], spare_id)
            if os.path.exists(p):
                continue
            try:
                self._copy_noted(m, targets[m], p)
            except OSError:
                Path(p).unlink(missing_ok=True)
                return

    def _copy_noted(self, m: int, target: str, spare: str) -> None:
        """Copy ``target`` into a new ``spare`` and note both as member ``m``'s."""
        src = os.open(target, os.O_RDONLY)
        try:
            dst = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                copy_range(src, dst, 0, os.fstat(src).st_size)
                self.note(m, src, dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)


def check_space(targets: list[str], spare_id: str) -> None:
    """Refuse an update whose new shadows (the files without a spare) do not fit beside the files, before
    any is written: a :class:`StorageError` naming the directory, the bytes needed and free."""
    need: dict[int, tuple[str, int]] = {}
    for t in targets:
        if os.path.exists(spare_path(t, spare_id)):
            continue
        d = os.path.dirname(t)
        dev = os.stat(d).st_dev
        where, n = need.get(dev, (d, 0))
        need[dev] = (where, n + os.stat(t).st_size)
    for d, n in need.values():
        st = os.statvfs(d)
        free = st.f_bavail * st.f_frsize
        if n > free:
            raise StorageError(f"the crash-safe update's shadow files need {n / 1e9:.2f} GB beside the member files, "
                               f"{free / 1e9:.2f} GB are free: free space, or set [io.safe_update] method = \"log\" "
                               "(its log holds the state bytes only)", path=d)


def adopt_spares(targets: list[str], update_id: str, spare_id: str) -> None:
    """Make each target's spare, where there is one, the shadow of update ``update_id``, once the shadows
    of the others are known to fit (:func:`check_space`)."""
    check_space(targets, spare_id)
    for t in targets:
        try:
            os.rename(spare_path(t, spare_id), shadow_path(t, update_id))
        except FileNotFoundError:
            pass


def remove_spares(targets: list[str], spare_id: str) -> None:
    for t in targets:
        Path(spare_path(t, spare_id)).unlink(missing_ok=True)


def shadow_fits(target: str) -> str | None:
    """Why ``target`` (the real path of a member file) cannot be replaced by a shadow, or None if it can.

    A replaced file is a new inode in the same directory, so the directory must be writable, the file
    ours (a new file would change its owner) with a group we can give, and not hard-linked elsewhere
    (the other names would keep the old content)."""
    st = os.stat(target)
    d = os.path.dirname(target)
    if not os.access(d, os.W_OK | os.X_OK):
        return f"its directory {d} is not writable"
    if st.st_uid != os.geteuid():
        return "it belongs to another user"
    if st.st_gid != os.getegid() and st.st_gid not in os.getgroups():
        return f"its group {st.st_gid} is not one of ours"
    if st.st_nlink != 1:
        return f"it has {st.st_nlink} hard links"
    return None


def choose(targets: list[str], contiguous: bool, requested: UpdateMethod) -> UpdateMethod:
    """The method of a crash-safe update of ``targets`` (real paths; ``contiguous``: every state variable
    is, so its bytes are written by this process): SHADOW or LOG. An explicit SHADOW that some file does
    not allow is a :class:`FileFormatError` naming it."""
    if requested is UpdateMethod.LOG:
        return UpdateMethod.LOG
    why = [(t, shadow_fits(t)) for t in targets]
    bad = [(t, w) for t, w in why if w is not None]
    twice = [t for k, t in enumerate(targets) if t in targets[:k]]
    if twice:
        bad.insert(0, (twice[0], "two member paths name this one file"))
    if not contiguous:
        bad.insert(0, (targets[0], "a state variable is on the NetCDF-library path (not contiguous)"))
    if not bad:
        return UpdateMethod.SHADOW
    if requested is UpdateMethod.SHADOW:
        t, w = bad[0]
        raise FileFormatError(f"[io.safe_update] method = \"shadow\" cannot replace this file: {w}; use method = \"log\" "
                              "(or \"auto\")", path=t)
    return UpdateMethod.LOG


class ShadowSink:
    """Writes the final bytes of the state into the shadows of ``shadows``, one sink per I/O thread;
    ``records`` lists what it wrote, with checksums."""

    def __init__(self, shadows: ShadowSet):
        self.fds = shadows.fds
        self.targets = shadows.targets
        self.records: list[Written] = []

    def staging(self, dtype: np.dtype, count: int, scratch: Scratch) -> np.ndarray:
        return scratch.view(dtype, count)

    def put_bytes(self, member: int, offset: int, data: np.ndarray) -> None:
        digest = Digest()
        raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        for a in range(0, raw.size, PIECE):  # each piece read into cache by the checksum, copied from there by pwrite
            piece = raw[a : a + PIECE]
            digest.update(piece)
            pwrite_full(self.fds[member], piece, offset + a)
        self.records.append(Written(member, offset, raw.size, digest.value))

    def put_slab(self, member: int, var: str, i0: int, i1: int, values: np.ndarray) -> None:
        raise FileFormatError("a variable on the NetCDF-library path cannot be updated through a shadow file "
                              "(internal error: the log method is chosen for such files)", path=self.targets[member],
                              variable=var)


@dataclass
class ShadowSet:
    """This I/O task's open shadows of one update: ``fds[m]`` is member ``m``'s (real path ``targets[m]``)."""

    targets: list[str]
    paths: list[str]
    fds: list[int]
    holds: set[int]  # members whose shadow is a spare that holds the file's unwritten bytes

    @classmethod
    def open(cls, targets: list[str], update_id: str, old_fds: list[int], members: list[int], spares: Spares) -> ShadowSet:
        """Create (or open: every I/O task opens each) the shadow of every target, sized as the target, and
        tell which of ``members`` are spares that hold their unwritten bytes (``old_fds``: the files). No
        task writes a shadow before every task has opened them all."""
        paths = [shadow_path(t, update_id) for t in targets]
        fds: list[int] = []
        holds: set[int] = set()
        try:
            for m, (t, p) in enumerate(zip(targets, paths)):
                try:
                    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
                except OSError as exc:
                    raise StorageError.from_os_error(exc, path=p) from None
                fds.append(fd)
                if m in members and spares.holds_unwritten(m, old_fds[m], fd):
                    holds.add(m)
                size = os.stat(t).st_size
                if os.fstat(fd).st_size != size:  # a truncate to the same size would change a spare's mtime
                    os.ftruncate(fd, size)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return cls(targets, paths, fds, holds)

    def fill(self, old_fds: list[int], written: list[Written], members: list[int], durable: bool, threads: int) -> None:
        """Complete the shadows of ``members`` on ``threads`` threads: copy from the files (``old_fds``) every
        range that ``written`` (every task's) does not cover, unless the shadow is a spare that holds them
        (:attr:`holds`); give them the file's mode and group, fsync them if ``durable``."""
        ranges: dict[int, list[tuple[int, int]]] = {m: [] for m in members}
        for w in written:
            if w.member in ranges:
                ranges[w.member].append((w.offset, w.nbytes))

        def one(m: int) -> None:
            st = os.fstat(old_fds[m])
            try:
                if m not in self.holds:
                    for off, n in gaps(ranges[m], st.st_size):
                        copy_range(old_fds[m], self.fds[m], off, n)
                os.fchmod(self.fds[m], st.st_mode & 0o7777)
                if os.fstat(self.fds[m]).st_gid != st.st_gid:
                    os.fchown(self.fds[m], -1, st.st_gid)
                if durable:
                    os.fsync(self.fds[m])
            except OSError as exc:
                raise StorageError.from_os_error(exc, path=self.paths[m]) from None

        with ThreadPoolExecutor(max(1, min(threads, len(members)))) as ex:
            for f in [ex.submit(one, m) for m in members]:
                f.result()

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def remove(self, keep: bool) -> None:
        """Close the shadows and delete them unless ``keep`` (an update that failed: before its commit, or
        after, when recovery needs them)."""
        self.close()
        if keep:
            return
        for p in self.paths:
            Path(p).unlink(missing_ok=True)


def commit(marker: Path, files: list[str], targets: list[str], update_id: str, spare_id: str, written: list[Written],
           durable: bool, completion: dict[str, object] | None) -> ShadowPlan:
    """Write the commit marker of a shadow update (every shadow complete): from now on it will be finished.
    Returns what it commits."""
    shadows = []
    for t in targets:
        p = shadow_path(t, update_id)
        st = os.stat(p)
        shadows.append(ShadowEntry(p, t, spare_path(t, spare_id), st.st_ino, st.st_size))
    body = {"method": METHOD, "id": update_id, "host": socket.gethostname(), "time": time.time(),
            "files": [os.path.abspath(f) for f in files], "shadows": [asdict(s) for s in shadows], "durable": durable,
            "written": [w.encode() for w in written], "completion": completion}
    write_bytes_atomic(marker, seal_marker(body, SHADOW_MARKER_VERSION), durable=durable)
    return ShadowPlan(str(marker), shadows, written, durable, completion)


def remove_leftovers(targets: list[str]) -> None:
    """Delete the shadows of ``targets`` that an update left before its commit (a committed one's
    marker was finished when the files were opened; two updates of the same files at once are not allowed),
    and the spares of objects that ended without closing. Each directory is listed once. Best effort, as
    leftovers cost only space: one that cannot be listed or removed stays (raising here, on rank 0 only,
    would leave the other ranks waiting for its verdict)."""
    names: dict[str, set[str]] = {}
    for t in targets:
        d, name = os.path.split(t)
        names.setdefault(d, set()).add(name)
    for d, mine in names.items():
        with contextlib.suppress(OSError), os.scandir(d) as entries:
            for e in entries:
                owner = next((e.name[1:e.name.index(i)] for i in (INFIX, SPARE_INFIX) if i in e.name), None)
                if e.name.startswith(".") and owner in mine:
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
