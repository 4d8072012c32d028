"""The write-ahead log's share of an update (:mod:`enkflow.io.wal`) that depends on the file layout:
the log bytes one task's rows need, and the replay of its committed records into the files."""

from __future__ import annotations

import numpy as np

from enkflow.fsutil import pwrite_full
from enkflow.io import library
from enkflow.io.logrecord import LogRecord, Slab
from enkflow.io.rowio import _spans, pread_full
from enkflow.io.storage import FileStructure
from enkflow.io.wal import WriteAheadLog
from enkflow.state import StateLayout


def _pad(n: int) -> int:
    return n + (-n % 8)  # log records start at multiples of 8 bytes


def log_bytes_per_file(layout: StateLayout, structure: FileStructure, g0: int, g1: int, chunk_elems: int) -> int:
    """Bytes of log records that state rows ``[g0, g1)`` of one member file need (pieces of at most
    ``chunk_elems`` rows; masked pieces log their covering ranges, library pieces whole leading-axis slabs)."""
    per_file = 0
    for p in layout.pieces(g0, g1, chunk_elems):
        vs = structure.variables[p.var.name]
        isz = vs.dtype.itemsize
        if not vs.contiguous:
            inner = int(np.prod(vs.shape[1:], dtype=np.int64)) if len(vs.shape) > 1 else 1
            per_file += _pad((-(-p.elem_stop // inner) - p.elem_start // inner) * inner * isz)
        elif p.select is None:
            per_file += _pad(p.n_rows * isz)
        else:
            per_file += sum(_pad(int(p.select[k1 - 1] - p.select[k0] + 1) * isz) for k0, k1 in _spans(p, chunk_elems))
    return per_file


def replay(log: WriteAheadLog, records: list[LogRecord], fds: list[int], paths: list[str], chunk_bytes: int) -> None:
    """Write this task's committed log ``records`` into the member files (``fds``/``paths``), ``chunk_bytes`` at a time."""
    buf = np.empty(chunk_bytes, dtype=np.uint8)
    for r in records:
        lfd, lpath = log.fds[r.log], log.paths[r.log]
        if isinstance(r.dest, Slab):
            sl = r.dest
            vals = np.empty(r.nbytes, dtype=np.uint8)
            pread_full(lfd, vals, r.log_offset, lpath, sl.var)
            library.write_slab(paths[r.member], sl.var, sl.i0, sl.i1, vals.view(np.dtype(sl.dtype)))
            continue
        done = 0
        while done < r.nbytes:
            k = min(buf.size, r.nbytes - done)
            pread_full(lfd, buf[:k], r.log_offset + done, lpath, None)
            pwrite_full(fds[r.member], buf[:k], r.dest + done)
            done += k
