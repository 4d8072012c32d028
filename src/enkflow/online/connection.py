"""A runner's request/reply connection to one server socket, which notices a lost server.

A DEALER socket plus a socket monitor: a server process that dies closes its
TCP connections, the monitor reports the disconnect at once and the pending
request fails with :class:`ServerLost` instead of waiting forever. ZeroMQ
reconnects to the same address by itself; a restarted server is greeted anew
by the runner (HELLO).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import zmq

from enkflow.errors import EnkflowError
from enkflow.online.wire import Header, Kind, ProtocolError, VersionMismatch, decode_json
from enkflow.output.connection_watch import ConnectionWatch


class ServerLost(EnkflowError):
    """The server went away (or did not answer in time) while a request was pending."""


class ServerError(EnkflowError):
    """The server rejected a request; the message says why."""


def configure(sock: zmq.Socket, curve_server_key: str | None) -> None:
    """Common options: no lingering on close, CURVE encryption when the server's public key is given."""
    sock.setsockopt(zmq.LINGER, 0)
    if curve_server_key:
        pub, sec = zmq.curve_keypair()
        sock.curve_secretkey = sec
        sock.curve_publickey = pub
        sock.curve_serverkey = curve_server_key.encode() if isinstance(curve_server_key, str) else curve_server_key


class Connection:
    """Request/reply over one DEALER socket connected to ``address``."""

    def __init__(self, ctx: zmq.Context, address: str, *, curve_server_key: str | None = None):
        self.address = address
        self.sock = ctx.socket(zmq.DEALER)
        configure(self.sock, curve_server_key)
        # No ZeroMQ pings: the runner's own heartbeats tell the server it lives, and a lost server
        # shows as a closed connection or a reply that does not come within the timeout.
        self.watch = ConnectionWatch(self.sock, address, heartbeat_timeout=0.0)
        self.sock.connect(address)

    @property
    def lost(self) -> bool:
        """Whether the connection, once made, was closed (the server went away)."""
        return self.watch.lost() is not None

    def send(self, frames: Sequence[object]) -> None:
        self.sock.send_multipart(list(frames), copy=False)

    def recv(self, timeout_s: float, accept: Callable[[Header], bool], *,
             epoch: int = 0, task: int = 0) -> tuple[Header, list[zmq.Frame]]:
        """The next reply that ``accept`` takes (older, stale replies are skipped); ERROR, or a reply in
        another protocol version, raises ServerError. With ``epoch`` (the server incarnation that welcomed
        us), a reply from another incarnation raises ServerLost: the server restarted, greet it again.
        With ``task``, an ERROR about another task (a late refusal of an earlier request) is stale too."""
        deadline = time.monotonic() + timeout_s
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.watch.monitor, zmq.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if self.lost:
                # A reply the server sent before it went (the ERROR that stopped the study) is still
                # queued here, and may be read after the disconnect is seen: it comes first.
                if not self.sock.poll(0):
                    raise ServerLost(f"the server at {self.address} went away")
            elif left <= 0:
                raise ServerLost(f"no reply from the server at {self.address} within {timeout_s:g} s")
            elif self.sock not in dict(poller.poll(min(left, 1.0) * 1000)):
                continue
            frames = self.sock.recv_multipart(copy=False)
            try:
                hdr = Header.unpack(frames[0].buffer)
            except VersionMismatch as exc:
                raise ServerError(f"the server at {self.address} runs another enkflow: {exc}") from None
            except ProtocolError:
                continue
            if epoch and hdr.epoch and hdr.epoch != epoch:
                raise ServerLost(f"the server at {self.address} restarted (epoch {hdr.epoch}, welcomed by {epoch})")
            if hdr.kind is Kind.ERROR:
                if task and hdr.task and hdr.task != task:
                    continue
                msg = decode_json(frames[1].buffer, "error").get("error", "?") if len(frames) > 1 else "?"
                raise ServerError(str(msg))
            if accept(hdr):
                return hdr, frames[1:]

    def close(self) -> None:
        self.watch.close()
        self.sock.close(0)
