"""The model's side of the output server: :class:`Output` (``add`` / ``sync`` / ``close``)."""

from __future__ import annotations

import json
import logging
import math
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from enkflow.config import validate
from enkflow.errors import ConfigError, EnkflowError, InputError, StorageError
from enkflow.jobs.files import log_tail
from enkflow.output import protocol as P
from enkflow.output.config import OutputConfig
from enkflow.output.connection_watch import ConnectionWatch
from enkflow.output.heartbeat import Heartbeat, Silence, process_state
from enkflow.output.ring import NOTICE_BYTES, Ring, queue_supported

log = logging.getLogger("enkflow.output")

START_TIMEOUT_S = 60.0
POLL_MS = 100


class OutputError(EnkflowError):
    """The output server failed: a writer died or could not write (the message says which and what was lost)."""


Region = Sequence[slice | int] | Mapping[str, slice | int] | None


@dataclass
class _Pending:
    seq: int
    nbytes: int
    keep: Any  # the sent copy (ipc/tcp) or None (ring slot)
    ring: bool
    what: tuple[str, float, int | None]  # field, time, member: named if the writer hangs on it


@dataclass
class _Channel:
    """One writer as this sender sees it."""

    index: int
    pid: int
    proc: subprocess.Popen | None
    log: Path | None
    sock: Any
    ring: Ring | None
    limit: int
    seq: int = 0
    pending: deque = field(default_factory=deque)
    outstanding: int = 0
    heard: int = 0  # messages received from the writer (its ring counts those it sent: Ring.told)
    alive: bool = True
    lost_why: str = ""  # how it was lost, for every later call under on_writer_failure = "stop"
    fields: list[str] = field(default_factory=list)
    writer_stats: dict[str, Any] = field(default_factory=dict)
    hb: Heartbeat | None = None  # the writer's progress page, where this sender can map it (same node)
    silence: Silence | None = None
    watch: ConnectionWatch | None = None  # the connection, where this sender cannot see the process (another node)


def _who(ch: _Channel) -> str:
    """The writer of ``ch`` as messages name it: its pid, or its address where this sender cannot see
    the process (another node)."""
    where = f"pid {ch.pid}" if ch.pid else f"at {ch.watch.address}" if ch.watch is not None else "pid unknown"
    return f"output writer {ch.index} ({where}, fields {', '.join(ch.fields)})"


def _normalize_region(region: Region, dims: list[str], shape: tuple[int, ...], arr_shape: tuple[int, ...],
                      what: str) -> tuple[tuple[int, int], ...] | None:
    """``region`` as ((start, stop), ...) in the global field, checked against the array's shape."""
    if region is None:
        if arr_shape != shape:
            raise InputError(f"{what}: the array has shape {arr_shape}, the field {shape} "
                             f"(dims {dims}); pass region= for a part", item=what)
        return None
    if isinstance(region, Mapping):
        unknown = set(region) - set(dims)
        if unknown:
            raise InputError(f"{what}: region names unknown dimension(s) {sorted(unknown)}; dims are {dims}", item=what)
        items = [region.get(d, slice(None)) for d in dims]
    else:
        items = list(region)
        if len(items) != len(dims):
            raise InputError(f"{what}: region has {len(items)} entries, the field has {len(dims)} dims {dims}", item=what)
    if len(arr_shape) != len(dims):
        raise InputError(f"{what}: the array has {len(arr_shape)} dimensions, the field {len(dims)} {dims}", item=what)
    out = []
    for d, n, m, r in zip(dims, shape, arr_shape, items):
        if isinstance(r, slice):
            if r.step not in (None, 1):
                raise InputError(f"{what}: region step {r.step} along {d}; only contiguous regions", item=what)
            start = 0 if r.start is None else int(r.start)
            stop = start + m if r.stop is None else int(r.stop)
        elif isinstance(r, (int, np.integer)):
            start, stop = int(r), int(r) + m
        else:
            raise InputError(f"{what}: region entry {r!r} along {d}: a slice or an integer offset", item=what)
        if not 0 <= start < stop <= n:
            raise InputError(f"{what}: region [{start}, {stop}) along {d} is outside [0, {n})", item=what)
        if stop - start != m:
            raise InputError(f"{what}: the array has {m} points along {d}, the region [{start}, {stop}) "
                             f"{stop - start}", item=what)
        out.append((start, stop))
    return tuple(out)


