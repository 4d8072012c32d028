"""The client of the study-wide output service (:mod:`enkflow.output.service`): :class:`RemoteOutput`,
the :class:`~enkflow.output.Output` API for a process that does not own the writers."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from enkflow.errors import InputError
from enkflow.output import protocol as P
from enkflow.output.config import OutputConfig
from enkflow.output.connection_watch import ConnectionWatch
from enkflow.output.heartbeat import Heartbeat, Silence, process_state
from enkflow.output.piece import Region, check_piece, wire_copy
from enkflow.output.service import hang_limit, hang_message
from enkflow.output.service_protocol import ADD, HWM, TIMEOUT_KEY, token_credential
from enkflow.output.writer_process import OutputError

POLL_MS = 100


class ServiceLost(OutputError):
    """The output service is gone (killed, crashed) or hung (stopped, stuck): what was not synced may be lost."""


class RemoteOutput:
    """``add`` / ``sync`` / ``close`` / ``stats`` of :class:`~enkflow.output.Output`, through a running
    output service at ``address`` (``ipc://...`` or ``tcp://host:port``, as in its address file).

    ``token``: the service's token (or ``token_file``, the file holding it). On connect the
    service sends the ``[output]`` configuration, so :meth:`add` checks name, member, time, shape
    and region here, before anything is sent (:class:`~enkflow.errors.InputError`). ``add``
    copies the array and returns once ZeroMQ has queued it; when the service is behind (its
    writers' ``buffer_mb`` full and ``HWM`` messages queued) it waits (``blocked_s`` in
    :meth:`stats`). A failure caused by this client's adds is raised by its next ``sync`` /
    ``discard`` / ``close``. ``timeout``: seconds to wait for the service's welcome. On the
    service's node every wait also watches its progress page: a service without progress for
    :func:`~enkflow.output.service.hang_limit` seconds raises :class:`ServiceLost`. Everywhere a
    closed connection raises it, and over tcp one whose pings went unanswered for
    ``heartbeat_timeout`` seconds (:mod:`enkflow.output.connection_watch`): a client on another
    node cannot see the service's process."""

    def __init__(self, address: str, token: str | None = None, *, token_file: str | os.PathLike[str] | None = None,
                 timeout: float = 30.0, heartbeat_timeout: float = 60.0) -> None:
        if token is None:
            if token_file is None:
                raise InputError("RemoteOutput needs the service's token or token_file", item="token")
            token = Path(token_file).read_text().strip()
        self.address = address
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, HWM)
        self._watch = ConnectionWatch(self._sock, address, heartbeat_timeout)
        self._sock.connect(address)
        self._closed = False
        self._seq = 0
        self._pid = 0
        self._same_host = False
        self._hb: Heartbeat | None = None
        self._silence: Silence | None = None
        self._hang_limit: float | None = None
        self._timeout_key = TIMEOUT_KEY
        self._service_stats: dict[str, Any] = {}
        self._stats: dict[str, Any] = {"adds": 0, "bytes": 0, "add_s": 0.0, "blocked_s": 0.0}
        try:
            self._sock.send(P.encode(P.HELLO, credential=token_credential(token), pid=os.getpid(),
                                     host=socket.gethostname()))
            msg = self._reply({P.WELCOME}, timeout=timeout)
            self.cfg = OutputConfig.model_validate(msg["config"])
        except BaseException:
            self._shutdown()
            raise
        self._pid = int(msg.get("pid") or 0)
        self._same_host = msg.get("host") == socket.gethostname()
        if self._same_host and msg.get("heartbeat"):
            try:
                self._hb = Heartbeat(msg["heartbeat"])
            except OSError:  # another mount namespace (a container): the pid check alone
                self._hb = None
            else:
                self._silence = Silence(self._hb, self._pid)
                self._hang_limit = hang_limit(self.cfg)
                self._timeout_key = str(msg.get("timeout_key") or TIMEOUT_KEY)
        self._shapes = {f: self.cfg.shape(f) for f in self.cfg.fields}

    @classmethod
    def from_dir(cls, directory: str | os.PathLike[str], **kw: Any) -> "RemoteOutput":
        """Connect to the service whose ``address`` and ``token`` files are in ``directory``."""
        d = Path(directory)
        try:
            address = (d / "address").read_text().strip()
        except FileNotFoundError:
            raise ServiceLost(f"{d / 'address'}: no output service is running there") from None
        return cls(address, token_file=d / "token", **kw)

    # -- liveness ----------------------------------------------------------------------------

    def _gone(self) -> str | None:
        """Why the service counts as lost (gone, unreachable, or hung: see :class:`RemoteOutput`), or None."""
        here = bool(self._pid and self._same_host)
        if here:
            try:
                os.kill(self._pid, 0)
            except ProcessLookupError:
                return "gone"
            except PermissionError:
                here = False
            else:
                if process_state(self._pid) == "a zombie":
                    return "a zombie (killed?)"
        why = self._watch.lost()
        if why is not None:
            return why
        if here and self._silence is not None and self._hang_limit is not None:
            return hang_message(self._silence, self._hang_limit, self._hb, self._pid, self._timeout_key)
        return None

    def _lost(self, why: str) -> ServiceLost:
        self._closed = True
        self._shutdown()  # an open socket would keep the context, and the process's exit, waiting
        return ServiceLost(f"the output service at {self.address} (pid {self._pid}) is {why}: what this process "
                           f"added since its last sync may not be written ({self._stats['adds']} add(s) in all)")

    def _reply(self, kinds: set[str], timeout: float | None = None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._sock.poll(POLL_MS, zmq.POLLIN):
            why = self._gone()
            if why is not None:
                raise self._lost(why)
            if deadline is not None and time.monotonic() > deadline:
                raise ServiceLost(f"no answer from the output service at {self.address} within {timeout:g} s "
                                  "(is it running? see its address file)")
        msg = P.decode(self._sock.recv())
        if msg["kind"] == P.ERROR:
            raise OutputError(msg.get("error") or "the output service refused")
        if msg["kind"] not in kinds:
            raise P.ProtocolError(f"the output service answered {msg['kind']!r}, expected {sorted(kinds)}")
        return msg

    def _send(self, frames: list[Any]) -> None:
        t0 = None  # set once the send has to wait: back-pressure, the service is behind
        while True:
            try:
                self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                break
            except zmq.Again:
                pass
            if t0 is None:
                t0 = time.perf_counter()
            if not self._sock.poll(POLL_MS, zmq.POLLOUT):
                why = self._gone()
                if why is not None:
                    raise self._lost(why)
        if t0 is not None:
            self._stats["blocked_s"] += time.perf_counter() - t0

    # -- the API ----------------------------------------------------------------------------

    def add(self, name: str, array: Any, time: float, member: int | None = None, region: Region = None) -> None:
        """As :meth:`Output.add`: checked here, then sent to the service (``array`` is copied first)."""
        t0 = _now()
        if self._closed:
            raise OutputError("add after close")
        piece = check_piece(self.cfg, self._shapes, name, array, time, member, region)
        keep = wire_copy(piece.array, piece.wire)
        self._seq += 1
        meta = P.encode(ADD, seq=self._seq, field=piece.name, time=piece.time, member=piece.member,
                        region=piece.region_json(), dtype=keep.dtype.str, shape=list(keep.shape))
        self._send([meta, memoryview(keep.reshape(-1).view(np.uint8))])
        s = self._stats
        s["adds"] += 1
        s["bytes"] += keep.nbytes
        s["add_s"] += _now() - t0

    def _call(self, kind: str, reply: str, **meta: Any) -> dict[str, Any]:
        self._seq += 1
        self._send([P.encode(kind, seq=self._seq, **meta)])
        msg = self._reply({reply})
        if "stats" in msg:
            self._service_stats = msg["stats"]
        return msg

    def sync(self) -> None:
        """Wait until every array added so far (by this process, and by the others) is written;
        raises the errors this process's adds caused."""
        if self._closed:
            raise OutputError("sync after close")
        _raise(self._call(P.SYNC, P.SYNCED))

    def discard(self, time: float) -> list[str]:
        """As :meth:`Output.discard`: forget ``time`` (every field) before adding it again."""
        if self._closed:
            raise OutputError("discard after close")
        msg = self._call(P.DISCARD, P.DISCARDED, time=float(time))
        _raise(msg)
        return list(msg.get("dropped", []))

    def close(self, wait: bool = True) -> None:
        """Say goodbye. ``wait``: first wait until everything is written (as :meth:`Output.close`);
        False: return once the service has received every add (it writes them after this process
        is gone; its owner learns of a failure when it stops the service)."""
        if self._closed:
            return
        try:
            if wait:
                self.sync()
            _raise(self._call(P.BYE, P.BYE))
        finally:
            self._closed = True
            self._shutdown()

    def stats(self) -> dict[str, Any]:
        """``adds``, ``bytes``, ``add_s`` (s in add), ``blocked_s`` (of it, waiting for the service);
        ``service``: the service's Output figures at the last sync/close (all clients together)."""
        return dict(self._stats, service=dict(self._service_stats))

    def _shutdown(self) -> None:
        if self._sock.closed:
            return
        self._watch.close()
        self._sock.close(linger=0)
        self._ctx.term()
        if self._hb is not None:
            self._hb.close()
            self._hb = None

    def __enter__(self) -> "RemoteOutput":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        elif not self._closed:
            self._closed = True
            self._shutdown()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self._closed = True
                self._shutdown()
            except Exception:
                pass


def _raise(msg: dict[str, Any]) -> None:
    if msg.get("error"):
        raise OutputError(f"output service: {msg['error']}")


def _now() -> float:
    return time.perf_counter()
