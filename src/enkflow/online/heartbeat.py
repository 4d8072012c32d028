"""A runner's heartbeat: rank 0's thread that shows the server the runner is alive while its model computes."""

from __future__ import annotations

import threading

import zmq

from enkflow.online.connection import configure
from enkflow.online.wire import Header, Kind


class Heartbeat:
    """Rank 0's heartbeat thread: a message every ``interval_s`` on its own socket, so a runner busy
    in its model still shows it is alive (and a stopped or killed one stops showing it)."""

    def __init__(self, ctx: zmq.Context, address: str, cred: bytes, runner: int, interval_s: float, curve: str | None):
        self.task = 0
        self._stop = threading.Event()
        self._args = (ctx, address, cred, runner, interval_s, curve)
        self._thread = threading.Thread(target=self._run, name="enkflow-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        ctx, address, cred, runner, interval_s, curve = self._args
        sock = ctx.socket(zmq.DEALER)
        configure(sock, curve)
        sock.setsockopt(zmq.SNDHWM, 4)
        sock.connect(address)
        try:
            while not self._stop.wait(interval_s):
                try:
                    sock.send(Header(Kind.HEARTBEAT, cred, runner, self.task).pack(), zmq.NOBLOCK)
                except zmq.Again:
                    pass
        finally:
            sock.close(0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
