"""Communicator: mpi4py's when launched by mpiexec, a serial stand-in otherwise.

Only this module imports mpi4py. The numerics receive a :class:`Comm` and call
its few collective methods, so serial, threaded and MPI runs share one code path.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from enkflow.parallel.leave import mapped_shm_names


class Comm(Protocol):
    """The collective operations enkflow needs."""

    rank: int
    size: int

    def allreduce_sum(self, a: np.ndarray) -> np.ndarray: ...
    def allgather_rows(self, a: np.ndarray) -> np.ndarray: ...
    def bcast(self, a: Any, root: int = 0) -> Any: ...
    def allgather_obj(self, obj: Any) -> list[Any]: ...
    def barrier(self) -> None: ...
    def split(self, color: int, key: int = 0) -> "Comm": ...
    def iscatterv(self, sendbuf: np.ndarray | None, counts: Sequence[int], recvbuf: np.ndarray, root: int = 0) -> Request: ...
    def igatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray | None, counts: Sequence[int], root: int = 0) -> Request: ...
    def alltoallv_rows(self, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int]) -> np.ndarray: ...
    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int]) -> tuple[np.ndarray, np.ndarray]: ...


class Request(Protocol):
    """A pending non-blocking operation; ``wait()`` completes it."""

    def wait(self) -> None: ...


class DoneRequest:
    """An operation that completed when it was posted (serial stand-in)."""

    def wait(self) -> None:
        return None


def _at_root(buf: np.ndarray | None, name: str) -> np.ndarray:
    """The root's buffer of a scatter or gather: other ranks pass None, the root may not."""
    if buf is None:
        raise ValueError(f"the root rank must pass {name} (only other ranks pass None)")
    return buf


def _displs(counts: Sequence[int] | np.ndarray) -> np.ndarray:
    c = np.asarray(counts, dtype=np.int64)
    return np.concatenate(([0], np.cumsum(c)[:-1])) if c.size else c


class SerialComm:
    """One process: every collective is the identity."""

    rank = 0
    size = 1

    def allreduce_sum(self, a: np.ndarray) -> np.ndarray:
        return np.array(a, copy=True)

    def allgather_rows(self, a: np.ndarray) -> np.ndarray:
        return np.array(a, copy=True)

    def bcast(self, a: Any, root: int = 0) -> Any:
        return a

    def allgather_obj(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        return None

    def split(self, color: int, key: int = 0) -> "SerialComm":
        return self

    def iscatterv(self, sendbuf: np.ndarray | None, counts: Sequence[int], recvbuf: np.ndarray, root: int = 0) -> DoneRequest:
        """Copy ``sendbuf[:counts[0]]`` into ``recvbuf`` (1-D buffers of one dtype)."""
        n = int(counts[0])
        if n:
            np.copyto(recvbuf[:n], _at_root(sendbuf, "sendbuf")[:n])
        return DoneRequest()

    def igatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray | None, counts: Sequence[int], root: int = 0) -> DoneRequest:
        n = int(counts[0])
        if n:
            np.copyto(_at_root(recvbuf, "recvbuf")[:n], sendbuf[:n])
        return DoneRequest()

    def alltoallv_rows(self, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int]) -> np.ndarray:
        """One rank sends its rows to itself: a Fortran-ordered copy of ``send``."""
        _check_alltoallv(send, send_counts, recv_counts, 1)
        return np.array(send, dtype=np.float64, order="F", copy=True)

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """One rank sends its rows to itself: a C-contiguous copy of ``send`` and its count."""
        send = _sendable(send)
        return np.array(send, copy=True), _row_counts(send, send_counts, 1)


def _row_counts(send: np.ndarray, send_counts: Sequence[int], size: int) -> np.ndarray:
    """``send_counts`` as (size,) int64, checked against the rows of ``send``."""
    c = np.asarray(send_counts, dtype=np.int64).reshape(-1)
    if c.shape != (size,):
        raise ValueError(f"alltoallv needs {size} send counts (one per rank), got {c.size}")
    if (c < 0).any():
        raise ValueError(f"send counts must be >= 0, got {c.tolist()}")
    if int(c.sum()) != send.shape[0]:
        raise ValueError(f"send counts sum to {int(c.sum())}, the array has {send.shape[0]} rows")
    return c


def _sendable(send: np.ndarray) -> np.ndarray:
    """``send`` C-contiguous, with rows (ndim >= 1) of plain bytes (no Python objects)."""
    a = np.ascontiguousarray(send)
    if a.ndim == 0:
        raise ValueError("alltoallv needs an array of rows (ndim >= 1), got a scalar")
    if a.dtype.hasobject:
        raise ValueError(f"alltoallv moves raw bytes; dtype {a.dtype} holds Python objects")
    return a


