"""New values of records a reader already sees (a time written again: a rerun, a window completed by a
later run), kept aside until they replace the old values at once (:class:`Rewrites`).

A counted record cannot be rewritten in place safely: a writer killed, or a time that fails, in the
middle would leave it part old, part new. So a time the file shows already is written into a slot of a
scratch file beside it (``.NAME.rewrite.PID.tmp``, removed with a killed writer's other temporaries).
Once complete, the slot is compared with the values it would replace: equal bytes (a rerun that gives
the same values) change nothing; other values are staged. At ``sync`` and ``close`` the staged slots go
in together: the file is copied under a temporary name, the slots written over their records there, and
the copy fsynced and renamed over the file. A reader, or a run after a kill at any moment, sees either
the old file or the new one; a time that fails only gives its slot back.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from enkflow.fsutil import atomic_output

_CHUNK = 1 << 24  # bytes per pread when records are compared or copied (records may be GiBs)


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def copy_bytes(src: int, src_at: int, dst: int, dst_at: int, size: int) -> None:
    """``size`` bytes from offset ``src_at`` of the file ``src`` to ``dst_at`` of ``dst`` (descriptors)."""
    for k in range(0, size, _CHUNK):
        pwrite_all(dst, memoryview(os.pread(src, min(_CHUNK, size - k), src_at + k)), dst_at + k)


def _same_bytes(a: int, a_at: int, b: int, b_at: int, size: int) -> bool:
    return all(os.pread(a, min(_CHUNK, size - k), a_at + k) == os.pread(b, min(_CHUNK, size - k), b_at + k)
               for k in range(0, size, _CHUNK))


class Rewrites:
    """The scratch slots of the file at ``path``, whose records (``recsize`` bytes each) begin at byte
    ``record_start``; a slot holds one record at ``slot * recsize`` of the scratch file."""

    def __init__(self, path: Path, recsize: int, record_start: int) -> None:
        self.path, self.recsize, self.record_start = path, recsize, record_start
        self.scratch = path.with_name(f".{path.name}.rewrite.{os.getpid()}.tmp")
        self.fd = -1  # the scratch file, made at the first rewrite
        self.free: list[int] = []
        self.top = 0
        self.staged: dict[int, int] = {}  # a counted record -> the slot of its complete new values

    def slot(self) -> int:
        """A free slot (its bytes are those of whatever held it before: every value is written anew)."""
        if self.fd < 0:
            self.fd = os.open(self.scratch, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        if self.free:
            return self.free.pop()
        self.top += 1
        return self.top - 1

    def give_back(self, slot: int) -> None:
        self.free.append(slot)

    def stage(self, record: int, slot: int, fd: int) -> None:
        """``slot`` holds complete new values of counted ``record`` of the file open as ``fd``: staged
        unless they equal what the record will hold (its values, or others staged before)."""
        old = self.staged.get(record)
        current = (self.fd, old * self.recsize) if old is not None else (fd, self._at(record))
        if _same_bytes(*current, self.fd, slot * self.recsize, self.recsize):
            self.give_back(slot)
            return
        if old is not None:
            self.give_back(old)
        self.staged[record] = slot

    def apply(self) -> bool:
        """The staged values written into a copy of the file, renamed over it; whether anything was
        (then the caller's descriptor still holds the old file: open the new one)."""
        if not self.staged:
            return False
        with atomic_output(self.path) as tmp:
            # Copied by name: every pwrite of this process so far is in the page cache the copy reads.
            shutil.copyfile(self.path, tmp)
            fd = os.open(tmp, os.O_WRONLY)
            try:
                for record, slot in self.staged.items():
                    copy_bytes(self.fd, slot * self.recsize, fd, self._at(record), self.recsize)
            finally:
                os.close(fd)
        self.free.extend(self.staged.values())
        self.staged.clear()
        return True

    def _at(self, record: int) -> int:
        return self.record_start + record * self.recsize

    def close(self) -> None:
        """Removes the scratch file (call :meth:`apply` first)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self.scratch.unlink(missing_ok=True)
