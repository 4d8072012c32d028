"""Reading and writing one file's state rows at the variables' byte offsets.

The fast path reads a float64 variable in the machine's byte order straight into the
destination (a column slice of ``X``: each member's rows are contiguous in Fortran order), with
no intermediate copy; a big-endian float64 variable (NetCDF-3) is read the same way and
byte-swapped in place. Other cases (float32, masks) go through a small per-thread scratch
buffer. Requests are issued in sub-ranges of ``chunk_bytes`` (4 MiB by default): that bounds the
scratch buffers, lets a byte swap run on data still in cache, and measured as fast as one huge
request (1 MiB was slightly slower with two threads).

Writing goes through a *sink* so that one routine produces the final bytes for both the files
(:class:`FileSink`, ``pwrite``) and the write-ahead log (:class:`enkflow.io.wal.LogSink`).
A masked piece is a read-modify-write of the covering byte range: the points outside the mask
are written back with the bytes just read, so they stay byte-identical.
"""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np

from enkflow.errors import FileFormatError
from enkflow.fsutil import pwrite_full
from enkflow.io import library
from enkflow.io.byteswap import swap8_copy, swap8_inplace
from enkflow.io.storage import FileStructure, VarStorage
from enkflow.state import Piece, StateLayout

NATIVE_F8 = np.dtype(np.float64)


class Scratch:
    """A per-thread byte buffer of ``nbytes`` for conversions and read-modify-write."""

    def __init__(self, nbytes: int):
        self.raw = np.empty(max(int(nbytes), 64), dtype=np.uint8)

    def view(self, dtype: np.dtype, count: int) -> np.ndarray:
        return self.raw[: count * dtype.itemsize].view(dtype)


def pread_full(fd: int, buf: np.ndarray, offset: int, path: str, var: str | None) -> None:
    """Fill the contiguous array ``buf`` with bytes from ``offset``; a short file is an error."""
    mv = memoryview(buf).cast("B")
    n = len(mv)
    done = 0
    while done < n:
        k = os.preadv(fd, [mv[done:]], offset + done)
        if k <= 0:
            raise FileFormatError(
                f"file ends at byte {offset + done}, inside the variable (its data run to byte {offset + n}): truncated",
                path=path, variable=var,
            )
        done += k


class Sink(Protocol):
    """Where the final bytes of a file's state ranges go. ``staging`` hands out the buffer in
    which converted bytes are prepared, so a sink that stores them (the log) gets them without
    another copy; ``put_bytes`` then takes either that buffer or any other array."""

    def staging(self, dtype: np.dtype, count: int, scratch: Scratch) -> np.ndarray: ...
    def put_bytes(self, member: int, offset: int, data: np.ndarray) -> None: ...
    def put_slab(self, member: int, var: str, i0: int, i1: int, values: np.ndarray) -> None: ...


class FileSink:
    """Writes straight into the member files (``fds[member]`` open for writing)."""

    def __init__(self, fds: list[int], paths: list[str]):
        self.fds = fds
        self.paths = paths

    def staging(self, dtype: np.dtype, count: int, scratch: Scratch) -> np.ndarray:
        return scratch.view(dtype, count)

    def put_bytes(self, member: int, offset: int, data: np.ndarray) -> None:
        pwrite_full(self.fds[member], data, offset)

    def put_slab(self, member: int, var: str, i0: int, i1: int, values: np.ndarray) -> None:
        library.write_slab(self.paths[member], var, i0, i1, values)


def _spans(piece: Piece, cap: int) -> list[tuple[int, int]]:
    """Split a masked piece into row ranges whose element span is at most ``cap`` elements."""
    sel = piece.select
    assert sel is not None
    out = []
    k0 = 0
    n = piece.n_rows
    while k0 < n:
        k1 = int(np.searchsorted(sel, sel[k0] + cap, side="left"))
        k1 = min(max(k1, k0 + 1), n)
        out.append((k0, k1))
        k0 = k1
    return out