def check_piece(cfg: OutputConfig, shapes: Mapping[str, tuple[int, ...]], name: str, array: Any, time: float,
                member: int | None, region: Region) -> tuple[str, float, int | None, np.ndarray, Any, str, np.dtype]:
    """The checks of :meth:`Output.add` (also :class:`~enkflow.output.remote.RemoteOutput`'s, before
    anything is sent): ``(name, time, member, array, region as ((start, stop), ...) or None, what,
    wire dtype)``; the array is float32/float64 (other real types converted to float64); the wire dtype
    is what it travels as (:meth:`~enkflow.output.config.OutputConfig.narrowed`). Raises InputError."""
    spec = cfg.fields.get(name)
    if spec is None:
        raise InputError(f"unknown output field {name!r}; [output.fields] declares "
                         f"{', '.join(sorted(cfg.fields)) or 'none'}", item=str(name))
    what = f"output field {name}" + (f" member {member}" if member is not None else "")
    if spec.ensemble:
        if not isinstance(member, (int, np.integer)) or not 1 <= int(member) <= cfg.members:
            raise InputError(f"{what}: an ensemble field needs member = 1..{cfg.members}, got {member!r}",
                             item=name)
        member = int(member)
    elif member is not None:
        raise InputError(f"{what}: not an ensemble field (ensemble = false): member must be None", item=name)
    try:
        t = float(time)
    except (TypeError, ValueError):
        raise InputError(f"{what}: time {time!r} is not a number (in {cfg.time_units})", item=name) from None
    if not math.isfinite(t):
        raise InputError(f"{what}: time {time!r} is not finite", item=name)
    a = np.asarray(array)
    if a.dtype.kind not in "fiub" or a.dtype.kind == "b":
        raise InputError(f"{what}: dtype {a.dtype} is not a real number type", item=name)
    if a.dtype.kind != "f" or a.dtype.itemsize not in (4, 8):
        a = a.astype(np.float64)
    reg = _normalize_region(region, spec.dims, shapes[name], a.shape, what)
    wire = np.dtype(np.float32) if cfg.narrowed(name) else a.dtype
    return name, t, member, a, reg, what, wire


