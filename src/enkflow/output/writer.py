"""One writer process (``python -m enkflow.output.writer``), started by :class:`~enkflow.output.Output`.

It reads its settings as one JSON object on stdin (the validated ``[output]`` table, its
index, the fields it owns, the coordinates, the endpoint to bind), prints ``READY <endpoint>``
and serves the messages of :mod:`enkflow.output.protocol` until ``finish``. Each (field, time)
file is open under a temporary name while its pieces arrive, written piece by piece straight
from the sender's ring (no copy), reduced inline (ensemble mean/spread, windows, user
reductions) and renamed once every member and region is in. It exits when its parent dies.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
import traceback
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import zmq

from enkflow.fsutil import atomic_output
from enkflow.output import protocol as P
from enkflow.output.config import OutputConfig
from enkflow.output.diagnostics import EnsembleAccumulator, WindowSet, remove_checkpoint
from enkflow.output.heartbeat import Heartbeat
from enkflow.output.netcdf import TimeFile, write_window
from enkflow.output.ring import RingView


class PieceError(Exception):
    """A piece the writer refuses (the sender's data is at fault); ``fatal`` errors are the writer's own (I/O)."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


def load_reduction(target: str) -> Callable[[np.ndarray], Any]:
    module, _, name = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"output.reductions: cannot load {target!r}: {exc}") from None
    if not callable(fn):
        raise ValueError(f"output.reductions: {target!r} is not callable")
    return fn


def checkpoint_path(directory: Path, name: str) -> Path:
    return directory / ".checkpoint" / f"{name}.h5"


def _space_note(path: Path) -> str:
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    if free == 0:
        return " (no space left on its file system)"
    return f" (only {free} bytes free on its file system: full?)" if free < 1 << 20 else ""


@dataclass
class OpenTime:
    """A (field, time) whose file is being written."""

    path: Path
    cm: AbstractContextManager[Path]
    file: TimeFile
    covered: np.ndarray  # uint8 (members or 1, *shape): which values arrived
    remaining: int
    acc: EnsembleAccumulator | None
    t: float
    tmp: Path


@dataclass
class Stats:
    puts: int = 0
    bytes: int = 0
    files: int = 0
    window_files: int = 0
    write_s: float = 0.0
    nan: dict[str, int] = field(default_factory=dict)
    errors: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"puts": self.puts, "bytes": self.bytes, "files": self.files, "window_files": self.window_files,
                "write_s": self.write_s, "cpu_s": time.process_time(), "nan": dict(self.nan), "errors": self.errors}


