"""Whether a DEALER's connection still stands: a ZeroMQ socket monitor, and over tcp ZeroMQ's own
pings (ZMTP heartbeats). Used where the other process cannot be seen (another node): a sender's
connection to a writer or to the output service, and an online runner's to the server.

The pings are answered by the peer's ZeroMQ I/O thread, not by its main thread: a peer busy
writing, or waiting for its own writers, answers them; one that is stopped (SIGSTOP), or whose
node went away without closing the connection, does not, and ZeroMQ closes the connection after
``heartbeat_timeout`` seconds. A process that ends closes its connections at once.
"""

from __future__ import annotations

from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

HEARTBEAT_IVL_S = 2.0


class ConnectionWatch:
    """The watch of ``sock`` (a DEALER), made before it connects to ``address``.

    ``heartbeat_timeout``: seconds without an answer to a ping before the connection counts as
    closed (tcp only; 0: no pings)."""

    def __init__(self, sock: Any, address: str, heartbeat_timeout: float) -> None:
        self.address = address
        self.heartbeat_timeout = heartbeat_timeout if address.startswith("tcp://") else 0.0
        if self.heartbeat_timeout > 0:
            sock.setsockopt(zmq.HEARTBEAT_IVL, int(HEARTBEAT_IVL_S * 1000))
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(self.heartbeat_timeout * 1000))
        self._sock = sock
        self._monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._connected = False
        self._closed = False

    @property
    def monitor(self) -> Any:
        """The monitor socket, to poll beside the watched one: a connection event wakes the poller."""
        return self._monitor

    def lost(self) -> str | None:
        """Why the connection counts as lost, or None while it stands (or was never made)."""
        while self._monitor.poll(0):
            ev = recv_monitor_message(self._monitor)["event"]
            if ev == zmq.EVENT_CONNECTED:
                self._connected = True
            elif ev == zmq.EVENT_DISCONNECTED and self._connected:  # not a failed first try
                self._closed = True
        if not self._closed:
            return None
        pings = (f" (no answer to ZeroMQ's pings within {self.heartbeat_timeout:g} s, or the process ended)"
                 if self.heartbeat_timeout > 0 else "")
        return f"unreachable: the connection to it was closed{pings}"

    def close(self) -> None:
        """Before the socket closes."""
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(0)