def _check_alltoallv(send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int], size: int) -> None:
    if send.ndim != 2:
        raise ValueError(f"alltoallv_rows needs a 2-D (rows, N) array, got shape {send.shape}")
    if len(recv_counts) != size:
        raise ValueError(f"alltoallv_rows needs {size} receive counts")
    _row_counts(send, send_counts, size)


def _as_bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of C-contiguous ``a`` as a 1-D uint8 view (any dtype, structured included)."""
    return a.reshape(-1).view(np.uint8)


def _row_bytes(a: np.ndarray) -> int:
    return a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))


class _MPIRequest:
    __slots__ = ("req",)

    def __init__(self, req: Any):
        self.req = req

    def wait(self) -> None:
        self.req.Wait()


class MPIComm:
    """Wraps an ``mpi4py.MPI.Comm``; buffers go through the uppercase (no-pickle) API."""

    def __init__(self, comm: Any):
        from mpi4py import MPI  # lazy: 60 ms, initialises MPI; only a process an MPI launcher started makes an MPIComm

        self._MPI = MPI
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def allreduce_sum(self, a: np.ndarray) -> np.ndarray:
        a = np.ascontiguousarray(a)
        out = np.empty_like(a)
        self.comm.Allreduce(a, out, op=self._MPI.SUM)
        return out

    def allgather_rows(self, a: np.ndarray) -> np.ndarray:
        """Concatenate every rank's ``a`` along axis 0 (rank order); same trailing shape."""
        a = np.ascontiguousarray(a)
        rows = np.array(self.comm.allgather(a.shape[0]), dtype=np.int64)
        row_elems = int(np.prod(a.shape[1:], dtype=np.int64))
        out = np.empty((int(rows.sum()),) + a.shape[1:], dtype=a.dtype)
        counts = rows * row_elems
        displs = np.concatenate(([0], np.cumsum(counts)[:-1]))
        mpitype = self._MPI._typedict[a.dtype.char]
        self.comm.Allgatherv(a, [out, counts, displs, mpitype])
        return out

    def bcast(self, a: Any, root: int = 0) -> Any:
        if isinstance(a, np.ndarray):
            self.comm.Bcast(a, root=root)
            return a
        return self.comm.bcast(a, root=root)

    def allgather_obj(self, obj: Any) -> list[Any]:
        # Only for small metadata (counts, names); bulk data always uses buffers.
        return self.comm.allgather(obj)

    def barrier(self) -> None:
        """Wait for every rank, giving the core back while waiting (:func:`_wait_politely`): MPICH's
        blocking calls spin, and a spinning rank takes the CPU of the ranks still working wherever
        processes outnumber cores (an analysis beside its members, SMT siblings, a shared node)."""
        _wait_politely(self.comm.Ibarrier())

    def split(self, color: int, key: int = 0) -> "MPIComm":
        """Sub-communicator of the ranks with the same ``color``, ordered by ``key``."""
        return MPIComm(self.comm.Split(color, key))

    def _vspec(self, buf: np.ndarray, counts: Sequence[int]) -> list[Any]:
        c = np.asarray(counts, dtype=np.int64)
        return [buf, c, _displs(c), self._MPI._typedict[buf.dtype.char]]

    def iscatterv(self, sendbuf: np.ndarray | None, counts: Sequence[int], recvbuf: np.ndarray, root: int = 0) -> _MPIRequest:
        """Non-blocking scatter of 1-D ``sendbuf`` (on ``root``) in rank-order pieces of ``counts``
        elements into each rank's 1-D contiguous ``recvbuf`` (``counts[rank]`` elements used).
        Returns an MPI request; call ``wait()`` before touching either buffer."""
        send = self._vspec(_at_root(sendbuf, "sendbuf"), counts) if self.rank == root else None
        n = int(counts[self.rank])
        return _MPIRequest(self.comm.Iscatterv(send, [recvbuf, n, self._MPI._typedict[recvbuf.dtype.char]], root=root))

    def igatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray | None, counts: Sequence[int], root: int = 0) -> _MPIRequest:
        """Mirror of :meth:`iscatterv`: gathers each rank's ``counts[rank]`` elements into 1-D
        ``recvbuf`` on ``root`` in rank order."""
        n = int(counts[self.rank])
        recv = self._vspec(_at_root(recvbuf, "recvbuf"), counts) if self.rank == root else None
        return _MPIRequest(self.comm.Igatherv([sendbuf, n, self._MPI._typedict[sendbuf.dtype.char]], recv, root=root))

    def alltoallv_rows(self, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int]) -> np.ndarray:
        """Exchange row blocks: this rank's ``send`` (n_send, N) float64, any order, holds
        ``send_counts[r]`` consecutive rows for rank ``r`` (in rank order); returns the rows
        received, (sum(recv_counts), N) float64 in Fortran order, ``recv_counts[r]`` rows from
        rank ``r`` in rank order. Every rank must pass the same N; ``recv_counts`` on this rank
        must equal ``send_counts[this rank]`` on each sender (collective, MPI_Alltoallv).
        The rows travel packed in C order (each row's N members contiguous)."""
        _check_alltoallv(send, send_counts, recv_counts, self.size)
        sbuf = np.ascontiguousarray(send, dtype=np.float64)
        rbuf = np.empty((int(np.sum(recv_counts)), send.shape[1]), dtype=np.float64)
        row = _row_bytes(sbuf)
        self._alltoallv_bytes(sbuf, np.asarray(send_counts, dtype=np.int64) * row,
                              rbuf, np.asarray(recv_counts, dtype=np.int64) * row)
        return np.asfortranarray(rbuf)

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Sparse all-to-all of rows: ``send`` (n_send, ...) of any dtype holds ``send_counts[q]``
        consecutive rows for rank ``q``, in rank order. Returns the rows received (C order, the
        same dtype and trailing shape), ``recv_counts[q]`` rows from rank ``q`` in rank order, and
        ``recv_counts`` (P,) int64. Collective; every rank must pass rows of the same size in bytes
        (checked on every rank, so all raise together). The counts travel with one Alltoall, the
        rows as bytes with one Alltoallv (mpi4py uses MPI-4's large-count ``MPI_Alltoallv_c``, so a
        rank may send or receive more than 2**31 bytes)."""
        send = _sendable(send)
        sc = _row_counts(send, send_counts, self.size)
        row = _row_bytes(send)
        meta = np.empty((self.size, 2), dtype=np.int64)  # per peer: (rows, bytes per row)
        self.comm.Alltoall(np.column_stack((sc, np.full(self.size, row, dtype=np.int64))), meta)
        if (meta[:, 1] != row).any():
            raise ValueError(f"alltoallv: the ranks' rows differ in size (bytes per row by rank: {meta[:, 1].tolist()})")
        rc = np.ascontiguousarray(meta[:, 0])
        recv = np.empty((int(rc.sum()),) + send.shape[1:], dtype=send.dtype)
        self._alltoallv_bytes(send, sc * row, recv, rc * row)
        return recv, rc

    def _alltoallv_bytes(self, send: np.ndarray, send_bytes: np.ndarray, recv: np.ndarray, recv_bytes: np.ndarray) -> None:
        """MPI_Alltoallv of C-contiguous ``send`` into ``recv`` in bytes per peer (int64, rank order)."""
        B = self._MPI.BYTE
        self.comm.Alltoallv([_as_bytes(send), send_bytes, _displs(send_bytes), B],
                            [_as_bytes(recv), recv_bytes, _displs(recv_bytes), B])


_FIRST_NAP_S = 20e-6
_LONGEST_NAP_S = 2e-3  # the most a barrier adds once the last rank arrives


def _wait_politely(req: Any) -> None:
    """Complete the MPI request ``req`` by testing it between naps that double from 20 us to 2 ms,
    so a rank that waits long costs its node almost no CPU and learns of the end within 2 ms. Only for
    a request that moves no data (a barrier): a large message moves in pieces, each needing the
    progress engine that a test runs, and naps between them would slow it."""
    nap = _FIRST_NAP_S
    while not req.Test():
        time.sleep(nap)
        nap = min(2 * nap, _LONGEST_NAP_S)


_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "HYDI_CONTROL_FD")


def launched_by_mpiexec() -> bool:
    """True when an MPI launcher started this process (avoids importing MPI otherwise)."""
    return any(k in os.environ for k in _MPI_ENV)


def node_names(comm: Comm) -> list[str]:
    """Collective: the host name of every rank's node, by rank."""
    return [str(n) for n in comm.allgather_obj(socket.gethostname())]


def get_comm(force_serial: bool = False) -> Comm:
    """The world communicator under mpiexec, else a :class:`SerialComm`."""
    if force_serial or not launched_by_mpiexec():
        return SerialComm()
    before = set(mapped_shm_names())
    from mpi4py import MPI  # lazy: 60 ms and initialises MPI; a process no MPI launcher started runs serial

    world = MPI.COMM_WORLD
    world.Barrier()  # every rank is past MPI_Init: the ranks of a node have mapped the memory they share
    # Its name is needed no longer, and only MPI_Finalize would remove it: a rank killed, or one that
    # leaves without finalizing, would leave it in the node's memory until reboot.
    for name in mapped_shm_names():
        if name not in before:
            name.unlink(missing_ok=True)
    if world.Get_size() == 1:
        return SerialComm()
    return MPIComm(world)
