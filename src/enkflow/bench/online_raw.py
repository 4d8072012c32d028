"""The raw pyzmq baseline of ``enkflow bench online`` (``raw_zmq_gbps``): the same bytes, the same
streams, no protocol.

``ranks`` receiver processes, each a ROUTER socket on loopback TCP holding its
share of one member's state (the same row blocks the server ranks own), and
``runners`` sender processes, each one DEALER socket connected to every
receiver. A round is ``members`` tasks dealt round-robin to the senders; a task
is what a runner does with a member, without the protocol: send this member's
share to every receiver (one frame each, ``copy=False``) and wait for their
small replies, then ask every receiver for its share and receive it
(``copy=False`` on both sides; nothing is copied into a state array). Timed per
round on the coordinating process: from the moment it tells every (connected,
warmed-up) sender "go" to the last sender's "done". One untimed warm-up round,
then the timed rounds.

``python -m enkflow.bench.online_raw {recv,send}`` are the receiver and sender processes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np
import zmq

from enkflow.errors import EnkflowError
from enkflow.parallel import RowBlocks

_ME = [sys.executable, "-m", "enkflow.bench.online_raw"]


def raw_recv(coord_address: str, index: int, count: int) -> None:
    """A receiver of ``count`` float64: answers b"put" (the frame) with b"ok", b"get" with its share."""
    ctx: zmq.Context = zmq.Context.instance()
    coord = ctx.socket(zmq.DEALER)
    coord.connect(coord_address)
    data = ctx.socket(zmq.ROUTER)
    data.setsockopt(zmq.LINGER, 0)
    port = data.bind_to_random_port("tcp://127.0.0.1")
    share = np.full(count, 1.5)  # its pages are touched once, before the clock starts
    coord.send_multipart([b"recv", str(index).encode(), f"tcp://127.0.0.1:{port}".encode()])
    poller = zmq.Poller()
    poller.register(coord, zmq.POLLIN)
    poller.register(data, zmq.POLLIN)
    while True:
        ready = dict(poller.poll())
        if data in ready:
            ident, op, *rest = data.recv_multipart(copy=False)
            if op.bytes == b"get":
                data.send_multipart([ident, b"data", share], copy=False)
            else:
                if rest and rest[0].buffer.nbytes != count * 8:
                    raise SystemExit(f"raw receiver: got {rest[0].buffer.nbytes} bytes, expected {count * 8}")
                data.send_multipart([ident, b"ok"])
        if coord in ready:
            if coord.recv() == b"stop":
                break
            coord.send_multipart([b"cpu", str(time.process_time()).encode()])
    data.close(0)
    coord.close(0)


def raw_send(coord_address: str, index: int, counts: list[int]) -> None:
    """A sender: per task, PUT its share to every receiver (``counts`` float64 each) and wait for
    the replies, then GET the shares back."""
    ctx: zmq.Context = zmq.Context.instance()
    coord = ctx.socket(zmq.DEALER)
    coord.connect(coord_address)
    coord.send_multipart([b"send", str(index).encode()])
    addrs = json.loads(coord.recv())
    state = np.full(sum(counts), 2.5)
    views, off = [], 0
    for c in counts:
        views.append(state[off:off + c])
        off += c
    socks = []
    for addr in addrs:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(addr)
        s.send(b"put")  # a first round trip: the connection is up before the clock starts
        s.recv()
        socks.append(s)
    coord.send(b"ready")
    while True:
        msg = coord.recv()
        if msg == b"stop":
            break
        cpu = time.process_time()
        for _ in range(int(msg)):
            _task(socks, views, counts)
        coord.send_multipart([b"done", str(time.process_time() - cpu).encode()])
    for s in socks:
        s.close(0)
    coord.close(0)


def _task(socks: list[zmq.Socket], views: list[np.ndarray], counts: list[int]) -> None:
    """One member: each share to its receiver and the replies, then each share back."""
    for s, v in zip(socks, views):
        s.send_multipart([b"put", v], copy=False)
    for s in socks:
        s.recv()
    for s in socks:
        s.send(b"get")
    for s, c in zip(socks, counts):
        _, frame = s.recv_multipart(copy=False)
        if frame.buffer.nbytes != c * 8:
            raise SystemExit(f"raw sender: got {frame.buffer.nbytes} bytes, expected {c * 8}")


class _Coordinator:
    """The benchmark's end: a ROUTER socket the receivers and senders connect to, and their processes."""

    def __init__(self, env: dict[str, str], timeout_s: float):
        self.env = env
        self.sock: zmq.Socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.procs: list[subprocess.Popen] = []
        self.deadline = time.monotonic() + timeout_s

    def start(self, role: str, index: int, *args: str) -> None:
        self.procs.append(subprocess.Popen([*_ME, role, "--coord", self.address, "--index", str(index), *args],
                                           env=self.env))

    def recv(self) -> list[bytes]:
        while not self.sock.poll(200):
            if time.monotonic() > self.deadline or any(p.poll() is not None for p in self.procs):
                raise EnkflowError("the raw pyzmq baseline's processes stopped or did not answer in time")
        return self.sock.recv_multipart()

    def cpu(self, idents: list[bytes]) -> float:
        """The CPU seconds so far of the processes ``idents`` (receivers)."""
        for ident in idents:
            self.sock.send_multipart([ident, b"cpu"])
        return sum(float(self.recv()[2]) for _ in idents)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.sock.close(0)