class RowIO:
    """Reads and writes state rows of files that share ``structure`` (per-file offsets in
    ``structures``), described by ``layout``."""

    def __init__(self, layout: StateLayout, structures: list[FileStructure], chunk_bytes: int = 4 << 20):
        self.layout = layout
        self.structures = structures
        self.chunk_elems = max(int(chunk_bytes) // 8, 2) & ~1  # even: float32 halves stay 8-byte aligned

    def scratch(self) -> Scratch:
        return Scratch(self.chunk_elems * 8)

    def _vs(self, member: int, piece: Piece) -> VarStorage:
        return self.structures[member].variables[piece.var.name]

    # -- read ---------------------------------------------------------------------------
    def read(self, member: int, fd: int, r0: int, r1: int, dst: np.ndarray, scratch: Scratch) -> None:
        """Fill ``dst`` ((r1 - r0,) float64, contiguous) with state rows ``[r0, r1)`` of member file ``member``."""
        path = self.structures[member].path
        for p in self.layout.pieces(r0, r1, self.chunk_elems):
            vs = self._vs(member, p)
            d = dst[p.row_start - r0 : p.row_stop - r0]
            if not vs.contiguous:
                library.notice(path, vs)
                library.read_piece(path, vs, p, d)
                continue
            isz = vs.dtype.itemsize
            if p.select is None:
                off = vs.byte_offset(p.elem_start)
                if vs.dtype.kind == "f" and isz == 8:
                    pread_full(fd, d, off, path, vs.name)
                    if vs.dtype != NATIVE_F8:
                        swap8_inplace(d)
                else:
                    buf = scratch.view(vs.dtype, p.n_rows)
                    pread_full(fd, buf, off, path, vs.name)
                    np.copyto(d, buf)
            else:
                for k0, k1 in _spans(p, self.chunk_elems):
                    e0 = p.elem_start + int(p.select[k0])
                    span = int(p.select[k1 - 1] - p.select[k0]) + 1
                    buf = scratch.view(vs.dtype, span)
                    pread_full(fd, buf, vs.byte_offset(e0), path, vs.name)
                    d[k0:k1] = buf[p.select[k0:k1] - p.select[k0]]

    # -- write (to any sink) ------------------------------------------------------------
    def emit(self, member: int, fd: int, r0: int, r1: int, src: np.ndarray, scratch: Scratch, sink: Sink) -> None:
        """Send the final bytes of state rows ``[r0, r1)`` of member ``member`` (values ``src``,
        (r1 - r0,) float64) to ``sink``. ``fd`` (readable) serves the read-modify-write of
        masked pieces."""
        path = self.structures[member].path
        for p in self.layout.pieces(r0, r1, self.chunk_elems):
            vs = self._vs(member, p)
            s = src[p.row_start - r0 : p.row_stop - r0]
            if not vs.contiguous:
                library.notice(path, vs)
                i0, i1, slab = library.merged_slab(path, vs, p, s)
                sink.put_slab(member, vs.name, i0, i1, slab)
                continue
            isz = vs.dtype.itemsize
            if p.select is None:
                off = vs.byte_offset(p.elem_start)
                if vs.dtype == NATIVE_F8:
                    sink.put_bytes(member, off, s)
                elif vs.dtype.kind == "f" and isz == 8:
                    buf = sink.staging(vs.dtype, p.n_rows, scratch)
                    swap8_copy(s, buf)
                    sink.put_bytes(member, off, buf)
                else:
                    buf = sink.staging(vs.dtype, p.n_rows, scratch)
                    np.copyto(buf, s, casting="same_kind")
                    sink.put_bytes(member, off, buf)
            else:
                for k0, k1 in _spans(p, self.chunk_elems):
                    e0 = p.elem_start + int(p.select[k0])
                    span = int(p.select[k1 - 1] - p.select[k0]) + 1
                    buf = sink.staging(vs.dtype, span, scratch)
                    off = vs.byte_offset(e0)
                    pread_full(fd, buf, off, path, vs.name)
                    buf[p.select[k0:k1] - p.select[k0]] = s[k0:k1]
                    sink.put_bytes(member, off, buf)
