"""A scripted enkflow server for protocol corner cases the real server does not produce on demand: a control
ROUTER and ``ranks`` data ROUTERs on loopback that speak enkflow.online.wire, hand out the tasks of
``tasks`` in order, then STOP (or, with ``hold``, leave READY unanswered), leave the GETs of the tasks in ``hold_get`` unanswered, and answer each PUT through ``put_reply(task, rank)`` (None: ACK, a string:
ERROR with that text; after ``put_delay[rank]`` seconds). With ``close_after_error``, a data rank closes its
socket right after an ERROR, as a server that stopped the study does. It records what the runner sent. One float64 field "x" of ``n`` elements, split
over the data ranks as enkflow.online.fields.Ownership splits an assimilated field."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import numpy as np
import zmq

from enkflow.online.wire import Header, Kind, credential, decode_index


class ScriptedServer:
    def __init__(self, token: str, tasks: list[tuple[int, int, int]], *, ranks: int = 2,
                 put_reply: Callable[[int, int], str | None] = lambda task, rank: None, epoch: int = 7,
                 hold: bool = False, hold_get: set[int] = frozenset(), like: "ScriptedServer | None" = None,
                 put_delay: dict[int, float] | None = None, close_after_error: bool = False):
        self.cred, self.tasks, self.put_reply, self.epoch = credential(token), list(tasks), put_reply, epoch
        self.hold, self.hold_get = hold, set(hold_get)
        self.put_delay, self.close_after_error = dict(put_delay or {}), close_after_error
        self._later: list[tuple[float, int, list[bytes]]] = []  # (when, data rank, frames): delayed replies
        self.ctx = zmq.Context()
        self.control = self.ctx.socket(zmq.ROUTER)
        self.data = [self.ctx.socket(zmq.ROUTER) for _ in range(ranks)]
        if like is not None:  # a restarted server: the addresses of the closed one ``like``
            self.address, self.data_addresses = like.address, list(like.data_addresses)
            self.control.bind(self.address)
            for sock, address in zip(self.data, self.data_addresses):
                sock.bind(address)
        else:
            self.address = f"tcp://127.0.0.1:{self.control.bind_to_random_port('tcp://127.0.0.1')}"
            self.data_addresses = [f"tcp://127.0.0.1:{s.bind_to_random_port('tcp://127.0.0.1')}" for s in self.data]
        self.received: list[tuple[str, int, int]] = []  # (kind, task, data rank or -1)
        self.fails: list[str] = []
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        for s in (self.control, *self.data):
            poller.register(s, zmq.POLLIN)
        while not self.done.is_set():
            for sock, _ in poller.poll(20):
                frames = sock.recv_multipart()
                hdr = Header.unpack(frames[1])
                if sock is self.control:
                    self._on_control(frames[0], hdr, frames[2:])
                else:
                    self._on_data(self.data.index(sock), frames[0], hdr, frames[2:])
            for item in [x for x in self._later if x[0] <= time.monotonic()]:
                self._later.remove(item)
                sock = self.data[item[1]]
                sock.send_multipart(item[2])
                if self.close_after_error and Header.unpack(item[2][1]).kind is Kind.ERROR:
                    poller.unregister(sock)
                    sock.close(linger=1000)
        for s in (self.control, *self.data):
            s.close(0)
        self.ctx.term()

    def _on_control(self, identity: bytes, hdr: Header, rest: list[bytes]) -> None:
        if hdr.kind is Kind.HEARTBEAT:
            return
        self.received.append((hdr.kind.name, hdr.task, -1))
        if hdr.kind is Kind.HELLO:
            body = {"epoch": self.epoch, "ranks": len(self.data), "data": self.data_addresses, "heartbeat_s": 0.5}
            self.control.send_multipart([identity, hdr.reply(Kind.WELCOME, epoch=self.epoch).pack(),
                                         json.dumps(body).encode()])
        elif hdr.kind is Kind.READY:
            if self.hold and not self.tasks:
                return
            if self.tasks:
                task, member, cycle = self.tasks.pop(0)
                reply = Header(Kind.TASK, self.cred, hdr.runner, task, member, cycle, nsteps=1, epoch=self.epoch)
            else:
                reply = Header(Kind.STOP, self.cred, hdr.runner, epoch=self.epoch)
            self.control.send_multipart([identity, reply.pack()])
        elif hdr.kind is Kind.FAIL:
            self.fails.append(json.loads(rest[0])["error"])
        elif hdr.kind is Kind.BYE:
            self.done.set()

    def _on_data(self, rank: int, identity: bytes, hdr: Header, rest: list[bytes]) -> None:
        sock = self.data[rank]
        self.received.append((hdr.kind.name, hdr.task, rank))
        idx = decode_index(rest[0], hdr.count)
        if hdr.kind is Kind.GET and hdr.task in self.hold_get:
            return  # never answered
        if hdr.kind is Kind.GET:
            frames = [np.full(cnt, float(hdr.member)).tobytes() for _, _, cnt in idx]
            sock.send_multipart([identity, hdr.reply(Kind.DATA, epoch=self.epoch).pack(), rest[0], *frames])
        elif hdr.kind is Kind.PUT:
            error = self.put_reply(hdr.task, rank)
            reply = ([identity, hdr.reply(Kind.ACK, epoch=self.epoch).pack()] if error is None else
                     [identity, hdr.reply(Kind.ERROR, epoch=self.epoch).pack(), json.dumps({"error": error}).encode()])
            self._later.append((time.monotonic() + self.put_delay.get(rank, 0.0), rank, reply))

    def close(self) -> None:
        self.done.set()
        self._thread.join(10)
