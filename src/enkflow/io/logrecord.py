"""One record of the write-ahead log (:mod:`enkflow.io.wal`): where its final bytes go, where they
wait in a log file, and their checksum (:mod:`enkflow.io.walformat`).

The commit marker (JSON) stores each record as the list that :meth:`LogRecord.encode` makes and
:meth:`LogRecord.decode` reads, the format crash recovery of any earlier run reads too::

    [member, "b", file_offset,          log, log_offset, nbytes, checksum]   # a byte range of the file
    [member, "s", [var, i0, i1, dtype], log, log_offset, nbytes, checksum]   # a leading-axis slab (library path)

``member`` indexes the marker's ``files``, ``log`` its ``logs``; ``dtype`` is a NumPy dtype string
(``"<f4"``); ``checksum`` is a CRC-32 (log format 2) or an unsigned 64-bit XXH3 (format 3).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

from enkflow.errors import RecoveryError

_BYTES = "b"
_SLAB = "s"


class Target(str, Enum):
    """What a record rewrites: a byte range at a file offset, or a slab written through the NetCDF library."""

    BYTES = _BYTES
    SLAB = _SLAB


@dataclass(frozen=True)
class Slab:
    """Rows ``[i0, i1)`` of the leading axis of variable ``var``, stored with dtype ``dtype`` (a NumPy dtype string)."""

    var: str
    i0: int
    i1: int
    dtype: str


@dataclass(frozen=True)
class LogRecord:
    """``nbytes`` bytes at byte ``log_offset`` of log file ``log``, with checksum ``checksum``, that become
    the bytes at ``dest`` of member file ``member``: a byte offset (int) or a :class:`Slab`."""

    member: int
    dest: int | Slab
    log: int
    log_offset: int
    nbytes: int
    checksum: int

    @property
    def target(self) -> Target:
        return Target.SLAB if isinstance(self.dest, Slab) else Target.BYTES

    def in_log(self, log: int) -> LogRecord:
        """The same record, its log file renumbered (rank 0 joins every task's logs into one list)."""
        return dataclasses.replace(self, log=log)

    def encode(self) -> list[object]:
        """The marker's JSON list (module docstring)."""
        d = self.dest
        where: object = [d.var, d.i0, d.i1, d.dtype] if isinstance(d, Slab) else d
        return [self.member, self.target.value, where, self.log, self.log_offset, self.nbytes, self.checksum]

    @classmethod
    def decode(cls, raw: object, marker: str) -> LogRecord:
        """The record of a marker's JSON list; :class:`RecoveryError` naming ``marker`` when it is not one."""
        if not (isinstance(raw, list) and len(raw) == 7 and raw[1] in (_BYTES, _SLAB)):
            raise RecoveryError(f"malformed log record {raw!r} in the commit marker", path=marker)
        member, kind, where, log, lo, n, cs = raw
        dest: int | Slab
        if kind == _SLAB:
            if not (isinstance(where, list) and len(where) == 4 and isinstance(where[0], str) and isinstance(where[3], str)):
                raise RecoveryError(f"malformed slab {where!r} of a log record in the commit marker", path=marker)
            dest = Slab(where[0], _int(where[1], marker), _int(where[2], marker), where[3])
        else:
            dest = _int(where, marker)
        return cls(_int(member, marker), dest, _int(log, marker), _int(lo, marker), _int(n, marker), _int(cs, marker))


def _int(v: object, marker: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise RecoveryError(f"malformed log record field {v!r} (an integer) in the commit marker", path=marker)
    return v
