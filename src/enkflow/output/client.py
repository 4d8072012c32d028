"""The model's side of the output server: :class:`Output` (``add`` / ``sync`` / ``close``).

Each writer it sends to is a :class:`~enkflow.output.writer_process.WriterProcess` (started,
watched, killed and reported there), reached through a
:class:`~enkflow.output.writer_channel.WriterChannel` (socket, ring, pieces in flight); the checks of
a piece are :mod:`enkflow.output.piece`'s.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from enkflow.config import validate
from enkflow.errors import ConfigError, EnkflowError, InputError, StorageError
from enkflow.output import protocol as P
from enkflow.output.config import OutputConfig
from enkflow.output.piece import Region, check_piece
from enkflow.output.ring import Ring, queue_supported
from enkflow.output.writer_channel import WriterChannel, check_notices
from enkflow.output.writer_process import START_TIMEOUT_S, OutputError, WriterAddress, WriterProcess

__all__ = ["Output", "OutputError", "Region", "check_piece"]

log = logging.getLogger("enkflow.output")

POLL_MS = 100


class Output:
    """Asynchronous output: ``add`` hands an array to a writer process and returns at once.

    ``config``: an :class:`OutputConfig` or the ``[output]`` table as a dict. ``coords``: optional
    coordinate values per dimension name (1-D, the dimension's size). ``comm``: an
    :class:`enkflow.parallel.Comm`; rank 0 starts the writers, every rank adds its part
    (``region``) and ``close`` is collective. ``base_dir``: what a relative ``directory`` is
    relative to (default: the current directory).

    Semantics of :meth:`add`: the array is copied before ``add`` returns (into the writer's
    shared-memory ring, or into a buffer that ZeroMQ sends without a further copy), so the
    caller may change it at once. When ``buffer_mb`` of a writer are in flight, ``add`` waits
    (back-pressure): the waiting time and the largest backlog are in :meth:`stats`.

    Every wait for a writer (back-pressure, ``sync``, ``close``, the start) watches its progress
    (:mod:`enkflow.output.heartbeat`): a writer without progress for ``writer_timeout`` seconds
    (stopped, stuck in the file system) is killed and counts as failed (``on_writer_failure``).
    """

    def __init__(self, config: OutputConfig | Mapping[str, Any], *, coords: Mapping[str, Any] | None = None,
                 comm: Any = None, base_dir: str | os.PathLike[str] | None = None) -> None:
        self.cfg = config if isinstance(config, OutputConfig) else validate(OutputConfig, dict(config), prefix="output")
        d = Path(self.cfg.directory).expanduser()
        if not d.is_absolute():
            d = Path(base_dir or os.getcwd()) / d
        self.directory = d.resolve()
        self.comm = comm
        self.rank = comm.rank if comm is not None else 0
        self._coords = self._check_coords(coords or {})
        _check_compression(self.cfg)
        self._shapes = {f: self.cfg.shape(f) for f in self.cfg.fields}
        names = sorted(self.cfg.fields)
        n_writers = min(self.cfg.writers, max(1, len(names)))
        self._owner = {f: i % n_writers for i, f in enumerate(names)}
        self._limit = int(self.cfg.buffer_mb * (1 << 20))
        self._use_ring = self.cfg.transport == "shm" and queue_supported()
        if self.cfg.transport == "shm" and not self._use_ring:
            log.info("output: shared-memory notices need x86-64; the arrays go over ZeroMQ ipc instead")
        if self._use_ring:
            check_notices(self.cfg, self._shapes, self._limit)
        self._failures: list[str] = []
        self._stats: dict[str, Any] = {"adds": 0, "bytes": 0, "blocked_s": 0.0, "add_s": 0.0, "backlog_max_bytes": 0,
                                       "backlog_max_messages": 0, "lost_adds": 0, "lost_bytes": 0, "warnings": 0}
        self._runtime: Path | None = None
        self._ctx = zmq.Context()
        self._channels: list[WriterChannel] = []
        self._launched: list[WriterProcess] = []  # the writers rank 0 started (it ends them at the end)
        # Called at every turn of a wait for a writer: an owner that others watch (the output service)
        # shows it is alive meanwhile; the writer has its own watch (writer_timeout).
        self.on_wait: Callable[[], None] | None = None
        self._closed = False
        try:
            for i, address in enumerate(self._addresses(n_writers)):
                self._connect(i, address)
        except BaseException:
            for w in self._launched:
                w.end(self.directory)
            for w in self._launched:
                w.unlink_page()
            raise

    # -- start-up --------------------------------------------------------------------------

    def _check_coords(self, coords: Mapping[str, Any]) -> dict[str, list[float]]:
        out = {}
        for name, values in coords.items():
            if name not in self.cfg.dims:
                raise InputError(f"coordinate {name!r} is not a dimension of [output.dims] "
                                 f"({', '.join(sorted(self.cfg.dims))})", item=name)
            v = np.asarray(values, dtype=np.float64)
            if v.shape != (self.cfg.dims[name].size,):
                raise InputError(f"coordinate {name}: shape {v.shape}, the dimension has size {self.cfg.dims[name].size}",
                                 item=name)
            out[name] = v.tolist()
        return out

    def _fields_of(self, writer: int) -> list[str]:
        return [f for f, w in self._owner.items() if w == writer]

    def _addresses(self, n: int) -> list[WriterAddress]:
        """Where the ``n`` writers listen: rank 0 starts them and tells the others (or its error)."""
        info: Any = None
        if self.rank == 0:
            try:
                info = self._start_writers(n)
            except EnkflowError as exc:
                if self.comm is None:
                    raise
                info = str(exc)  # every rank raises it, none waits for writers that never came
        if self.comm is not None:
            info = self.comm.bcast(info, root=0)
        if isinstance(info, str):
            raise OutputError(info)
        return list(info)

    def _start_writers(self, n: int) -> list[WriterAddress]:
        self.directory.mkdir(parents=True, exist_ok=True)
        runtime = self._runtime = Path(tempfile.mkdtemp(prefix="enkflow-output-"))
        for i in range(n):
            endpoint = f"tcp://{self.cfg.bind}:*" if self.cfg.transport == "tcp" else f"ipc://{runtime}/writer{i}.sock"
            self._launched.append(WriterProcess.start(self.cfg, i, self._fields_of(i), self.directory, self._coords,
                                                      endpoint, runtime / f"writer{i}.log"))
        # A writer stopped or stuck before it is ready must not hang the model either.
        limit = max(START_TIMEOUT_S, self.cfg.writer_timeout) if self.cfg.writer_timeout > 0 else None
        return [w.wait_ready(limit) for w in self._launched]

    def _connect(self, i: int, address: WriterAddress) -> None:
        here = socket.gethostname()
        if address.host != here and self.cfg.transport != "tcp":
            raise OutputError(f"rank {self.rank} runs on {here}, the output writers on {address.host}: transport "
                              f"{self.cfg.transport!r} serves one node; set output.transport = 'tcp' (and bind)")
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if address.curve_key:
            sock.curve_serverkey = address.curve_key.encode()
            sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        if address.host != here:
            writer = WriterProcess.across_nodes(i, self._fields_of(i), address, sock, self.cfg.writer_timeout)
        elif self._launched:
            writer = self._launched[i]
        else:
            writer = WriterProcess.neighbour(i, self._fields_of(i), address)
        sock.connect(address.endpoint)
        ch = WriterChannel(writer, sock, Ring(self._limit) if self._use_ring else None, self._limit)
        self._channels.append(ch)
        ch.hello()
        self._wait_reply(ch, {P.WELCOME}, START_TIMEOUT_S)
        writer.silence.seconds()  # the first look: a writer silent from now on is silent for as long as the model computes
        if ch.ring is not None:
            ch.ring.unlink()  # both sides have it mapped: nothing to leave behind

    # -- liveness and replies ---------------------------------------------------------------

    def _hung(self, ch: WriterChannel) -> bool:
        """Whether ``ch``'s writer has made no progress for ``writer_timeout`` s; if so it is killed
        and counts as failed (``on_writer_failure`` applies)."""
        limit = self.cfg.writer_timeout
        silent = ch.writer.silent_beyond(limit)
        if silent is None:
            return False
        ch.release()  # what it did finish is not lost
        oldest = ch.pending[0].describe() if ch.pending else ""
        self._writer_lost(ch, ch.writer.kill_hung(silent, limit, oldest))
        return True

    def _writer_lost(self, ch: WriterChannel, why: str) -> None:
        ch.alive = False
        ch.lost_why = f"{ch.writer.who} {why}"
        lost, lost_bytes = ch.forget()
        self._stats["lost_adds"] += lost
        self._stats["lost_bytes"] += lost_bytes
        removed = ch.writer.remove_temporaries(self.directory) if self.rank == 0 else 0
        self._fail(ch.writer.lost_report(why, lost, lost_bytes, removed), fatal=True)

    def _fail(self, msg: str, fatal: bool) -> None:
        if fatal and self.cfg.on_writer_failure == "continue":
            log.error("OUTPUT LOST: %s", msg)
            warnings.warn(f"OUTPUT LOST: {msg}", RuntimeWarning, stacklevel=4)
            self._stats.setdefault("failures", []).append(msg)
            return
        self._failures.append(msg)

    def _raise_failures(self) -> None:
        if self._failures:
            msgs, self._failures = self._failures, []
            text = "\n".join(msgs[:5]) + (f"\n(and {len(msgs) - 5} more errors of the writers)" if len(msgs) > 5 else "")
            if "no space left" in text.lower() or "full?" in text:
                raise StorageError(text, path=str(self.directory))
            raise OutputError(text)

    def _handle(self, ch: WriterChannel, msg: dict[str, Any]) -> None:
        ch.heard += 1
        kind = msg["kind"]
        if ch.ring is None and kind in (P.ACK, P.ERROR) and ch.pending and ch.pending[0].seq == msg.get("seq"):
            ch.outstanding -= ch.pending.popleft().nbytes
        if msg.get("warning"):
            self._stats["warnings"] += 1
            warnings.warn(f"enkflow.output: {msg['warning']}", RuntimeWarning, stacklevel=4)
        if msg.get("error"):
            self._fail(f"output writer {ch.writer.index}: {msg['error']}", bool(msg.get("fatal")))
        if "stats" in msg:
            ch.writer_stats = msg["stats"]

    def _drain(self, ch: WriterChannel, quick: bool = False) -> None:
        """Handle the writer's messages that have arrived; free the ring slots it has finished with.
        ``quick`` (an add): with a ring, look at the socket only when the writer has told of a message
        not yet received; otherwise every add would pay for a ZeroMQ call, about a tenth of its time."""
        if not quick or ch.ring is None or ch.ring.told() > ch.heard:
            # EVENTS, not recv(NOBLOCK): raising zmq.Again on every add costs more than the add itself.
            while ch.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._handle(ch, P.decode(ch.sock.recv()))
        ch.release()

    def _wait(self, ch: WriterChannel, until: Callable[[dict[str, Any]], bool],
              timeout: float | None = None) -> dict[str, Any] | None:
        """Handle replies until ``until(msg)`` (None: until the condition is re-checked false); checks liveness."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while ch.alive:
            if self.on_wait is not None:
                self.on_wait()
            if ch.sock.poll(POLL_MS, zmq.POLLIN):
                msg = P.decode(ch.sock.recv())
                self._handle(ch, msg)
                if until(msg):
                    return msg
                continue
            why = ch.writer.dead()
            if why is not None:
                self._drain(ch)
                self._writer_lost(ch, why)
                return None
            if self._hung(ch):
                return None
            if deadline is not None and time.monotonic() > deadline:
                self._writer_lost(ch, f"did not answer within {timeout:g} s")
                return None
        return None

    def _wait_reply(self, ch: WriterChannel, kinds: set[str], timeout: float | None = None) -> dict[str, Any] | None:
        return self._wait(ch, lambda m: m["kind"] in kinds, timeout)

    # -- the API ----------------------------------------------------------------------------

    def add(self, name: str, array: Any, time: float, member: int | None = None, region: Region = None) -> None:
        """Hand ``array`` (the field ``name`` at ``time``, in ``time_units``) to its writer.

        ``member``: 1..members for an ensemble field, None otherwise. ``region``: where ``array``
        sits in the global field, one slice or integer offset per dimension (or a dict by
        dimension name); None: the whole field. Raises :class:`~enkflow.errors.InputError`
        before sending anything when the name, member, time, shape or region is wrong; raises
        :class:`OutputError` for an earlier failure of a writer (``on_writer_failure = "stop"``).
        """
        t0 = _now()
        if self._closed:
            raise OutputError("add after close")
        piece = check_piece(self.cfg, self._shapes, name, array, time, member, region)
        nbytes = piece.nbytes
        if nbytes > self._limit:
            raise InputError(f"{piece.what}: the piece takes {nbytes} bytes as sent ({piece.wire}), more than "
                             f"output.buffer_mb ({self.cfg.buffer_mb} MiB); raise buffer_mb or add it in regions",
                             item=piece.name)
        ch = self._channels[self._owner[piece.name]]
        if ch.alive:
            self._drain(ch, quick=True)
            why = ch.writer.dead()
            if why is not None:
                self._drain(ch)  # its last messages, told of or not
                self._writer_lost(ch, why)
        self._raise_failures()
        if ch.alive:
            slot = self._room(ch, nbytes)
            if not ch.alive:
                self._raise_failures()
        if not ch.alive:
            self._lost_add(ch, nbytes)
            return
        ch.put(piece, slot)
        s = self._stats
        s["adds"] += 1
        s["bytes"] += nbytes
        s["backlog_max_bytes"] = max(s["backlog_max_bytes"], ch.outstanding)
        s["backlog_max_messages"] = max(s["backlog_max_messages"], len(ch.pending))
        s["add_s"] += _now() - t0

    def _lost_add(self, ch: WriterChannel, nbytes: int) -> None:
        """An add for a writer that is gone: an error under "stop" (every time), counted under "continue"."""
        if self.cfg.on_writer_failure == "stop":
            raise OutputError(f"{ch.lost_why}: this output cannot be written (on_writer_failure = 'stop')")
        self._stats["lost_adds"] += 1
        self._stats["lost_bytes"] += nbytes

    def _room(self, ch: WriterChannel, nbytes: int) -> int | None:
        """Wait (back-pressure) until ``nbytes`` fit; the ring slot's offset with shm."""
        t0 = None
        checked = 0.0
        while True:
            if ch.outstanding + nbytes <= ch.limit:
                if ch.ring is None:
                    slot: int | None = 0
                    break
                slot = ch.ring.alloc(nbytes) if ch.ring.notice_room() else None
                if slot is not None:
                    break
            if t0 is None:
                t0 = _now()
            if not ch.pending:  # cannot happen: an empty ring fits any nbytes <= limit
                raise OutputError(f"output writer {ch.writer.index}: no room for {nbytes} bytes in an empty buffer")
            if ch.ring is None:
                self._wait(ch, lambda m: True)
            else:  # the writer frees slots without a message: look again soon
                if ch.sock.poll(1, zmq.POLLIN):
                    self._drain(ch)
                ch.release()
                if _now() - checked > POLL_MS / 1000:
                    checked = _now()
                    if self.on_wait is not None:
                        self.on_wait()
                    why = ch.writer.dead()
                    if why is not None:
                        self._writer_lost(ch, why)
                    else:
                        self._hung(ch)
            if not ch.alive:
                slot = None
                break
        if t0 is not None:
            self._stats["blocked_s"] += _now() - t0
        return slot

    def sync(self) -> None:
        """Wait until every array added so far is written (complete files renamed to their final
        names, open ones flushed, window statistics checkpointed); raise a writer's error if any."""
        if self._closed:
            raise OutputError("sync after close")
        self._roundtrip(P.SYNC, P.SYNCED)
        self._raise_failures()

    def discard(self, time: float) -> list[str]:
        """Forget what was added for ``time`` (every field): a rerun adds it again and its files
        replace those already written; the fields with pieces still open are returned (their pieces
        are dropped, no file is written for them). Earlier adds are handled first. Not for fields
        with ``windows`` (a time already counted in a window is not uncounted)."""
        if self._closed:
            raise OutputError("discard after close")
        dropped: list[str] = []
        for msg in self._roundtrip(P.DISCARD, P.DISCARDED, time=float(time)):
            if msg is not None:
                dropped += msg.get("dropped", [])
        self._raise_failures()
        return dropped

    def _roundtrip(self, kind: str, reply: str, **extra: Any) -> list[dict[str, Any] | None]:
        """``kind`` to every live writer, then each one's ``reply`` (None where it was lost meanwhile)."""
        live = [ch for ch in self._channels if ch.alive]
        for ch in live:
            ch.send(kind, **extra)
        replies = []
        for ch in live:
            if ch.alive:
                replies.append(self._wait(ch, lambda m: m["kind"] == reply))
                ch.release()
        return replies

    def close(self, finish_windows: bool = False) -> None:
        """Write everything, stop the writers (collective with ``comm``). ``finish_windows``: also write
        the window statistics still open (``window_complete = 0``) instead of checkpointing them for
        a later run. Raises when outputs were incomplete (a member or region never added) or a writer failed."""
        if self._closed:
            return
        self._closed = True
        try:
            self._roundtrip(P.BYE, P.BYE)
            if self.comm is not None:
                self.comm.barrier()
            if self.rank == 0:
                self._finish_writers(finish_windows)
            lost = self._stats["lost_adds"]
            if lost:
                log.error("OUTPUT LOST: %d add(s), %d bytes, were not written (a writer failed)", lost,
                          self._stats["lost_bytes"])
            if self.cfg.on_writer_failure == "stop":
                self._failures += [f"{ch.lost_why}: its output since the last sync is lost"
                                   for ch in self._channels if not ch.alive]
            self._raise_failures()
        finally:
            self._shutdown()

    def _finish_writers(self, finish_windows: bool) -> None:
        """Have every live writer finish (rank 0, after every rank's bye) and exit; what was incomplete
        is a failure."""
        incomplete: list[str] = []
        for ch in self._channels:
            if not ch.alive:
                continue
            ch.seq += 1
            ch.sock.send(P.encode(P.FINISH, seq=ch.seq, finish_windows=finish_windows))
            msg = self._wait_reply(ch, {P.FINISHED})
            if msg is not None:
                incomplete += msg.get("incomplete", [])
                ch.writer.wait_finished()
        if incomplete:
            self._failures.append("incomplete output, not written (a member or region was never added):\n  "
                                  + "\n  ".join(incomplete))

    def _shutdown(self) -> None:
        for ch in self._channels:
            ch.close()
        for w in self._launched:  # writers still running (an error in start-up, or an Output never closed)
            w.end(self.directory)
        for w in self._launched:
            w.release_page()
        self._launched = []
        self._ctx.term()
        if self._runtime is not None:
            shutil.rmtree(self._runtime, ignore_errors=True)

    def backlog(self) -> tuple[int, int]:
        """(pieces, bytes) added and not yet written, over all writers, as of the last add/sync."""
        return sum(len(ch.pending) for ch in self._channels), sum(ch.outstanding for ch in self._channels)

    def stats(self) -> dict[str, Any]:
        """Sender-side figures (bytes as sent: float32 for a field that travels narrowed, see
        :meth:`~enkflow.output.config.OutputConfig.narrowed`): ``adds``, ``bytes``, ``add_s`` (time
        spent in add, s), ``blocked_s`` (of it, waiting for buffer room), ``backlog_max_bytes`` /
        ``backlog_max_messages`` (most in flight at once, per writer), ``lost_adds`` / ``lost_bytes``
        (after a writer failure with ``on_writer_failure = "continue"``), ``warnings``; ``writers``:
        each writer's own figures at the last sync/close (``puts``, ``files``, ``write_s``, ``nan``
        counts per field, ``errors``)."""
        s = dict(self._stats)
        s["backlog_bytes"] = sum(ch.outstanding for ch in self._channels)
        s["writers"] = [dict(ch.writer_stats, alive=ch.alive) for ch in self._channels]
        s["nan"] = {}
        for ch in self._channels:
            for f, n in ch.writer_stats.get("nan", {}).items():
                s["nan"][f] = s["nan"].get(f, 0) + n
        return s

    def __enter__(self) -> "Output":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception as err:  # the body's exception is the one to see
            log.error("closing the output after an error: %s", err)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self._shutdown()
            except Exception:
                pass


def _check_compression(cfg: OutputConfig) -> None:
    if cfg.compression == "zstd":
        import netCDF4  # lazy: the model's process needs no netCDF library otherwise

        if not getattr(netCDF4, "__has_zstandard_support__", False):
            raise ConfigError("compression = 'zstd' needs a netCDF4 built with zstd (the PyPI wheels are); "
                              f"this one ({netCDF4.__version__}) is not: use 'zlib'", key="output.compression")


def _now() -> float:
    return time.perf_counter()
