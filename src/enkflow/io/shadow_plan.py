"""A shadow-file update (:mod:`enkflow.io.shadow`) as its commit marker records it, and its recovery: the
written ranges with their checksums, the unwritten ones (:func:`gaps`), and :class:`ShadowPlan`, which
checks every shadow still there and renames them over their files."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from enkflow.errors import RecoveryError
from enkflow.fsutil import fsync_dir
from enkflow.io.rowio import pread_full
from enkflow.io.walformat import SHADOW_MARKER_VERSION, Digest

INFIX = ".enkflow-new-"  # a shadow: .NAME.enkflow-new-UPDATE
SPARE_INFIX = ".enkflow-old-"  # a spare: .NAME.enkflow-old-OBJECT
METHOD = "shadow"  # the marker's "method"
COMPARE = 1 << 22  # bytes compared at a time (recovery)


@dataclass(frozen=True)
class Written:
    """``nbytes`` bytes written at byte ``offset`` of member ``member``'s shadow, with the XXH3-64 ``checksum``."""

    member: int
    offset: int
    nbytes: int
    checksum: int

    def encode(self) -> list[int]:
        return [self.member, self.offset, self.nbytes, self.checksum]

    @classmethod
    def decode(cls, raw: object, marker: str) -> Written:
        if not (isinstance(raw, list) and len(raw) == 4 and all(isinstance(v, int) and v >= 0 for v in raw)):
            raise RecoveryError(f"malformed written range {raw!r} in the commit marker", path=marker)
        return cls(*raw)


