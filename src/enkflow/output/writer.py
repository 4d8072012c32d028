"""One writer process (``python -m enkflow.output.writer``), started by :class:`~enkflow.output.Output`.

It reads its settings as one JSON object on stdin (the validated ``[output]`` table, its
index, the fields it owns, the coordinates, the endpoint to bind), prints ``READY <endpoint>``
and serves the messages of :mod:`enkflow.output.protocol` until ``finish``. The pieces are read
straight from the sender's ring (no copy) and written into their files (:mod:`enkflow.output.time_files`).
It exits when its parent dies.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from enkflow.errors import BindError
from enkflow.output import protocol as P
from enkflow.output.config import OutputConfig
from enkflow.output.heartbeat import Heartbeat
from enkflow.output.ring import RingView
from enkflow.output.time_files import PieceError, Stats, TimeFiles


class Writer:
    """The writer process of ``spec`` (its settings): the senders' rings, the loop, its progress page."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.cfg = OutputConfig.model_validate(spec["config"])
        self.index = int(spec["index"])
        self.stats = Stats()
        coords = {k: np.asarray(v, dtype=np.float64) for k, v in spec.get("coords", {}).items()}
        self.files = TimeFiles(self.cfg, self.index, Path(spec["directory"]), list(spec["fields"]), coords, self.stats,
                               self.beat)
        self.rings: dict[bytes, RingView | None] = {}
        self.parent = os.getppid()
        self.hb = Heartbeat(spec["heartbeat"]) if spec.get("heartbeat") else None

    def beat(self, doing: str | None = None) -> None:
        """Progress, for the senders' hang detection (:mod:`enkflow.output.heartbeat`)."""
        if self.hb is not None:
            if doing is not None:
                self.hb.doing(doing)
            self.hb.beat(self.stats.puts)

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
            warning = self.files.put(msg, data)
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

    def serve(self, endpoint: str, curve_secret_key: str | None) -> None:
        """Serve the senders at ``endpoint``; with ``curve_secret_key`` (Z85, TCP) as a CURVE server,
        which only senders told its public key reach. Raises BindError naming the address."""
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 2000)
        if curve_secret_key:
            sock.curve_server = True
            sock.curve_secretkey = curve_secret_key.encode()
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            ctx.term()
            raise BindError.from_errno(exc.errno, exc.strerror, address=endpoint,
                                       key=f"output.bind (the writers' interface; {self.cfg.directory})") from None
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
                        self.files.finish(False)  # the model is gone: no temporary file is left behind
                        if self.hb is not None:
                            self.hb.unlink()
                        return
                continue
            idle_ms = 0
            if not self._message(sock, sock.recv_multipart(copy=False)):
                sock.close()
                ctx.term()
                return
            self.beat("waiting for work")

    def _message(self, sock: Any, frames: list[Any]) -> bool:
        """Answer one message; False after ``finish`` (answered: the writer ends)."""
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
            reply = self._sync_reply(sock, ident, msg)
        elif kind == P.DISCARD:
            self._serve_ring(sock, ident, int(msg.get("upto", 0)))
            reply = {"kind": P.DISCARDED, "seq": seq, "dropped": self.files.discard(float(msg["time"]))}
        elif kind == P.FINISH:
            self._send(sock, ident, self._finish_reply(msg))
            return False
        else:
            reply = {"kind": P.ERROR, "seq": seq, "error": f"unknown message kind {kind!r}", "fatal": True}
        self._send(sock, ident, reply)
        return True

    def _sync_reply(self, sock: Any, ident: bytes, msg: dict[str, Any]) -> dict[str, Any]:
        """A sync or a bye: the sender's pieces published before it written, everything on disk."""
        kind = msg["kind"]
        self.beat(f"serving a {kind}")
        self._serve_ring(sock, ident, int(msg.get("upto", 0)))
        reply: dict[str, Any] = {"kind": P.SYNCED if kind == P.SYNC else P.BYE, "seq": msg.get("seq", 0)}
        try:
            self.files.flush()
            self.files.checkpoint()
        except PieceError as exc:
            reply.update(error=str(exc), fatal=True)
        except Exception as exc:
            reply.update(error=f"writer {self.index}: cannot flush: {exc}", fatal=True)
        if kind == P.BYE:
            self.rings.pop(ident, None)
        reply["stats"] = self.stats.to_json()
        return reply

    def _finish_reply(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.beat("finishing (incomplete times, windows, checkpoints)")
        reply: dict[str, Any] = {"kind": P.FINISHED, "seq": msg.get("seq", 0)}
        try:
            reply["incomplete"] = self.files.finish(bool(msg.get("finish_windows")))
        except PieceError as exc:
            reply.update(error=str(exc), fatal=True, incomplete=[])
        reply["stats"] = self.stats.to_json()
        return reply


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
    try:
        writer.serve(spec["endpoint"], spec.get("curve_secret_key"))
    except BindError as exc:
        print(f"enkflow.output writer {spec.get('index')}: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