def raw_zmq(n: int, ranks: int, senders: int, members: int, rounds: int, env: dict[str, str],
            timeout_s: float) -> tuple[list[float], list[float]]:
    """The raw baseline's seconds of each of ``rounds`` timed rounds (after one warm-up round), and the
    CPU seconds of each (every sender and receiver process); a state of ``n`` float64."""
    counts = [b - a for a, b in (RowBlocks(n, ranks).bounds(r) for r in range(ranks))]
    coord = _Coordinator(env, timeout_s)
    try:
        for r in range(ranks):
            coord.start("recv", r, "--count", str(counts[r]))
        receivers: dict[int, tuple[bytes, str]] = {}
        while len(receivers) < ranks:
            ident, _, idx, addr = coord.recv()
            receivers[int(idx)] = (ident, addr.decode())
        addrs = json.dumps([receivers[r][1] for r in range(ranks)]).encode()
        for i in range(senders):
            coord.start("send", i, "--counts", ",".join(map(str, counts)))
        idents: list[bytes] = []
        while len(idents) < senders:
            ident, *msg = coord.recv()
            if msg[0] == b"send":
                coord.sock.send_multipart([ident, addrs])
            elif msg[0] == b"ready":
                idents.append(ident)
        times, cpus = _rounds(coord, idents, [receivers[r][0] for r in range(ranks)], members, rounds)
        for ident in idents + [receivers[r][0] for r in range(ranks)]:
            coord.sock.send_multipart([ident, b"stop"])
        for p in coord.procs:
            p.wait(timeout=60)
    finally:
        coord.close()
    return times, cpus


def _rounds(coord: _Coordinator, senders: list[bytes], receivers: list[bytes], members: int,
            rounds: int) -> tuple[list[float], list[float]]:
    """One warm-up round, then ``rounds`` timed rounds: their seconds and CPU seconds."""
    times, cpus = [], []
    share = [members // len(senders) + (1 if i < members % len(senders) else 0) for i in range(len(senders))]
    for rnd in range(rounds + 1):
        c0 = coord.cpu(receivers)
        t0 = time.perf_counter()
        for ident, k in zip(senders, share):
            coord.sock.send_multipart([ident, str(k).encode()])
        sent_cpu = sum(float(coord.recv()[2]) for _ in senders)
        dt = time.perf_counter() - t0
        if rnd:
            times.append(dt)
            cpus.append(sent_cpu + coord.cpu(receivers) - c0)
    return times, cpus


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m enkflow.bench.online_raw",
                                description="the processes of the raw pyzmq baseline of enkflow bench online")
    sub = p.add_subparsers(dest="role", required=True)
    for role in ("recv", "send"):
        s = sub.add_parser(role)
        s.add_argument("--coord", required=True)
        s.add_argument("--index", type=int, required=True)
        s.add_argument("--count" if role == "recv" else "--counts", required=True)
    a = p.parse_args(argv)
    if a.role == "recv":
        raw_recv(a.coord, a.index, int(a.count))
    else:
        raw_send(a.coord, a.index, [int(c) for c in a.counts.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
