"""NetCDF-3 headers (classic CDF-1, 64-bit offset CDF-2, 64-bit data CDF-5), parsed directly.

The header gives every variable's ``begin`` byte offset; data are big-endian. A record
variable (one along the unlimited dimension) is contiguous only while the file holds at most
one record; with more, its records interleave with the other record variables and it goes
through the NetCDF library. Spec: https://docs.unidata.ucar.edu/netcdf-c/current/file_format_specifications.html
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from enkflow.errors import FileFormatError
from enkflow.io.storage import FileStructure, VarStorage

MAGICS = {b"CDF\x01": "cdf1", b"CDF\x02": "cdf2", b"CDF\x05": "cdf5"}
_NC_DIMENSION, _NC_VARIABLE, _NC_ATTRIBUTE = 10, 11, 12
# nc_type -> (big-endian numpy dtype)
_TYPES = {1: ">i1", 2: "S1", 3: ">i2", 4: ">i4", 5: ">f4", 6: ">f8", 7: ">u1", 8: ">u2", 9: ">u4", 10: ">i8", 11: ">u8"}
_STREAMING = 0xFFFFFFFF


class _NeedMore(Exception):
    pass


@dataclass(frozen=True)
class HeaderVar:
    """One variable as the header defines it: ``shape`` with the record count first for a record
    variable (``is_record``: along the unlimited dimension); ``begin``: the byte offset of its first
    value (of record 0 for a record variable); ``dtype`` big-endian."""

    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    begin: int
    is_record: bool


@dataclass(frozen=True)
class Header:
    """A NetCDF-3 header: ``version`` (cdf1, cdf2, cdf5), ``numrecs`` (records along the unlimited
    dimension; at byte 4, 4 bytes, or 8 in cdf5), the variables in the order of the file."""

    version: str
    numrecs: int
    variables: dict[str, HeaderVar]


class _Reader:
    def __init__(self, buf: bytes, version: str):
        self.b = buf
        self.p = 4
        self.big = version == "cdf5"  # CDF-5: 8-byte counts and sizes
        self.off64 = version in ("cdf2", "cdf5")

    def _take(self, n: int) -> bytes:
        if self.p + n > len(self.b):
            raise _NeedMore
        out = self.b[self.p : self.p + n]
        self.p += n
        return out

    def u32(self) -> int:
        return struct.unpack(">I", self._take(4))[0]

    def count(self) -> int:
        return struct.unpack(">Q", self._take(8))[0] if self.big else self.u32()

    def offset(self) -> int:
        return struct.unpack(">Q", self._take(8))[0] if self.off64 else self.u32()

    def name(self) -> str:
        n = self.count()
        s = self._take(n)
        self._take(-n % 4)
        return s.decode("utf-8", "replace")

    def skip_attrs(self) -> None:
        tag = self.u32()
        n = self.count()
        if tag == 0:
            return
        if tag != _NC_ATTRIBUTE:
            raise ValueError(f"bad attribute-list tag {tag}")
        for _ in range(n):
            self.name()
            t = self.u32()
            k = self.count()
            size = k * np.dtype(_TYPES[t]).itemsize
            self._take(size + (-size % 4))


def _parse(buf: bytes, version: str) -> Header:
    r = _Reader(buf, version)
    numrecs = r.count()
    tag = r.u32()
    n = r.count()
    dims: list[tuple[str, int]] = []
    if tag == _NC_DIMENSION:
        for _ in range(n):
            dims.append((r.name(), r.count()))
    elif tag != 0:
        raise ValueError(f"bad dimension-list tag {tag}")
    r.skip_attrs()
    tag = r.u32()
    n = r.count()
    out = {}
    if tag == _NC_VARIABLE:
        for _ in range(n):
            name = r.name()
            nd = r.count()
            ids = [r.count() for _ in range(nd)]
            r.skip_attrs()
            t = r.u32()
            r.count()  # vsize: recomputed from the shape (it saturates for huge variables)
            begin = r.offset()
            if t not in _TYPES:
                raise ValueError(f"unknown nc_type {t} of variable {name}")
            vd = tuple(dims[i][0] for i in ids)
            is_rec = bool(ids) and dims[ids[0]][1] == 0
            shape = tuple((numrecs if (k == 0 and is_rec) else dims[i][1]) for k, i in enumerate(ids))
            out[name] = HeaderVar(vd, shape, np.dtype(_TYPES[t]), begin, is_rec)
    elif tag != 0:
        raise ValueError(f"bad variable-list tag {tag}")
    return Header(version, numrecs, out)


def read_header(path: str) -> tuple[Header, int]:
    """Parse a NetCDF-3 header: it and the file's size in bytes; raises :class:`FileFormatError`
    naming the file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FileFormatError("file not found", path=path) from None
    except OSError as exc:
        raise FileFormatError(f"cannot open: {exc.strerror}", path=path) from None
    try:
        size = os.fstat(fd).st_size
        want = 1 << 16
        while True:
            buf = os.pread(fd, want, 0)
            version = MAGICS.get(buf[:4])
            if version is None:
                raise FileFormatError("not a NetCDF-3 file (bad magic number)", path=path)
            try:
                header = _parse(buf, version)
                break
            except _NeedMore:
                if len(buf) < want:
                    raise FileFormatError("truncated NetCDF-3 header", path=path) from None
                want *= 4
            except (ValueError, KeyError, struct.error) as exc:
                raise FileFormatError(f"corrupt NetCDF-3 header: {exc}", path=path) from None
    finally:
        os.close(fd)
    if header.numrecs == _STREAMING:
        raise FileFormatError("NetCDF-3 file in streaming mode (numrecs unknown)", path=path)
    return header, size


def read_structure(path: str) -> FileStructure:
    """Parse a NetCDF-3 header; raises :class:`FileFormatError` naming the file."""
    header, size = read_header(path)
    numrecs = header.numrecs
    n_recvars = sum(1 for v in header.variables.values() if v.is_record)
    variables = {}
    for name, v in header.variables.items():
        contiguous = not v.is_record or numrecs <= 1 or n_recvars == 1
        reason = "" if contiguous else f"record variable with {numrecs} interleaved records"
        variables[name] = VarStorage(name, v.dims, v.shape, v.dtype, v.begin if contiguous else None, contiguous, reason)
    return FileStructure(path, header.version, size, variables)