def gaps(written: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """``(offset, nbytes)`` of the parts of ``[0, size)`` that no ``(offset, nbytes)`` of ``written`` covers."""
    out = []
    at = 0
    for off, n in sorted(written):
        if off > at:
            out.append((at, off - at))
        at = max(at, off + n)
    if at < size:
        out.append((at, size - at))
    return out


@dataclass(frozen=True)
class ShadowEntry:
    """One member's shadow in the marker."""

    path: str
    target: str
    spare: str  # where the replaced file stays for the next update of the same object
    inode: int
    size: int


@dataclass(frozen=True)
class ShadowPlan:
    """A committed shadow update read back from its marker."""

    marker: str
    shadows: list[ShadowEntry]
    written: list[Written]
    durable: bool
    completion: dict[str, object] | None

    @classmethod
    def read(cls, marker: Path, body: dict[str, object]) -> ShadowPlan:
        m = str(marker)
        if body.get("version") != SHADOW_MARKER_VERSION:
            raise RecoveryError(f"a shadow update's commit marker of version {body.get('version')!r}", path=m)
        raw, written, completion = body.get("shadows"), body.get("written"), body.get("completion")
        if not (isinstance(raw, list) and isinstance(written, list) and (completion is None or isinstance(completion, dict))):
            raise RecoveryError("commit marker of an interrupted update lacks or garbles its shadows, ranges or completion", path=m)
        try:
            shadows = [ShadowEntry(str(s["path"]), str(s["target"]), str(s["spare"]), int(s["inode"]), int(s["size"]))
                       for s in raw]
        except (KeyError, TypeError, ValueError) as exc:
            raise RecoveryError(f"commit marker of an interrupted update lacks or garbles {exc}", path=m) from None
        plan = cls(m, shadows, [Written.decode(w, m) for w in written], bool(body.get("durable")), completion)
        if any(w.member >= len(shadows) for w in plan.written):
            raise RecoveryError("commit marker names a member it does not list", path=m)
        if any({os.path.dirname(s.path), os.path.dirname(s.spare)} != {os.path.dirname(s.target)}
               or INFIX not in os.path.basename(s.path) or SPARE_INFIX not in os.path.basename(s.spare) for s in shadows):
            raise RecoveryError("commit marker names a shadow that is not beside its member file", path=m)
        return plan

    def _present(self, k: int) -> bool:
        """Whether shadow ``k`` still waits for its rename; False when it was renamed already (the target is
        its inode); :class:`RecoveryError` when it is gone otherwise."""
        s = self.shadows[k]
        if os.path.lexists(s.path):
            return True
        try:
            if os.stat(s.target).st_ino == s.inode:
                return False
        except FileNotFoundError:
            pass
        raise RecoveryError(f"the shadow of {s.target} is gone and the file is not it: the update of marker "
                            f"{self.marker} cannot be finished; restore the member files from another copy and "
                            "delete the marker", path=s.path)

    def _check(self, k: int) -> None:
        """Shadow ``k`` is the one committed, whole: inode, size, written ranges against their checksums,
        every other byte equal to the file it replaces. :class:`RecoveryError` naming it otherwise."""
        s = self.shadows[k]
        fd = os.open(s.path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if (st.st_ino, st.st_size) != (s.inode, s.size):
                raise RecoveryError(f"shadow is not the one committed (inode {st.st_ino}, {st.st_size} bytes; the marker "
                                    f"{self.marker} says {s.inode}, {s.size})", path=s.path)
            mine = [w for w in self.written if w.member == k]
            for w in mine:
                data = np.empty(w.nbytes, dtype=np.uint8)
                pread_full(fd, data, w.offset, s.path, None)
                digest = Digest()
                digest.update(data)
                if digest.value != w.checksum:
                    raise RecoveryError(f"shadow range at byte {w.offset} ({w.nbytes} bytes) fails its checksum; the "
                                        f"update of marker {self.marker} cannot be finished: restore the member files "
                                        "from another copy and delete the marker", path=s.path)
            self._check_unwritten(fd, s, gaps([(w.offset, w.nbytes) for w in mine], s.size))
        finally:
            os.close(fd)

    def _check_unwritten(self, fd: int, s: ShadowEntry, ranges: list[tuple[int, int]]) -> None:
        """The ``ranges`` of the shadow (open as ``fd``) hold the bytes of its target there."""
        tfd = os.open(s.target, os.O_RDONLY)
        try:
            for off, n in ranges:
                for a in range(off, off + n, COMPARE):
                    k = min(COMPARE, off + n - a)
                    new, old = np.empty(k, dtype=np.uint8), np.empty(k, dtype=np.uint8)
                    pread_full(fd, new, a, s.path, None)
                    pread_full(tfd, old, a, s.target, None)
                    if not np.array_equal(new, old):
                        raise RecoveryError(f"shadow bytes {a}-{a + k} differ from the member file where nothing was "
                                            f"written; the update of marker {self.marker} cannot be finished: restore "
                                            "the member files from another copy and delete the marker", path=s.path)
        finally:
            os.close(tfd)

    def recover(self) -> int:
        """Finish an interrupted update: check every shadow still there, then rename them over their files
        and remove the spares; returns the bytes replaced."""
        todo = [k for k in range(len(self.shadows)) if self._present(k)]
        for k in todo:  # everything before renaming anything
            self._check(k)
        self.replace(todo, keep_spares=False)
        for s in self.shadows:
            Path(s.spare).unlink(missing_ok=True)
        return sum(self.shadows[k].size for k in todo)

    def replace(self, todo: list[int], keep_spares: bool) -> None:
        """Rename shadows ``todo`` over their files; with ``keep_spares`` (the update itself) each replaced
        file stays as its spare, whose pages the next update of the same object writes into."""
        for k in todo:
            s = self.shadows[k]
            if keep_spares:
                Path(s.spare).unlink(missing_ok=True)
                os.link(s.target, s.spare)
            os.rename(s.path, s.target)
        if self.durable:
            for d in sorted({os.path.dirname(self.shadows[k].target) for k in todo}):
                fsync_dir(d)


def is_shadow_marker(body: dict[str, object]) -> bool:
    return body.get("method") == METHOD


def discard_shadows(body: dict[str, object]) -> None:
    """Delete the shadows and spares a committed marker lists (the update is dropped, not finished)."""
    for s in body.get("shadows", []) or []:
        for key, infix in (("path", INFIX), ("spare", SPARE_INFIX)):
            if isinstance(s, dict) and infix in os.path.basename(str(s.get(key, ""))):
                Path(str(s[key])).unlink(missing_ok=True)
