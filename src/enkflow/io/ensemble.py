"""``EnsembleFiles``: read N_e member restart files into ``X`` and update them in place.

The parallel multi-file algorithm of Zheng et al. (2020, GMD 13, 3607-3625): P ranks own row
blocks (:class:`enkflow.parallel.RowBlocks`); N_io of them are I/O tasks, each serving a group
of consecutive ranks. At stage s, I/O task g reads from file (g + s) mod N_e the contiguous byte
range of its group's rows, posts a non-blocking scatter of them to the group and moves on to the
next file, so reading overlaps communication and no two I/O tasks read one file at once.
Writing mirrors it: non-blocking gathers, then ``pwrite``. When an I/O task serves only itself
(group of one rank, e.g. one process), its I/O threads read straight into the columns of ``X``.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import numpy as np

from enkflow.errors import EnkflowError, FileFormatError, InputError, RecoveryError
from enkflow.io import shadow, wal
from enkflow.io.config import IOConfig, UpdateMethod
from enkflow.io.logrecord import LogRecord
from enkflow.io.rowio import FileSink, RowIO, Scratch, Sink
from enkflow.io.log_replay import log_bytes_per_file, replay
from enkflow.io.storage import FileStructure
from enkflow.io.transfer import TransferStats
from enkflow.io.validate import state_nbytes, validate_files
from enkflow.parallel import Comm, Request, RowBlocks, SerialComm
from enkflow.parallel.together import raise_together
from enkflow.state import StateLayout


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


class EnsembleFiles:
    """N_e member restart files that share one structure, as seen by every rank of ``comm``.

    Parameters
    ----------
    paths : sequence of path
        The member files, member 0 first; column ``m`` of ``X`` is ``paths[m]``.
    layout : StateLayout
        Which variables and points form the state vector.
    mode : "r" or "r+"
        ``r+`` allows :meth:`update` (checks write access up front).
    comm : Comm, optional
        Defaults to a :class:`SerialComm`. Every rank must construct the object (collective).
    config : IOConfig, optional
        N_io, threads, request size, crash-safe update settings.
    recover : bool
        Finish an interrupted update of these files before anything else (default). With False
        a pending update raises :class:`RecoveryError`.

    Opening first finishes any interrupted update, then validates every file (existence, length,
    shared structure, state variables, write access for ``r+``) before reading or writing a
    single byte; a problem raises :class:`FileFormatError` or :class:`StructureMismatchError`
    naming the first bad file and variable, on every rank.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        layout: StateLayout,
        *,
        mode: Literal["r", "r+"] = "r",
        comm: Comm | None = None,
        config: IOConfig | None = None,
        recover: bool = True,
    ):
        if mode not in ("r", "r+"):
            raise InputError(f"mode must be 'r' or 'r+', got {mode!r}", item="mode")
        self.paths = [str(p) for p in paths]
        if not self.paths:
            raise InputError("no member files given", item="paths")
        self.layout = layout
        self.mode = mode
        self.comm: Comm = comm or SerialComm()
        self.config = config or IOConfig()
        self.n_members = len(self.paths)
        rank, size = self.comm.rank, self.comm.size
        self.blocks = RowBlocks(layout.n_rows, size)
        self.row_start, self.row_stop = self.blocks.bounds(rank)

        self.targets = [os.path.realpath(p) for p in self.paths]  # what a shadow replaces: the file, not a link to it
        self.structures: list[FileStructure]
        self.recovered_bytes: int
        self.update_method: UpdateMethod  # SHADOW or LOG: how a safe update goes (LOG for mode "r")
        self.structures, self.recovered_bytes, self.update_method = self._open_checked(recover)

        # I/O groups: consecutive ranks, group g served by its first rank.
        n_io = min(self.config.io_tasks or min(size, self.n_members), size)
        self.n_io = n_io
        self.group = rank * n_io // size
        members = [r for r in range(size) if r * n_io // size == self.group]
        self.group_ranks = members
        self.is_io_task = rank == members[0]
        self.group_rows = (self.blocks.start(members[0]), self.blocks.stop(members[-1]))
        self.group_counts = [self.blocks.size(r) for r in members]
        self.gcomm: Comm = self.comm.split(self.group, rank) if size > 1 else self.comm
        self.threads = self.config.threads or (min(4, _cpus()) if size == 1 else 1)
        if len(members) > 1:
            self.threads = 1
        self.order = [(self.group + s) % self.n_members for s in range(self.n_members)]
        # A shadow update keeps the files it replaced as the next one's shadows (their pages exist): named
        # by this object, removed when it closes.
        self._spare_id = self.comm.bcast(uuid.uuid4().hex[:12] if rank == 0 else None, root=0)
        self._mine = [m for m in range(self.n_members) if m % self.n_io == self.group] if self.is_io_task else []
        self._spares = shadow.Spares()
        # Removes the spares once: at close(), else at garbage collection or interpreter exit.
        self._drop_spares = weakref.finalize(self, shadow.remove_spares, [self.targets[m] for m in self._mine],
                                             self._spare_id)
        if self.update_method is not UpdateMethod.SHADOW:
            self._drop_spares.detach()
        self.rowio = RowIO(layout, self.structures, self.config.chunk_kb * 1024)
        self.state_bytes = state_nbytes(self.structures[0], layout)
        self._fds: list[int] = []
        if self.is_io_task:
            flags = os.O_RDWR if mode == "r+" else os.O_RDONLY
            try:
                for p in self.paths:
                    self._fds.append(os.open(p, flags))
            except OSError as exc:
                self.close()
                raise FileFormatError(f"cannot open: {exc.strerror}", path=p, variable=layout.variables[0].name) from None
        self._wal: wal.WriteAheadLog | None = None

    # -- housekeeping -----------------------------------------------------------------
    def _open_checked(self, recover: bool) -> tuple[list[FileStructure], int, UpdateMethod]:
        """Rank 0 finishes interrupted updates, then validates the files and chooses the update method
        (``r+``: removing the shadows of an update killed before its commit); every rank gets
        ``(structures, bytes recovered, method)`` or raises rank 0's error. Collective."""
        outcome: tuple[list[FileStructure], int, UpdateMethod] | EnkflowError | None = None
        if self.comm.rank == 0:
            try:
                recovered = self._recover_pending(recover)
                structures = validate_files(self.paths, self.layout, writable=self.mode == "r+")
                method = UpdateMethod.LOG
                if self.mode == "r+":
                    shadow.remove_leftovers(self.targets)
                    contiguous = all(structures[0].variables[v.name].contiguous for v in self.layout.variables)
                    method = shadow.choose(self.targets, contiguous, self.config.safe_update.method)
                outcome = (structures, recovered, method)
            except EnkflowError as exc:
                outcome = exc
        outcome = self.comm.bcast(outcome, root=0)
        if isinstance(outcome, EnkflowError):
            raise outcome
        assert outcome is not None  # rank 0 sent one of the two
        return outcome

    def _recover_pending(self, allowed: bool) -> int:
        done = 0
        for mk in wal.pending_markers(self.paths):
            if not allowed:
                raise RecoveryError("an interrupted update of these files is pending; open with recover=True to finish it", path=str(mk))
            done += wal.recover(mk)
        return done

    @property
    def lossless(self) -> bool:
        """Whether every state variable is stored as float64, so the files hold ``X`` exactly."""
        dtypes = (self.structures[0].variables[v.name].dtype for v in self.layout.variables)
        return all(dt.kind == "f" and dt.itemsize == 8 for dt in dtypes)

    @property
    def n_local_rows(self) -> int:
        return self.row_stop - self.row_start

    def close(self) -> None:
        """Close the files and free the log space. Idempotent."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if hasattr(self, "_drop_spares"):  # absent when the constructor failed before it
            self._drop_spares()
        if self._wal is not None:
            self._wal.close()
            self._wal = None

    def __enter__(self) -> "EnsembleFiles":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - safety net
        try:
            self.close()
        except Exception:
            pass

    def _thread_map(self, fn: Callable[[int, list[int]], None]) -> None:
        """Run ``fn(k, members)`` on thread k for its share of this task's file order."""
        t = max(1, min(self.threads, self.n_members))
        shares = [self.order[k::t] for k in range(t)]
        if t == 1:
            fn(0, shares[0])
            return
        with ThreadPoolExecutor(t) as ex:
            for f in [ex.submit(fn, k, shares[k]) for k in range(t)]:
                f.result()

    def _check_x(self, X: np.ndarray) -> None:
        want = (self.n_local_rows, self.n_members)
        if not isinstance(X, np.ndarray) or X.shape != want or X.dtype != np.float64:
            raise InputError(f"X must be float64 of shape {want} (local rows, members), got {getattr(X, 'dtype', type(X))} {getattr(X, 'shape', '')}", item="X")
        if not X.flags.f_contiguous:
            raise InputError("X must be in Fortran order (each member's rows contiguous)", item="X")

    # -- read ---------------------------------------------------------------------------
    def read(self, X: np.ndarray | None = None) -> np.ndarray:
        """Read this rank's state rows of every member into ``X``.

        Returns ``X`` of shape (n_local_rows, n_members), float64, Fortran order: column ``m``
        holds rows ``[row_start, row_stop)`` of member file ``paths[m]``. Collective.
        """
        return self.read_timed(X)[0]

    def read_timed(self, X: np.ndarray | None = None) -> tuple[np.ndarray, TransferStats]:
        """:meth:`read`, also returning its :class:`TransferStats`."""
        if X is None:
            X = np.empty((self.n_local_rows, self.n_members), dtype=np.float64, order="F")
        self._check_x(X)
        self.comm.barrier()
        t0 = time.perf_counter()
        if len(self.group_ranks) == 1:
            self._read_own(self.row_start, self.row_stop, X)
        elif self.is_io_task:
            g0, g1 = self.group_rows
            bufs = [np.empty(g1 - g0, dtype=np.float64) for _ in range(2)]
            sc = self.rowio.scratch()
            reqs = []
            for s, m in enumerate(self.order):
                if s >= 2:
                    reqs[s - 2].wait()
                b = bufs[s % 2]
                self.rowio.read(m, self._fds[m], g0, g1, b, sc)
                reqs.append(self.gcomm.iscatterv(b, self.group_counts, X[:, m], root=0))
            for rq in reqs[-2:]:
                rq.wait()
        else:
            reqs = [self.gcomm.iscatterv(None, self.group_counts, X[:, m], root=0) for m in self.order]
            for rq in reqs:
                rq.wait()
        self.comm.barrier()
        return X, TransferStats(self.state_bytes * self.n_members, time.perf_counter() - t0)

    def read_rows(self, r0: int, r1: int) -> np.ndarray:
        """State rows ``[r0, r1)`` of every member, (r1 - r0, n_members) float64, Fortran order, read by this
        process alone (not collective; it must hold the files: an I/O task, as every rank of a serial ``comm``
        is). For a part of the state that is not this rank's block: a row block of the whole state streamed in
        bounded memory, or the rows another decomposition gives this rank."""
        if not (self.is_io_task and 0 <= r0 <= r1 <= self.layout.n_rows):
            raise InputError(f"rows [{r0}, {r1}) of {self.layout.n_rows} are not readable by this task", item="rows")
        X = np.empty((r1 - r0, self.n_members), dtype=np.float64, order="F")
        self._read_own(r0, r1, X)
        return X

    def _read_own(self, r0: int, r1: int, X: np.ndarray) -> None:
        """Rows ``[r0, r1)`` of every member into the columns of ``X``, from this task's own files (threads)."""

        def work(k: int, members: list[int]) -> None:
            sc = self.rowio.scratch()
            for m in members:
                self.rowio.read(m, self._fds[m], r0, r1, X[:, m], sc)

        self._thread_map(work)

    # -- write --------------------------------------------------------------------------
    def _emit_all(self, X: np.ndarray, sinks: Callable[[int], Sink]) -> None:
        """Send the final bytes of every member's rows (values from ``X``) to ``sinks(k)`` (thread k)."""
        r0, r1 = self.row_start, self.row_stop
        if len(self.group_ranks) == 1:

            def work(k: int, members: list[int]) -> None:
                sc = self.rowio.scratch()
                sink = sinks(k)
                for m in members:
                    self.rowio.emit(m, self._fds[m], r0, r1, X[:, m], sc, sink)

            self._thread_map(work)
        elif self.is_io_task:
            g0, g1 = self.group_rows
            bufs = [np.empty(g1 - g0, dtype=np.float64) for _ in range(2)]

            def post(s: int) -> Request:
                return self.gcomm.igatherv(X[:, self.order[s]], bufs[s % 2], self.group_counts, root=0)

            sc = self.rowio.scratch()
            sink = sinks(0)
            reqs = [post(s) for s in range(min(2, self.n_members))]
            for s, m in enumerate(self.order):
                reqs[s].wait()
                self.rowio.emit(m, self._fds[m], g0, g1, bufs[s % 2], sc, sink)
                if s + 2 < self.n_members:
                    reqs.append(post(s + 2))
        else:
            reqs = [self.gcomm.igatherv(X[:, m], None, self.group_counts, root=0) for m in self.order]
            for rq in reqs:
                rq.wait()

    def _log_sizes(self) -> list[int]:
        """Bytes each of this task's log files receives per update."""
        if not self.is_io_task:
            return []
        g0, g1 = self.group_rows if len(self.group_ranks) > 1 else (self.row_start, self.row_stop)
        per_file = log_bytes_per_file(self.layout, self.structures[0], g0, g1, self.rowio.chunk_elems)
        t = max(1, min(self.threads, self.n_members))
        return [per_file * len(self.order[k::t]) for k in range(t)]

    def prepare_update(self) -> float:
        """Allocate the crash-safe update's log space now (e.g. in a thread while the analysis
        runs) so that :meth:`update` does not pay for it. Returns the seconds it took on this
        rank. Collective only in that every rank may call it; it does no communication."""
        if self.mode != "r+" or not self.config.safe_update.enabled or not self.is_io_task:
            return 0.0
        if self.update_method is UpdateMethod.SHADOW:
            t0 = time.perf_counter()
            self._spares.make(self.targets, self._mine, self._spare_id)
            return time.perf_counter() - t0
        return self._prepare_log()[1]

    def _prepare_log(self) -> tuple[wal.WriteAheadLog, float]:
        """This I/O task's log, made on first use, with room for an update; and the seconds its allocation took."""
        sizes = self._log_sizes()
        if self._wal is None:
            cfg = self.config.safe_update
            d = Path(cfg.log_dir) if cfg.log_dir is not None else wal.default_log_dir(self.paths[0])
            self._wal = wal.WriteAheadLog(d, f"{wal.ensemble_key(self.paths)}-g{self.group}", durable=cfg.durable)
            # The log holds a copy of the state on a memory tier: free it even if close() is
            # never called (at garbage collection or interpreter exit).
            weakref.finalize(self, self._wal.close)
        return self._wal, self._wal.prepare(sizes)

    def update(self, X: np.ndarray, *, safe: bool | None = None, completion: dict[str, object] | None = None) -> TransferStats:
        """Write ``X`` (n_local_rows, n_members) float64, Fortran order, back into the member
        files, in place.

        Only the state variables' bytes change (converted to each file's dtype and byte order;
        unmasked points and every other variable and attribute stay byte-identical). With
        ``safe`` (default: ``config.safe_update.enabled``) a kill at any instant leaves the
        files recoverable: the next open finishes the update. Collective.

        ``completion`` (``{"path": ..., "body": {...}}``, rank 0's counts) is a JSON record
        written atomically after the last file byte: with ``safe`` it is part of the commit, so
        it exists if and only if the update was applied, even after a kill and recovery
        (:func:`enkflow.io.wal.commit`). Without ``safe`` it is written after the files.
        """
        if self.mode != "r+":
            raise FileFormatError("opened read-only (mode 'r'); open with mode='r+' to update", path=self.paths[0], variable=self.layout.variables[0].name)
        self._check_x(X)
        safe = self.config.safe_update.enabled if safe is None else safe
        return self._update_safe(X, completion) if safe else self._update_direct(X, completion)

    def _update_direct(self, X: np.ndarray, completion: dict[str, object] | None) -> TransferStats:
        """:meth:`update` without the log: a kill may leave the files half written."""
        self.comm.barrier()
        t0 = time.perf_counter()
        kept = self._spares.still(self._mine, self._fds)  # state bytes only change: the spares still hold the rest
        fsink = FileSink(self._fds, self.paths)
        self._emit_all(X, lambda k: fsink)
        self.comm.barrier()
        self._spares.renew(kept, self._fds)
        if self.comm.rank == 0:
            wal.write_completion(completion)
        self.comm.barrier()
        return TransferStats(self.state_bytes * self.n_members, time.perf_counter() - t0)

    def _update_safe(self, X: np.ndarray, completion: dict[str, object] | None) -> TransferStats:
        """:meth:`update` with a commit: through shadow files (:meth:`_update_shadow`), else through the
        write-ahead log: log, commit, write, clear (:mod:`enkflow.io.wal`)."""
        if self.update_method is UpdateMethod.SHADOW:
            return self._update_shadow(X, completion)
        self.comm.barrier()
        t0 = time.perf_counter()
        log, prep = self._prepare_log() if self.is_io_task else (None, 0.0)
        durable = self.config.safe_update.durable
        uid = self.comm.bcast(str(uuid.uuid4()) if self.comm.rank == 0 else None, root=0)
        records = self._log(X, log, uid)
        marker = self._commit(log, records, uid, completion)
        self.comm.barrier()
        t_log = time.perf_counter() - t0
        # From here the update is committed: the files are written, and a kill is finished by recovery.
        if len(self.group_ranks) == 1:
            fsink = FileSink(self._fds, self.paths)
            self._emit_all(X, lambda k: fsink)
        elif log is not None:
            replay(log, records, self._fds, self.paths, self.rowio.chunk_elems * 8)
        if durable and log is not None:
            for fd in self._fds:
                os.fsync(fd)
        self.comm.barrier()
        if marker is not None:
            wal.write_completion(completion)
            wal.clear(marker, durable)
        self.comm.barrier()
        if log is not None:
            log.committed = False
        return TransferStats(self.state_bytes * self.n_members, time.perf_counter() - t0, True, t_log, prep)

    def _update_shadow(self, X: np.ndarray, completion: dict[str, object] | None) -> TransferStats:
        """:meth:`update` through shadow files: write, commit, replace, clear (:mod:`enkflow.io.shadow`)."""
        self.comm.barrier()
        t0 = time.perf_counter()
        durable, marker = self.config.safe_update.durable, wal.marker_path(self.paths)
        uid = self.comm.bcast(str(uuid.uuid4()) if self.comm.rank == 0 else None, root=0)
        # Rank 0 makes the spares the shadows before any task opens one (a task that came first would create
        # a file the rename then unlinks, and write into it).
        raise_together(self.comm, lambda: shadow.adopt_spares(self.targets, uid, self._spare_id) if self.comm.rank == 0
                       else None)
        shadows = raise_together(self.comm, lambda: shadow.ShadowSet.open(self.targets, uid, self._fds, self._mine,
                                                                          self._spares) if self.is_io_task else None)
        sinks = [shadow.ShadowSink(shadows) for _ in range(self.threads)] if shadows is not None else []
        try:
            # A write that fails on one task (the disk filled up after the check) reaches every rank.
            raise_together(self.comm, lambda: self._emit_all(X, lambda k: sinks[k]))
            written = [w for part in self.comm.allgather_obj([w for sk in sinks for w in sk.records]) for w in part]
            raise_together(self.comm, lambda: shadows.fill(self._fds, written, self._mine, durable, self.threads)
                           if shadows is not None else None)
            plan = raise_together(self.comm, lambda: shadow.commit(marker, self.paths, self.targets, uid, self._spare_id,
                                                                   written, durable, completion) if self.comm.rank == 0 else None)
        except BaseException:
            if shadows is not None:
                shadows.remove(keep=marker.exists())
            raise
        if shadows is not None:
            shadows.close()
        t_log = time.perf_counter() - t0
        if plan is not None:  # committed: a kill from here on is finished by recovery
            plan.replace(list(range(self.n_members)), keep_spares=True)
            wal.write_completion(completion)
            wal.clear(marker, durable)
        self.comm.barrier()
        self._reopen()
        return TransferStats(self.state_bytes * self.n_members, time.perf_counter() - t0, True, t_log, 0.0)

    def _reopen(self) -> None:
        """Open the member files again (a shadow update replaced them: the old descriptors hold the old files,
        now the spares, which hold the new files' unwritten bytes)."""
        if not self._fds:
            return
        old = self._fds
        self._fds = [os.open(p, os.O_RDWR) for p in self.paths]
        for m in self._mine:
            self._spares.note(m, self._fds[m], old[m])
        for fd in old:
            os.close(fd)

    def _log(self, X: np.ndarray, log: wal.WriteAheadLog | None, uid: str) -> list[LogRecord]:
        """Write the final bytes of ``X`` into this task's log (``log``: None on a rank that is no
        I/O task); returns the records. Collective (the gathers of a group)."""
        log_sinks = log.sinks(uid) if log is not None else []
        lock = threading.Lock()

        def sink_for(k: int) -> Sink:
            with lock:
                return log_sinks[k]

        try:
            self._emit_all(X, sink_for)
        finally:
            for ls in log_sinks:
                ls.close()
        if log is not None and self.config.safe_update.durable:
            log.sync()
        return [r for ls in log_sinks for r in ls.records]

    def _commit(self, log: wal.WriteAheadLog | None, records: list[LogRecord], uid: str,
                completion: dict[str, object] | None) -> Path | None:
        """Rank 0 writes the commit marker of every task's records (their logs renumbered into
        one list); returns it on rank 0, None elsewhere. Collective."""
        everything = self.comm.allgather_obj((list(log.paths) if log is not None else [], records))
        marker = None
        if self.comm.rank == 0:
            logs: list[str] = []
            joined: list[LogRecord] = []
            for lpaths, recs in everything:
                joined.extend(r.in_log(len(logs) + r.log) for r in recs)
                logs.extend(lpaths)
            marker = wal.commit(self.paths, logs, joined, uid, self.config.safe_update.durable, completion)
        if log is not None:
            log.committed = True
        return marker


__all__ = ["EnsembleFiles", "Scratch", "TransferStats"]
