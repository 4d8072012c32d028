"""The references of ``enkflow bench io`` (:mod:`enkflow.bench.io`): plain ``pread``/``pwrite`` loops
(one thread, and enkflow's thread count), a netCDF4 loop and an xarray loop, each filling or writing a
full (n_rows, N_e) F-order float64 array; and the checks that the files' values are read and left as
they were."""

from __future__ import annotations

import hashlib
import os
import resource
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import netCDF4
import numpy as np

from enkflow.io.config import IOConfig
from enkflow.io.ensemble import EnsembleFiles
from enkflow.parallel import Comm
from enkflow.state import StateLayout

Reference = Callable[[np.ndarray], None]


class _References:
    """The state variables are float64 stored contiguously (as :func:`~enkflow.io.generate.make_ensemble`
    writes them); ``structures``: each file's variables (offset, dtype) as enkflow found them."""

    def __init__(self, paths: list[str], layout: StateLayout, structures: list[Any], threads: int,
                 chunk_bytes: int) -> None:
        self.paths, self.layout, self.structures = paths, layout, structures
        self.threads, self.chunk_bytes = threads, chunk_bytes

    def members(self, n_threads: int, fn: Callable[[int], None]) -> None:
        """``fn(m)`` for every member, on ``n_threads`` threads each taking every T-th file, as enkflow's
        reader does."""
        t = max(1, min(n_threads, len(self.paths)))
        if t == 1:
            for m in range(len(self.paths)):
                fn(m)
            return

        def share(k: int) -> None:
            for m in range(k, len(self.paths), t):
                fn(m)

        with ThreadPoolExecutor(t) as ex:
            for f in [ex.submit(share, k) for k in range(t)]:
                f.result()

    def pread_file(self, A: np.ndarray, m: int) -> None:
        """Physical: a big-endian (NetCDF-3) variable's bytes are left unswapped."""
        fd = os.open(self.paths[m], os.O_RDONLY)
        try:
            for sv in self.layout.variables:
                vs = self.structures[m].variables[sv.name]
                mv = memoryview(A[sv.rows, m]).cast("B")
                done = 0
                while done < len(mv):
                    done += os.preadv(fd, [mv[done:]], vs.offset + done)
        finally:
            os.close(fd)

    def pwrite_file(self, A: np.ndarray, m: int) -> None:
        """In the file's byte order: a big-endian variable is converted with NumPy in ``chunk_bytes``
        pieces (enkflow's request size), so that what it writes back is the values already there, byte
        for byte, and a kill at any moment leaves the files valid."""
        native = np.dtype(np.float64)
        fd = os.open(self.paths[m], os.O_WRONLY)
        try:
            for sv in self.layout.variables:
                vs = self.structures[m].variables[sv.name]
                col = A[sv.rows, m]
                if vs.dtype == native:
                    _pwrite_all(fd, memoryview(col).cast("B"), vs.offset)
                    continue
                step = max(self.chunk_bytes // vs.dtype.itemsize, 1)
                buf = np.empty(min(step, col.size), dtype=vs.dtype)
                for j in range(0, col.size, step):
                    piece = buf[: min(step, col.size - j)]
                    np.copyto(piece, col[j : j + piece.size])  # NumPy swaps the bytes in the cast
                    _pwrite_all(fd, memoryview(piece).cast("B"), vs.offset + j * vs.dtype.itemsize)
        finally:
            os.close(fd)

    def netcdf4_loop(self, A: np.ndarray) -> None:
        for m, p in enumerate(self.paths):
            ds = netCDF4.Dataset(p, "r")
            try:
                ds.set_auto_maskandscale(False)
                for sv in self.layout.variables:
                    A[sv.rows, m] = ds.variables[sv.name][...].reshape(-1)
            finally:
                ds.close()

    def xarray_loop(self, A: np.ndarray) -> None:
        import xarray as xr  # lazy: optional (the dev extra), ~0.9 s; without it no xarray figures

        for m, p in enumerate(self.paths):
            with xr.open_dataset(p, cache=False, mask_and_scale=False, decode_times=False) as ds:
                for sv in self.layout.variables:
                    A[sv.rows, m] = ds[sv.name].values.reshape(-1)


def references(paths: list[str], layout: StateLayout, structures: list[Any], threads: int = 1,
               chunk_bytes: int = 4 << 20) -> dict[str, Reference]:
    """Reference loops by name; each fills or writes a full (n_rows, N_e) F-order float64 array.
    ``pread``/``pwrite`` run one thread; ``pread_threads``/``pwrite_threads`` run ``threads`` threads
    (enkflow's count); ``netcdf4`` and ``xarray`` read file by file."""
    r = _References(paths, layout, structures, threads, chunk_bytes)
    return {
        "pread": lambda A: r.members(1, lambda m: r.pread_file(A, m)),
        "pread_threads": lambda A: r.members(threads, lambda m: r.pread_file(A, m)),
        "pwrite": lambda A: r.members(1, lambda m: r.pwrite_file(A, m)),
        "pwrite_threads": lambda A: r.members(threads, lambda m: r.pwrite_file(A, m)),
        "netcdf4": r.netcdf4_loop,
        "xarray": r.xarray_loop,
    }


def _pwrite_all(fd: int, mv: memoryview, offset: int) -> None:
    done = 0
    while done < len(mv):
        done += os.pwrite(fd, mv[done:], offset + done)


def drop_caches(paths: list[str]) -> str:
    """Empty the page cache of ``paths``: ``drop_caches`` where permitted, else fadvise."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return "drop_caches"
    except OSError:
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise-dontneed (drop_caches not permitted; evicts only these files' clean pages)"


def reset_peak_rss() -> None:
    """Reset the kernel's high-water mark of this process's RSS (Linux), so that the peak
    measured covers the enkflow phases only, not the file generation."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5\n")
    except OSError:
        pass


def peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def verify(paths: list[str], layout: StateLayout, X: np.ndarray, r0: int, r1: int) -> bool:
    """X's rows [r0, r1) equal netCDF4's values, file by file."""
    for m, p in enumerate(paths):
        ds = netCDF4.Dataset(p, "r")
        try:
            ds.set_auto_maskandscale(False)
            col = np.concatenate([np.asarray(ds.variables[n][...], dtype=np.float64).reshape(-1) for n in layout.names])
        finally:
            ds.close()
        if not np.array_equal(col[r0:r1], X[:, m]):
            return False
    return True


def digest(X: np.ndarray) -> list[bytes]:
    """A hash of each member's rows in ``X`` (n_local_rows, N_e)."""
    return [hashlib.blake2b(np.ascontiguousarray(X[:, m]).view(np.uint8)).digest() for m in range(X.shape[1])]


def unchanged(paths: list[str], layout: StateLayout, comm: Comm, cfg: IOConfig, X: np.ndarray,
              before: list[bytes]) -> bool:
    """The files still hold the values first read (``before``: their :func:`digest`; every method wrote
    back what was there). Reads into ``X`` (its contents are spent by then)."""
    with EnsembleFiles(paths, layout, mode="r", comm=comm, config=cfg) as ef:
        ef.read(X)
    return all(comm.allgather_obj(digest(X) == before))
