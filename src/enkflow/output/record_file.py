"""A NetCDF file that grows along its unlimited dimension, appended so that a crash never spoils it
(:class:`RecordFile`).

The file is NetCDF-3 64-bit data (CDF-5), defined once by netCDF4-python with no record (by a
``define`` function) and renamed into place. Records are then written by enkflow itself: a record's
values by ``pwrite`` at their offsets, an ``fdatasync``, and only then the record count (``numrecs``, 8
bytes at byte 4 of the header) in one ``pwrite``. A reader, or a run after ``kill -9``, sees ``numrecs``
records, each whole; values of records beyond it (half written when the writer died) are invisible and
are overwritten by the next appends. Records are handed out in the order their first values arrive and
may complete in any order: ``numrecs`` is the completed prefix. A time the file shows already is
never written in place: its new values replace the old record at once
(:mod:`enkflow.output.record_rewrite`). HDF5 (NetCDF-4) is not used for this: an
append there rewrites metadata spread over the file (B-trees, the metadata cache), and a writer killed
in between can leave a file the library cannot open.
"""

from __future__ import annotations

import itertools
import math
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from enkflow.errors import FileFormatError
from enkflow.fsutil import atomic_output
from enkflow.io.netcdf3 import Header, HeaderVar, read_header
from enkflow.output.record_rewrite import Rewrites, copy_bytes, pwrite_all

_NUMRECS_AT = 4  # CDF-5: the 8-byte big-endian record count follows the 4-byte magic number


def _record_size(header: Header) -> int:
    """Bytes of one record: each record variable's values padded to 4 bytes (NetCDF-3 spec; one lone
    record variable is not padded)."""
    sizes = [math.prod(v.shape[1:]) * v.dtype.itemsize for v in header.variables.values() if v.is_record]
    if len(sizes) == 1:
        return sizes[0]
    return sum(s + (-s % 4) for s in sizes)


def _layout(header: Header) -> list[tuple[str, tuple[str, ...], tuple[int, ...], str, bool]]:
    """What must agree between a file on disk and the definition: each variable's name, dimensions,
    shape (less the record count) and type, in order (offsets follow from the attributes' lengths)."""
    return [(k, v.dims, v.shape[1:] if v.is_record else v.shape, v.dtype.str, v.is_record)
            for k, v in header.variables.items()]


@dataclass(frozen=True)
class Record:
    """Where a time's values go: record ``index`` of the file, or, for a time the file shows already
    (``rewrite``), slot ``index`` of its :class:`~enkflow.output.record_rewrite.Rewrites`."""

    index: int
    rewrite: bool = False


