"""The write-ahead log's on-disk format (:mod:`enkflow.io.wal`): versions, checksums, log header and
the commit marker's own checksum.

Format 3 (written since enkflow issue 27): every record's bytes and its zero padding to a multiple
of 8 bytes carry an XXH3-64 checksum (``xxhash``); the 64-byte log header is ``b"ENKWAL03"``, the
update id (ASCII), zeros, and at byte 56 the XXH3-64 of bytes 0-55 (little-endian); the commit
marker (JSON) carries ``"log_format": 3`` and a ``"checksum"``, the XXH3-64 of its own JSON without
that key. So every byte recovery reads (log header, record table in the marker, record data and
padding) is checked. XXH3 was chosen by measurement (``benchmarks/wal_checksum.py``): about 28 GB/s
on one core here against 4 GB/s for zlib's CRC-32 and 14-15 GB/s for hardware CRC-32C; a damage
goes undetected with probability about 2**-64 per record.

Format 2 (``b"ENKWAL02"``, marker version 1): a zlib CRC-32 of every byte of each record. Still
read, so that an update committed by an earlier release and interrupted is finished after an
upgrade. Format 1 (``b"ENKWAL01"``: one sampled word per page) and unknown versions are refused
with a :class:`RecoveryError` naming the log, its version and what to do.
"""

from __future__ import annotations

import json
import struct
import zlib
from enum import IntEnum

import numpy as np
import xxhash

from enkflow.errors import RecoveryError

HEADER = 64  # bytes at the start of every log file
_ID_END = 56  # format 3: the update id ends here at the latest; the header's checksum follows
_MAGIC_PREFIX = b"ENKWAL"
MARKER_VERSION = 2  # the commit marker's "version" written now (1: format-2 logs, no marker checksum)
SHADOW_MARKER_VERSION = 3  # the marker of a shadow-file update (enkflow.io.shadow): no log, the same checksums


class LogFormat(IntEnum):
    """Versions of the log format that this release reads (module docstring)."""

    CRC32 = 2
    XXH3 = 3

    @property
    def magic(self) -> bytes:
        return _MAGIC_PREFIX + b"%02d" % self.value


CURRENT = LogFormat.XXH3


class Digest:
    """The checksum of one record, fed with its consecutive pieces (:meth:`update`), in format ``fmt``."""

    def __init__(self, fmt: LogFormat = CURRENT):
        self._xxh = xxhash.xxh3_64() if fmt is LogFormat.XXH3 else None
        self._crc = 0

    def update(self, data: np.ndarray | memoryview | bytes) -> None:
        """Add the bytes of ``data`` (C-contiguous, any dtype)."""
        mv = memoryview(data).cast("B")
        if self._xxh is not None:
            self._xxh.update(mv)
        else:
            self._crc = zlib.crc32(mv, self._crc)

    @property
    def value(self) -> int:
        """The checksum of every byte fed so far: XXH3-64 (unsigned 64-bit) or CRC-32."""
        return self._xxh.intdigest() if self._xxh is not None else self._crc


def checksum(data: np.ndarray | memoryview | bytes, fmt: LogFormat = CURRENT) -> int:
    """The checksum of every byte of ``data`` (C-contiguous) in format ``fmt``."""
    d = Digest(fmt)
    d.update(data)
    return d.value


def padding(nbytes: int) -> int:
    """Zero bytes after a record of ``nbytes`` bytes: records start at multiples of 8 bytes."""
    return -nbytes % 8


def log_header(update_id: str) -> bytes:
    """The current format's 64-byte header of a log holding update ``update_id``."""
    uid = update_id.encode("ascii")
    if len(uid) > _ID_END - len(CURRENT.magic):
        raise ValueError(f"update id {update_id!r} is longer than a log header holds")
    head = (CURRENT.magic + uid).ljust(_ID_END, b"\0")
    return head + struct.pack("<Q", checksum(head))


def read_header(raw: bytes, path: str, update_id: str, marker: str) -> LogFormat:
    """The format of the log ``path`` whose first :data:`HEADER` bytes are ``raw``, checked to be intact
    and to belong to ``update_id`` (the update of commit marker ``marker``); :class:`RecoveryError`
    naming the log otherwise."""
    magic = raw[: len(CURRENT.magic)]
    fmt = next((f for f in LogFormat if f.magic == magic), None)
    if fmt is None:
        raise RecoveryError(_unreadable(magic, marker), path=path)
    if fmt is LogFormat.XXH3:
        if len(raw) < HEADER or struct.unpack("<Q", raw[_ID_END:HEADER])[0] != checksum(raw[:_ID_END]):
            raise RecoveryError(f"log header damaged (fails its checksum); the update of marker {marker} "
                                "cannot be finished: restore the member files from another copy and delete the marker", path=path)
        owner = raw[len(magic):_ID_END].rstrip(b"\0")
    else:
        owner = raw[len(magic):HEADER].rstrip(b"\0")
    if owner != update_id.encode("ascii"):
        raise RecoveryError(f"log does not belong to update {update_id} of marker {marker}", path=path)
    return fmt


def _unreadable(magic: bytes, marker: str) -> str:
    """What to say about a log whose header is not that of a format this release reads."""
    readable = ", ".join(str(int(f)) for f in LogFormat)
    if magic.startswith(_MAGIC_PREFIX) and magic[len(_MAGIC_PREFIX):].isdigit():
        version = int(magic[len(_MAGIC_PREFIX):])
        which = "an earlier" if version < min(LogFormat) else "a later"
        return (f"log format version {version} ({magic.decode()}) was written by {which} enkflow release; this one reads "
                f"versions {readable}: finish the interrupted update of marker {marker} with the release that wrote it, "
                "or restore the member files from another copy and delete the marker")
    return (f"not an enkflow log (header starts {magic!r}; versions {readable} are read): the update of marker "
            f"{marker} cannot be finished: restore the member files from another copy and delete the marker")


def seal_marker(body: dict[str, object], version: int = MARKER_VERSION) -> bytes:
    """The commit marker's JSON for ``body``, with its ``version``, log format and its own checksum added last."""
    sealed = {**body, "version": version, "log_format": int(CURRENT)}
    sealed["checksum"] = checksum(_canonical(sealed))
    return _canonical(sealed)


def marker_log_format(body: dict[str, object], path: str) -> LogFormat:
    """The log format that the commit marker ``body`` (read from ``path``) describes, after checking
    its checksum; :class:`RecoveryError` naming the marker when it is damaged or of an unknown version."""
    version = body.get("version")
    if version == 1:  # written before format 3: no checksum of its own, format-2 logs
        return LogFormat.CRC32
    if version not in (MARKER_VERSION, SHADOW_MARKER_VERSION):
        raise RecoveryError(f"commit marker version {version!r} is not one this enkflow release reads "
                            f"(1, {MARKER_VERSION}, {SHADOW_MARKER_VERSION}): "
                            "finish the interrupted update with the release that wrote it", path=path)
    rest = dict(body)
    stored = rest.pop("checksum", None)
    if stored != checksum(_canonical(rest)):
        raise RecoveryError("commit marker damaged (fails its checksum): the interrupted update cannot be finished; "
                            "restore the member files from another copy and delete the marker", path=path)
    try:
        return LogFormat(body.get("log_format"))
    except ValueError:
        raise RecoveryError(f"commit marker names log format {body.get('log_format')!r}, not one this release reads", path=path) from None


def _canonical(body: dict[str, object]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