def wire_copy(a: np.ndarray, wire: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
    """``a`` copied as ``wire`` (C order) into ``out``, or into a new array. A value beyond float32's
    range becomes inf, as the writer's own cast to a float32 variable would make it."""
    with np.errstate(over="ignore"):
        if out is None:
            return np.array(a, dtype=wire, order="C", copy=True)
        np.copyto(out, a, casting="same_kind")
        return out


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
        if self.cfg.compression == "zstd":
            import netCDF4

            if not getattr(netCDF4, "__has_zstandard_support__", False):
                raise ConfigError("compression = 'zstd' needs a netCDF4 built with zstd (the PyPI wheels are); "
                                  f"this one ({netCDF4.__version__}) is not: use 'zlib'", key="output.compression")
        self._shapes = {f: self.cfg.shape(f) for f in self.cfg.fields}
        names = sorted(self.cfg.fields)
        n_writers = min(self.cfg.writers, max(1, len(names)))
        self._owner = {f: i % n_writers for i, f in enumerate(names)}
        self._limit = int(self.cfg.buffer_mb * (1 << 20))
        self._use_ring = self.cfg.transport == "shm" and queue_supported()
        if self.cfg.transport == "shm" and not self._use_ring:
            log.info("output: shared-memory notices need x86-64; the arrays go over ZeroMQ ipc instead")
        if self._use_ring:
            self._check_notices()
        self._notice_fixed: dict[tuple[str, str, tuple[int, ...]], str] = {}  # P.put_fixed per field, dtype, shape
        self._closed = False
        self._failures: list[str] = []
        self._stats: dict[str, Any] = {"adds": 0, "bytes": 0, "blocked_s": 0.0, "add_s": 0.0, "backlog_max_bytes": 0,
                                       "backlog_max_messages": 0, "lost_adds": 0, "lost_bytes": 0, "warnings": 0}
        self._runtime: Path | None = None
        self._ctx = zmq.Context()
        self._channels: list[_Channel] = []
        self._beats: list[Heartbeat] = []  # the pages rank 0 made (it removes them at the end)
        # Called at every turn of a wait for a writer: an owner that others watch (the output service)
        # shows it is alive meanwhile; the writer has its own watch (writer_timeout).
        self.on_wait: Callable[[], None] | None = None
        try:
            info: Any = None
            if self.rank == 0:
                try:
                    info = self._start_writers(n_writers)
                except EnkflowError as exc:
                    if comm is None:
                        raise
                    info = str(exc)  # every rank raises it, none waits for writers that never came
            if comm is not None:
                info = comm.bcast(info, root=0)
            if isinstance(info, str):
                raise OutputError(info)
            here = socket.gethostname()
            for i, (endpoint, pid, host, beat) in enumerate(info):
                if host != here and self.cfg.transport != "tcp":
                    raise OutputError(f"rank {self.rank} runs on {here}, the output writers on {host}: transport "
                                      f"{self.cfg.transport!r} serves one node; set output.transport = 'tcp' (and bind)")
                self._connect(i, endpoint, pid if host == here else 0, beat if host == here else None)
        except BaseException:
            self._kill_all()
            for hb in self._beats:
                hb.unlink()
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

    def _start_writers(self, n: int) -> list[tuple[str, int, str, str]]:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._runtime = Path(tempfile.mkdtemp(prefix="enkflow-output-"))
        procs = []
        for i in range(n):
            hb = Heartbeat.create()
            self._beats.append(hb)
            if self.cfg.transport == "tcp":
                endpoint = f"tcp://{self.cfg.bind}:*"
            else:
                endpoint = f"ipc://{self._runtime}/writer{i}.sock"
            spec = {"config": self.cfg.model_dump(mode="json"), "index": i, "directory": str(self.directory),
                    "fields": [f for f, w in self._owner.items() if w == i], "coords": self._coords,
                    "endpoint": endpoint, "heartbeat": str(hb.path)}
            logf = self._runtime / f"writer{i}.log"
            with open(logf, "wb") as err:
                proc = subprocess.Popen([sys.executable, "-m", "enkflow.output.writer"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=err)
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(spec).encode())
            proc.stdin.close()
            procs.append((proc, logf))
        self._procs = {proc.pid: (proc, logf) for proc, logf in procs}
        info = []
        # A writer stopped or stuck before it is ready must not hang the model either.
        limit = max(START_TIMEOUT_S, self.cfg.writer_timeout) if self.cfg.writer_timeout > 0 else None
        for i, (proc, logf) in enumerate(procs):
            assert proc.stdout is not None
            if not select.select([proc.stdout], [], [], limit)[0]:
                state = process_state(proc.pid)
                proc.kill()
                proc.wait()
                raise OutputError(f"output writer {i} (pid {proc.pid}) did not start within {limit:g} s"
                                  f"{f' (it was {state})' if state else ''}; it was killed:\n{log_tail(logf, 20)}")
            line = proc.stdout.readline().decode().strip()  # READY <endpoint>, or EOF when it failed
            proc.stdout.close()  # the writer prints nothing more
            if not line.startswith("READY "):
                proc.wait(timeout=START_TIMEOUT_S)
                raise OutputError(f"output writer {i} did not start (exit {proc.returncode}):\n{log_tail(logf, 20)}")
            endpoint = line.split(" ", 1)[1]
            if endpoint.startswith("tcp://0.0.0.0:"):  # bound on every interface: others reach it by name
                endpoint = endpoint.replace("0.0.0.0", socket.getfqdn(), 1)
            info.append((endpoint, proc.pid, socket.gethostname(), str(self._beats[i].path)))
        return info

    def _connect(self, i: int, endpoint: str, pid: int, beat: str | None) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        watch = ConnectionWatch(sock, endpoint, self.cfg.writer_timeout) if not pid else None
        sock.connect(endpoint)
        proc, logf = getattr(self, "_procs", {}).get(pid, (None, None))
        ring = Ring(self._limit) if self._use_ring else None
        hb = None
        if beat is not None:
            hb = self._beats[i] if i < len(self._beats) else Heartbeat(beat)
        ch = _Channel(i, pid, proc, logf, sock, ring, self._limit,
                      fields=[f for f, w in self._owner.items() if w == i], hb=hb, silence=Silence(hb, pid),
                      watch=watch)
        self._channels.append(ch)
        sock.send(P.encode(P.HELLO, ring=str(ring.path) if ring else None, client=f"{socket.gethostname()}:{os.getpid()}"))
        self._wait_reply(ch, {P.WELCOME}, START_TIMEOUT_S)
        ch.silence.seconds()  # the first look: a writer silent from now on is silent for as long as the model computes
        if ring is not None:
            ring.unlink()  # both sides have it mapped: nothing to leave behind

    # -- liveness and replies ---------------------------------------------------------------

    def _check_notices(self) -> None:
        """Every field's longest notice fits a ring slot (checked once here, not at each add)."""
        for name, shape in self._shapes.items():
            member = self.cfg.members if self.cfg.fields[name].ensemble else None
            worst = P.put_notice(self._limit, self._limit, -2.2250738585072014e-308, member,
                                 [[n, n] for n in shape], P.put_fixed(field=name, dtype="<f8", shape=list(shape)))
            if len(worst) > NOTICE_BYTES - 4:
                raise ConfigError(f"output.fields.{name}: the metadata of a piece can take {len(worst)} bytes, more "
                                  f"than a notice of the shared-memory ring holds ({NOTICE_BYTES - 4}); use a shorter "
                                  "field name, or transport = 'ipc'", key=f"output.fields.{name}")

    def _dead(self, ch: _Channel) -> str | None:
        """Why ``ch``'s writer is gone, or None while it lives."""
        if ch.proc is not None:
            rc = ch.proc.poll()
            if rc is None:
                return None
            return f"killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
        if ch.pid:
            try:
                os.kill(ch.pid, 0)
            except ProcessLookupError:
                return "gone"
            except PermissionError:
                pass
        return ch.watch.lost() if ch.watch is not None else None

    def _hung(self, ch: _Channel) -> bool:
        """Whether ``ch``'s writer has made no progress for ``writer_timeout`` s; if so it is killed
        and counts as failed (``on_writer_failure`` applies)."""
        limit = self.cfg.writer_timeout
        if limit <= 0 or ch.silence is None or not ch.silence.observable():
            return False
        silent = ch.silence.seconds()
        if silent <= limit:
            return False
        self._release(ch)  # what it did finish is not lost
        doing = ch.hb.activity() if ch.hb is not None else ""
        if ch.pending:
            f, t, m = ch.pending[0].what
            doing += (f"{'; ' if doing else ''}the oldest piece not written: field {f} time {t:g}"
                      + (f" member {m}" if m is not None else ""))
        state = process_state(ch.pid) if ch.pid else ""
        killed = self._kill_writer(ch)
        self._writer_lost(ch, f"made no progress for {silent:.1f} s (output.writer_timeout = {limit:g} s)"
                              f"{f' (last activity: {doing})' if doing else ''}{f'; the process was {state}' if state else ''}; "
                              f"{killed}")
        return True

    def _kill_writer(self, ch: _Channel) -> str:
        """SIGKILL a hung writer before its temporary files are removed, so that it can never rename
        one of them later (SIGKILL also ends a stopped process)."""
        try:
            if ch.proc is not None:
                ch.proc.kill()
                try:
                    ch.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    return "it was sent SIGKILL and has not ended yet (stuck in the kernel?)"
            elif ch.pid:
                os.kill(ch.pid, signal.SIGKILL)
        except ProcessLookupError:
            return "it has ended"
        except PermissionError:
            return "it could not be killed from here"
        return "it was killed"

    def _writer_lost(self, ch: _Channel, why: str) -> None:
        ch.alive = False
        ch.lost_why = f"{_who(ch)} {why}"
        lost = len(ch.pending)
        lost_bytes = ch.outstanding
        self._stats["lost_adds"] += lost
        self._stats["lost_bytes"] += lost_bytes
        ch.pending.clear()
        ch.outstanding = 0
        removed = self._remove_temporaries(ch.pid)
        tail = f"\n{log_tail(ch.log, 10)}" if ch.log is not None and ch.log.exists() and ch.log.stat().st_size else ""
        msg = (f"{_who(ch)} {why}: {lost} piece(s) "
               f"({lost_bytes} bytes) in flight were not written, nor the files it had open"
               f"{f' ({removed} temporary file(s) removed)' if removed else ''}; "
               f"later output of these fields is lost" + tail)
        self._fail(msg, fatal=True)

    def _remove_temporaries(self, pid: int) -> int:
        """The temporary files a killed writer left (atomic_output's ``.NAME.PID.tmp``): never under a final name."""
        if not pid or self.rank != 0 or not self.directory.is_dir():
            return 0
        n = 0
        for p in self.directory.rglob(f".*.{pid}.tmp"):
            p.unlink(missing_ok=True)
            n += 1
        return n

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

    def _handle(self, ch: _Channel, msg: dict[str, Any]) -> None:
        ch.heard += 1
        kind = msg["kind"]
        if ch.ring is None and kind in (P.ACK, P.ERROR) and ch.pending and ch.pending[0].seq == msg.get("seq"):
            ch.outstanding -= ch.pending.popleft().nbytes
        if msg.get("warning"):
            self._stats["warnings"] += 1
            warnings.warn(f"enkflow.output: {msg['warning']}", RuntimeWarning, stacklevel=4)
        if msg.get("error"):
            self._fail(f"output writer {ch.index}: {msg['error']}", bool(msg.get("fatal")))
        if "stats" in msg:
            ch.writer_stats = msg["stats"]

    def _drain(self, ch: _Channel, quick: bool = False) -> None:
        """Handle the writer's messages that have arrived; free the ring slots it has finished with.
        ``quick`` (an add): with a ring, look at the socket only when the writer has told of a message
        not yet received; otherwise every add would pay for a ZeroMQ call, about a tenth of its time."""
        if not quick or ch.ring is None or ch.ring.told() > ch.heard:
            # EVENTS, not recv(NOBLOCK): raising zmq.Again on every add costs more than the add itself.
            while ch.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._handle(ch, P.decode(ch.sock.recv()))
        self._release(ch)

    def _release(self, ch: _Channel) -> None:
        """Free the ring slots of the pieces the writer has finished with (read from the ring, no call)."""
        if ch.ring is None or not ch.pending:
            return
        done = ch.ring.consumed()
        while ch.pending and ch.pending[0].seq <= done:
            ch.outstanding -= ch.pending.popleft().nbytes
            ch.ring.free_oldest()

    def _wait(self, ch: _Channel, until: Any, timeout: float | None = None) -> dict[str, Any] | None:
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
            why = self._dead(ch)
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

    def _wait_reply(self, ch: _Channel, kinds: set[str], timeout: float | None = None) -> dict[str, Any] | None:
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
        name, t, member, a, reg, what, wire = check_piece(self.cfg, self._shapes, name, array, time, member, region)
        nbytes = a.size * wire.itemsize
        if nbytes > self._limit:
            raise InputError(f"{what}: the piece takes {nbytes} bytes as sent ({wire}), more than output.buffer_mb "
                             f"({self.cfg.buffer_mb} MiB); raise buffer_mb or add it in regions", item=name)
        ch = self._channels[self._owner[name]]
        if ch.alive:
            self._drain(ch, quick=True)
            why = self._dead(ch)
            if why is not None:
                self._drain(ch)  # its last messages, told of or not
                self._writer_lost(ch, why)
        self._raise_failures()
        if not ch.alive:
            self._lost_add(ch, nbytes)
            return
        region = [list(r) for r in reg] if reg is not None else None
        slot = self._room(ch, nbytes)
        if not ch.alive:
            self._raise_failures()
            self._lost_add(ch, nbytes)
            return
        if ch.ring is not None:
            assert slot is not None
            wire_copy(a, wire, ch.ring.buf[slot : slot + nbytes].view(wire).reshape(a.shape))
            key = (name, wire.str, a.shape)
            fixed = self._notice_fixed.get(key)
            if fixed is None:
                fixed = self._notice_fixed[key] = P.put_fixed(field=name, dtype=wire.str, shape=list(a.shape))
            seq = ch.ring.publish(P.put_notice(slot, nbytes, t, member, region, fixed))
            keep = None
        else:
            ch.seq += 1
            seq = ch.seq
            keep = wire_copy(a, wire)
            meta = P.encode(P.PUT, seq=seq, field=name, time=t, member=member, region=region, dtype=wire.str,
                            shape=list(a.shape))
            ch.sock.send_multipart([meta, memoryview(keep.reshape(-1).view(np.uint8))], copy=False)
        ch.pending.append(_Pending(seq, nbytes, keep, ch.ring is not None, (name, t, member)))
        ch.outstanding += nbytes
        s = self._stats
        s["adds"] += 1
        s["bytes"] += nbytes
        s["backlog_max_bytes"] = max(s["backlog_max_bytes"], ch.outstanding)
        s["backlog_max_messages"] = max(s["backlog_max_messages"], len(ch.pending))
        s["add_s"] += _now() - t0

    def _lost_add(self, ch: _Channel, nbytes: int) -> None:
        """An add for a writer that is gone: an error under "stop" (every time), counted under "continue"."""
        if self.cfg.on_writer_failure == "stop":
            raise OutputError(f"{ch.lost_why}: this output cannot be written (on_writer_failure = 'stop')")
        self._stats["lost_adds"] += 1
        self._stats["lost_bytes"] += nbytes

    def _room(self, ch: _Channel, nbytes: int) -> int | None:
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
                raise OutputError(f"output writer {ch.index}: no room for {nbytes} bytes in an empty buffer")
            if ch.ring is None:
                self._wait(ch, lambda m: True)
            else:  # the writer frees slots without a message: look again soon
                if ch.sock.poll(1, zmq.POLLIN):
                    self._drain(ch)
                self._release(ch)
                if _now() - checked > POLL_MS / 1000:
                    checked = _now()
                    if self.on_wait is not None:
                        self.on_wait()
                    why = self._dead(ch)
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
        for ch in self._channels:
            if not ch.alive:
                continue
            ch.seq += 1
            upto = ch.ring.published if ch.ring is not None else 0
            ch.sock.send(P.encode(P.DISCARD, seq=ch.seq, upto=upto, time=float(time)))
        for ch in self._channels:
            if ch.alive:
                msg = self._wait(ch, lambda m: m["kind"] == P.DISCARDED)
                self._release(ch)
                if msg is not None:
                    dropped += msg.get("dropped", [])
        self._raise_failures()
        return dropped

    def _roundtrip(self, kind: str, reply: str, **extra: Any) -> None:
        for ch in self._channels:
            if not ch.alive:
                continue
            ch.seq += 1
            upto = ch.ring.published if ch.ring is not None else 0
            ch.sock.send(P.encode(kind, seq=ch.seq, upto=upto, **extra))
        for ch in self._channels:
            if ch.alive:
                self._wait(ch, lambda m: m["kind"] == reply)
                self._release(ch)

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
                incomplete: list[str] = []
                for ch in self._channels:
                    if not ch.alive:
                        continue
                    ch.seq += 1
                    ch.sock.send(P.encode(P.FINISH, seq=ch.seq, finish_windows=finish_windows))
                    msg = self._wait_reply(ch, {P.FINISHED})
                    if msg is not None:
                        incomplete += msg.get("incomplete", [])
                        if ch.proc is not None:
                            try:
                                ch.proc.wait(timeout=30)
                            except subprocess.TimeoutExpired:
                                ch.proc.kill()
                if incomplete:
                    self._failures.append("incomplete output, not written (a member or region was never added):\n  "
                                          + "\n  ".join(incomplete))
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

    def _shutdown(self) -> None:
        for ch in self._channels:
            if ch.watch is not None:
                ch.watch.close()
            ch.sock.close(linger=0)
            if ch.ring is not None:
                ch.ring.close()
            if ch.hb is not None and ch.hb not in self._beats:
                ch.hb.close()
        self._kill_all()
        for hb in self._beats:
            hb.unlink()
            hb.close()
        self._beats = []
        self._ctx.term()
        if self._runtime is not None:
            shutil.rmtree(self._runtime, ignore_errors=True)

    def _kill_all(self) -> None:
        """Stop writers still running (an error in start-up, or an Output never closed): their
        temporary files go with them."""
        for proc, _ in getattr(self, "_procs", {}).values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                self._remove_temporaries(proc.pid)

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


def _now() -> float:
    return time.perf_counter()