class RecordFile:
    """The file at ``path`` along its unlimited dimension, whose record variable ``time`` holds each
    record's coordinate. Created by ``define(tmp_path)`` when missing; an existing file must have the
    definition's layout and fixed values (else :class:`FileFormatError` naming it), and its records are
    kept: a time already there is written again into a scratch slot that replaces its record at once at
    the next ``sync`` or ``close``."""

    def __init__(self, path: Path, define: Callable[[Path], None]) -> None:
        self.path = path
        if path.exists():
            # Named like atomic_output's temporaries: a killed writer's are removed by its senders.
            template = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            try:
                define(template)
                self._check(path, template)
            finally:
                template.unlink(missing_ok=True)
        else:
            with atomic_output(path) as tmp:
                define(tmp)
        header, _ = read_header(str(path))
        self.vars: dict[str, HeaderVar] = header.variables
        self.recsize = _record_size(header)
        self.record_start = min(v.begin for v in self.vars.values() if v.is_record)
        self.fd = os.open(path, os.O_RDWR)
        self.numrecs = header.numrecs
        self.times = {float(t): r for r, t in enumerate(self._read_times(header.numrecs))}
        self.rewrites = Rewrites(path, self.recsize, self.record_start)
        self.pending: dict[float, Record] = {}  # handed out, not complete
        self.complete: set[int] = set(range(header.numrecs))
        self.free: list[int] = []  # handed out and given back (a time that failed), below the top
        self.top = header.numrecs  # the next record never handed out

    @staticmethod
    def _check(path: Path, template: Path) -> None:
        """``path`` has the layout and the fixed values of the definition at ``template``."""
        want, _ = read_header(str(template))
        have, _ = read_header(str(path))
        if _layout(have) != _layout(want) or have.version != want.version:
            raise FileFormatError("it was written with other output settings (fields, dimensions, members, "
                                  "dtype, diagnostics or reductions); move it away to start a new one", path=str(path))
        with open(path, "rb") as a, open(template, "rb") as b:
            for name, v in want.variables.items():
                if v.is_record:
                    continue
                size = math.prod(v.shape) * v.dtype.itemsize
                a.seek(have.variables[name].begin)
                b.seek(v.begin)
                if a.read(size) != b.read(size):
                    raise FileFormatError(f"its values of {name} differ from this run's; move it away to start "
                                          "a new one", path=str(path))

    def _read_times(self, n: int) -> list[float]:
        v = self.vars["time"]
        return [struct.unpack(">d", os.pread(self.fd, 8, v.begin + r * self.recsize))[0] for r in range(n)]

    def record(self, t: float) -> Record:
        """Where time ``t`` goes: its own record where handed out before; a scratch slot where the file
        shows it already; else a new record. Its ``time`` value is written at once."""
        rec = self.pending.get(t)
        if rec is not None:
            return rec
        if t in self.times:
            rec = Record(self.rewrites.slot(), rewrite=True)
        elif self.free:
            rec = Record(min(self.free))
            self.free.remove(rec.index)
        else:
            rec, self.top = Record(self.top), self.top + 1
        self.pending[t] = rec
        self.write(rec, "time", (), np.float64(t))
        return rec

    def write(self, rec: Record, name: str, key: tuple[int | slice, ...], data: np.ndarray | np.generic) -> None:
        """Store ``data`` at ``key`` (an index per dimension after the record's) of variable ``name``
        in ``rec``, the dimensions it leaves out whole: one ``pwrite`` per contiguous run of the file."""
        v = self.vars[name]
        shape = v.shape[1:]
        key = key + (slice(None),) * (len(shape) - len(key))
        starts = [k if isinstance(k, int) else k.indices(n)[0] for k, n in zip(key, shape)]
        stops = [k + 1 if isinstance(k, int) else k.indices(n)[1] for k, n in zip(key, shape)]
        full = len(shape)  # dimensions from `full` on are covered whole: runs are contiguous across them
        while full > 0 and starts[full - 1] == 0 and stops[full - 1] == shape[full - 1]:
            full -= 1
        inner = max(full - 1, 0)
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        run = math.prod(b - a for a, b in zip(starts[inner:], stops[inner:]))
        values = np.ascontiguousarray(data, dtype=v.dtype).reshape(-1, run)
        if rec.rewrite:
            fd, base = self.rewrites.fd, v.begin - self.record_start + rec.index * self.recsize
        else:
            fd, base = self.fd, v.begin + rec.index * self.recsize
        first = starts[inner] * strides[inner] if shape else 0
        for i, idx in enumerate(itertools.product(*(range(a, b) for a, b in zip(starts[:inner], stops[:inner])))):
            at = first + sum(j * s for j, s in zip(idx, strides))
            pwrite_all(fd, memoryview(values[i]).cast("B"), base + at * v.dtype.itemsize)

    def commit(self, t: float) -> None:
        """Time ``t``'s values are whole: a new record on disk first, then counted where it extends the
        whole prefix; a rewrite staged for the next ``sync`` or ``close``."""
        rec = self.pending.pop(t)
        if rec.rewrite:
            self.rewrites.stage(self.times[t], rec.index, self.fd)
            return
        self.complete.add(rec.index)
        self.times[t] = rec.index
        self._count()

    def release(self, t: float) -> None:
        """Time ``t`` failed: its new record goes to the next new time, its scratch slot to the next
        rewrite; what the file shows is untouched."""
        rec = self.pending.pop(t, None)
        if rec is None:
            return
        if rec.rewrite:
            self.rewrites.give_back(rec.index)
        else:
            self.free.append(rec.index)

    def _count(self) -> None:
        n = self.numrecs
        while n in self.complete:
            n += 1
        if n != self.numrecs:
            os.fdatasync(self.fd)  # the records' values reach the disk before the count that shows them
            pwrite_all(self.fd, memoryview(struct.pack(">Q", n)), _NUMRECS_AT)
            self.numrecs = n

    def _fill_holes(self) -> None:
        """Records given back below complete ones: the highest complete records moved into them, so
        that the count covers every complete record."""
        for hole in sorted(self.free):
            top = max(self.complete, default=-1)
            if top < hole:
                break
            copy_bytes(self.fd, self.record_start + self.recsize * top,
                       self.fd, self.record_start + self.recsize * hole, self.recsize)
            t = next(t for t, r in self.times.items() if r == top)
            self.complete.discard(top)
            self.complete.add(hole)
            self.times[t] = hole
        self.free.clear()
        self.top = max(self.complete, default=-1) + 1
        self._count()

    def sync(self) -> None:
        """Staged rewrites in, and everything on disk."""
        self._swap_in()
        os.fsync(self.fd)

    def _swap_in(self) -> None:
        if self.rewrites.apply():
            fd = os.open(self.path, os.O_RDWR)  # the file renamed over the one still open
            os.close(self.fd)
            self.fd = fd

    def close(self) -> None:
        """Staged rewrites in, every complete record counted (times that failed leave no gap), closed."""
        if self.fd < 0:
            return
        try:
            for t in list(self.pending):  # incomplete at the end: given back like failed times
                self.release(t)
            self._swap_in()
            self._fill_holes()
            os.fsync(self.fd)
        finally:
            os.close(self.fd)
            self.fd = -1
            self.rewrites.close()