class Writer:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.cfg = OutputConfig.model_validate(spec["config"])
        self.index = int(spec["index"])
        self.directory = Path(spec["directory"])
        self.fields = list(spec["fields"])
        self.coords = {k: np.asarray(v, dtype=np.float64) for k, v in spec.get("coords", {}).items()}
        self.reductions = {k: load_reduction(v) for k, v in self.cfg.reductions.items()}
        lengths = {w.name: w.length for w in self.cfg.windows}
        self.windows = {f: WindowSet(lengths) for f in self.fields}
        if lengths:
            for f in self.fields:
                cp = checkpoint_path(self.directory, f)
                if cp.exists():
                    self.windows[f].load(cp, f, self.cfg.shape(f))
        self.open: dict[tuple[str, float], OpenTime] = {}
        self.done: dict[tuple[str, float], str] = {}  # written or failed, with the reason
        self.latest: dict[str, float] = {}
        self.paths: dict[Path, float] = {}  # file -> its time: two times must not share a file
        self.rings: dict[bytes, RingView | None] = {}
        self.stats = Stats()
        self.parent = os.getppid()
        self.hb = Heartbeat(spec["heartbeat"]) if spec.get("heartbeat") else None

    def beat(self, doing: str | None = None) -> None:
        """Progress, for the senders' hang detection (:mod:`enkflow.output.heartbeat`)."""
        if self.hb is not None:
            if doing is not None:
                self.hb.doing(doing)
            self.hb.beat(self.stats.puts)

    # -- pieces -------------------------------------------------------------------------

    def _file_path(self, name: str, t: float) -> Path:
        return self.directory / self.cfg.file.format(field=name, time=t)

    def _start(self, name: str, t: float) -> OpenTime:
        path = self._file_path(name, t)
        other = self.paths.setdefault(path, t)
        if other != t:
            raise PieceError(f"field {name}: times {other!r} and {t!r} give the same file name {path.name} "
                             f"(output.file = {self.cfg.file!r}); write the time with more digits, e.g. {{time:.6f}}")
        path.parent.mkdir(parents=True, exist_ok=True)
        cm = atomic_output(path)
        tmp = cm.__enter__()
        try:
            tf = TimeFile(tmp, self.cfg, name, t, self.coords)
        except BaseException as exc:
            cm.__exit__(type(exc), exc, exc.__traceback__)
            raise PieceError(f"cannot create {path}: {exc}{_space_note(path)}", fatal=True) from None
        spec = self.cfg.fields[name]
        shape = self.cfg.shape(name)
        nmem = self.cfg.members if spec.ensemble else 1
        return OpenTime(path, cm, tf, np.zeros((nmem,) + shape, dtype=np.uint8), nmem * math.prod(shape),
                        EnsembleAccumulator(shape) if self.cfg.reduced(name) else None, t, tmp)

    def _abandon(self, key: tuple[str, float], reason: str) -> None:
        ot = self.open.pop(key, None)
        self.done[key] = reason
        if ot is None:
            return
        try:
            ot.file.close()
        except Exception:
            pass
        exc = RuntimeError(reason)
        ot.cm.__exit__(RuntimeError, exc, None)  # removes the temporary file

    def put(self, msg: dict[str, Any], data: np.ndarray) -> str | None:
        """Write one piece; returns a warning or None; raises PieceError."""
        name, t, member = msg["field"], float(msg["time"]), msg["member"]
        if name not in self.fields:
            raise PieceError(f"writer {self.index} does not own field {name!r}")
        key = (name, t)
        what = f"field {name} time {t:g}" + (f" member {member}" if member is not None else "")
        if key in self.done:
            if self.done[key] != "written":
                return None  # the piece of a time that failed earlier: that failure was reported once
            raise PieceError(f"{what}: this time is written already; a piece added twice?")
        shape = self.cfg.shape(name)
        region = tuple(slice(a, b) for a, b in msg["region"]) if msg["region"] is not None else tuple(slice(0, n) for n in shape)
        warning = None
        # One pass without a temporary: a sum is finite unless a NaN (or an Inf) is there; only then count.
        nan = 0 if np.isfinite(np.add.reduce(data, axis=None)) else int(np.count_nonzero(np.isnan(data)))
        if nan:
            self.stats.nan[name] = self.stats.nan.get(name, 0) + nan
            text = f"{what}: {nan} NaN value(s)"
            if self.cfg.nan == "error":
                self._abandon(key, "NaN in a piece")
                raise PieceError(f"{text} (output.nan = 'error'): the file of this time is not written")
            if self.cfg.nan == "warn":
                warning = f"{text}, written as NaN (output.nan = 'warn')"
        ot = self.open.get(key)
        if ot is None:
            try:
                ot = self.open[key] = self._start(name, t)
            except PieceError:
                self.done[key] = "its file could not be created"
                raise
        mi = member - 1 if member is not None else 0
        cov = ot.covered[(mi,) + region]
        if cov.any():
            self._abandon(key, "a region added twice")
            raise PieceError(f"{what}: region {[[s.start, s.stop] for s in region]} overlaps values added before; "
                             "the file of this time is not written")
        try:
            outside = ot.file.write(data, member, region)
        except Exception as exc:
            self._abandon(key, f"write failed: {exc}")
            raise PieceError(f"cannot write {ot.path}: {exc}{_space_note(ot.path)}", fatal=True) from None
        if outside:
            self._abandon(key, "values outside pack_range")
            lo, hi = self.cfg.fields[name].pack_range  # type: ignore[misc]
            raise PieceError(f"{what}: {outside} value(s) outside pack_range [{lo}, {hi}] (16-bit packing); "
                             "the file of this time is not written")
        if ot.acc is not None:
            ot.acc.add(data, region)
        cov[...] = 1
        ot.remaining -= data.size
        if ot.remaining == 0:
            self._complete(key, ot)
        return warning

    def _complete(self, key: tuple[str, float], ot: OpenTime) -> None:
        name, t = key
        spec = self.cfg.fields[name]
        self.beat(f"completing field {name} time {t:g} (diagnostics, user reductions, fsync and rename of {ot.path.name})")
        mean = spread = None
        if ot.acc is not None:
            mean, spread = ot.acc.result()
        try:
            reds = {r: fn(mean) for r, fn in self.reductions.items()}
        except Exception as exc:
            self._abandon(key, "a user reduction failed")
            raise PieceError(f"field {name} time {t:g}: user reduction failed: {exc!r}") from None
        try:
            show = spec.ensemble and self.cfg.diagnostics
            ot.file.diagnostics(mean if show else None, spread if show else None, reds)
            ot.file.close()
        except Exception as exc:
            self._abandon(key, f"write failed: {exc}")
            raise PieceError(f"cannot write {ot.path}: {exc}{_space_note(ot.path)}", fatal=True) from None
        if mean is not None and self.cfg.windows:
            # Counted and checkpointed before the file is renamed: after a crash in between, a restarted
            # run that adds this time again finds it counted (not twice) and writes its file.
            self.windows[name].add(mean, t)
            self._checkpoint_field(name)
        try:
            ot.cm.__exit__(None, None, None)
        except OSError as exc:
            self.open.pop(key, None)
            self.done[key] = "rename failed"
            raise PieceError(f"cannot finish {ot.path}: {exc}{_space_note(ot.path)}", fatal=True) from None
        self.open.pop(key)
        self.done[key] = "written"
        self.stats.files += 1
        if mean is not None and self.cfg.windows:
            self.latest[name] = max(self.latest.get(name, t), t)
            busy = [bt for (f, bt) in self.open if f == name]
            done = self.windows[name].pop_done(self.latest[name], busy)
            for wname, length, w in done:
                self._write_window(name, wname, length, w, complete=True)
            if done:
                self._checkpoint_field(name)

    def _write_window(self, name: str, wname: str, length: float, w: Any, complete: bool) -> None:
        start = w.index * length
        path = self._file_path(f"{name}_{wname}", start)
        self.beat(f"writing the {wname} window of field {name} from time {start:g}")
        try:
            with atomic_output(path) as tmp:
                write_window(tmp, self.cfg, name, wname, start, length, w.times, w.mean, w.minimum, w.maximum,
                             self.coords, complete)
        except Exception as exc:
            raise PieceError(f"cannot write {path}: {exc}{_space_note(path)}", fatal=True) from None
        self.stats.window_files += 1

    def checkpoint(self) -> None:
        if self.cfg.windows:
            for f in self.windows:
                self._checkpoint_field(f)

    def _checkpoint_field(self, f: str) -> None:
        self.beat(f"checkpointing the windows of field {f}")
        ws = self.windows[f]
        cp = checkpoint_path(self.directory, f)
        if ws.empty():
            remove_checkpoint(cp)
            return
        cp.parent.mkdir(parents=True, exist_ok=True)
        try:
            ws.save(cp, f, self.cfg.shape(f))
        except OSError as exc:
            raise PieceError(f"cannot write the checkpoint {cp}: {exc}{_space_note(cp)}", fatal=True) from None

    def flush(self) -> None:
        """Everything of the open files on disk (under their temporary names)."""
        for ot in self.open.values():
            self.beat(f"flushing {ot.tmp.name} (sync)")
            ot.file.ds.sync()
            fd = os.open(ot.tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def discard(self, t: float) -> list[str]:
        """Forget time ``t`` of this writer's fields: a rerun adds it again (its file replaces the old
        one). The pieces of a time still open are dropped (its temporary file removed). Window
        statistics already counted are not uncounted: for fields without windows (the analysis's)."""
        dropped = []
        for key in [k for k in self.open if k[1] == t]:
            self._abandon(key, "discarded (a rerun adds it again)")
            dropped.append(key[0])
        for key in [k for k in self.done if k[1] == t]:
            del self.done[key]
        return dropped

    def finish(self, finish_windows: bool) -> list[str]:
        incomplete = []
        for (name, t), ot in list(self.open.items()):
            nmem = ot.covered.shape[0]
            missing = [m + 1 for m in range(nmem) if not ot.covered[m].all()]
            who = f"member(s) {missing}" if self.cfg.fields[name].ensemble else "part of the field"
            incomplete.append(f"{ot.path.name} (field {name}, time {t:g}): {who} missing")
            self._abandon((name, t), "incomplete at finish")
        if finish_windows:
            for name, ws in self.windows.items():
                for wname, length, w in ws.pop_all():
                    self._write_window(name, wname, length, w, complete=False)
        self.checkpoint()
        return incomplete

    # -- the loop -------------------------------------------------------------------------

    def _put_reply(self, msg: dict[str, Any], raw: np.ndarray) -> dict[str, Any]:
        """Write one piece; the reply: ack (with a warning) or error."""
        seq = msg.get("seq", 0)
        t0 = time.perf_counter()
        member = msg.get("member")
        self.beat(f"writing field {msg.get('field')} time {msg.get('time')}"
                  + (f" member {member}" if member is not None else ""))
        try:
            data = raw.view(np.dtype(msg["dtype"])).reshape(msg["shape"])
            warning = self.put(msg, data)
            reply: dict[str, Any] = {"kind": P.ACK, "seq": seq}
            if warning:
                reply["warning"] = warning
        except PieceError as exc:
            self.stats.errors += 1
            reply = {"kind": P.ERROR, "seq": seq, "error": str(exc), "fatal": exc.fatal}
        except Exception as exc:  # a bug: report it with its traceback, keep serving
            self.stats.errors += 1
            reply = {"kind": P.ERROR, "seq": seq, "fatal": True,
                     "error": f"writer {self.index} failed on field {msg.get('field')}: "
                              f"{''.join(traceback.format_exception(exc))}"}
        self.stats.puts += 1
        self.stats.bytes += raw.nbytes
        self.stats.write_s += time.perf_counter() - t0
        self.beat("waiting for work")
        return reply

    def _send(self, sock: Any, ident: bytes, reply: dict[str, Any]) -> None:
        sock.send_multipart([ident, P.encode(**reply)])
        ring = self.rings.get(ident)
        if ring is not None:
            ring.tell()  # after the send: a sender that sees the count finds the message, or soon will

    def _serve_ring(self, sock: Any, ident: bytes, upto: int | None = None) -> int:
        """Write the pieces noticed in ``ident``'s ring (all, or at least up to notice ``upto``);
        only errors and warnings are answered. Returns the count written."""
        ring = self.rings.get(ident)
        if ring is None:
            return 0
        n = 0
        while True:
            item = ring.next()
            if item is None:
                if upto is None or ring.read >= upto:
                    return n
                self.beat()
                time.sleep(0.0005)  # published before the sync was sent: visible in a moment
                continue
            number, notice = item
            msg = P.decode(notice)
            reply = self._put_reply(msg, ring.view(*msg["slot"]))
            ring.consume(number)
            n += 1
            if reply["kind"] == P.ERROR or reply.get("warning"):
                self._send(sock, ident, reply)

    def serve(self, endpoint: str) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.bind(endpoint)
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        print(f"READY {endpoint}", flush=True)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        last_check = time.monotonic()
        idle_ms = 1
        while True:
            self.beat()  # at least once a second while idle (the poll below), after every piece while busy
            worked = sum(self._serve_ring(sock, ident) for ident in list(self.rings))
            # Senders with a ring do not wake the writer: it looks again after a short sleep,
            # longer while nothing comes (up to 20 ms, well within any buffer's worth of steps).
            idle_ms = 0 if worked else min(max(1, 2 * idle_ms), 20)
            rings = any(r is not None for r in self.rings.values())
            if not poller.poll(idle_ms if rings else 1000):
                if time.monotonic() - last_check > 1.0:
                    last_check = time.monotonic()
                    if os.getppid() != self.parent:
                        self.finish(False)  # the model is gone: no temporary file is left behind
                        if self.hb is not None:
                            self.hb.unlink()
                        return
                continue
            idle_ms = 0
            frames = sock.recv_multipart(copy=False)
            ident, meta = frames[0].bytes, frames[1].bytes
            msg = P.decode(meta)
            kind, seq = msg["kind"], msg.get("seq", 0)
            reply: dict[str, Any]
            if kind == P.HELLO:
                self.rings[ident] = RingView(msg["ring"]) if msg.get("ring") else None
                reply = {"kind": P.WELCOME}
            elif kind == P.PUT:
                reply = self._put_reply(msg, np.frombuffer(frames[2].buffer, dtype=np.uint8))
            elif kind in (P.SYNC, P.BYE):
                self.beat(f"serving a {kind}")
                self._serve_ring(sock, ident, int(msg.get("upto", 0)))
                reply = {"kind": P.SYNCED if kind == P.SYNC else P.BYE, "seq": seq}
                try:
                    self.flush()
                    self.checkpoint()
                except PieceError as exc:
                    reply.update(error=str(exc), fatal=True)
                except Exception as exc:
                    reply.update(error=f"writer {self.index}: cannot flush: {exc}", fatal=True)
                if kind == P.BYE:
                    self.rings.pop(ident, None)
                reply["stats"] = self.stats.to_json()
            elif kind == P.DISCARD:
                self._serve_ring(sock, ident, int(msg.get("upto", 0)))
                reply = {"kind": P.DISCARDED, "seq": seq, "dropped": self.discard(float(msg["time"]))}
            elif kind == P.FINISH:
                self.beat("finishing (incomplete times, windows, checkpoints)")
                reply = {"kind": P.FINISHED, "seq": seq}
                try:
                    reply["incomplete"] = self.finish(bool(msg.get("finish_windows")))
                except PieceError as exc:
                    reply.update(error=str(exc), fatal=True, incomplete=[])
                reply["stats"] = self.stats.to_json()
                self._send(sock, ident, reply)
                sock.close()
                ctx.term()
                return
            else:
                reply = {"kind": P.ERROR, "seq": seq, "error": f"unknown message kind {kind!r}", "fatal": True}
            self._send(sock, ident, reply)
            self.beat("waiting for work")


def lower_priority(cfg: dict[str, Any]) -> None:
    """The writer is an I/O server off the model's critical path: where CPUs are short, the model
    should get them first (``writer_nice``, added to the niceness inherited from the model), and
    the writer may be kept off the model's cores (``writer_cpus``)."""
    nice = int(cfg.get("writer_nice", 0))
    if nice:
        os.nice(nice)
    cpus = cfg.get("writer_cpus") or []
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except (OSError, ValueError) as exc:
            raise ValueError(f"output.writer_cpus = {cpus}: cannot pin the writer there: {exc}") from None


def main() -> int:
    spec = json.loads(sys.stdin.read())
    try:
        lower_priority(spec["config"])
        writer = Writer(spec)
    except Exception as exc:
        print(f"enkflow.output writer {spec.get('index')}: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    writer.serve(spec["endpoint"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
