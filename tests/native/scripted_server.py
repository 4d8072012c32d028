"""A scripted enkflow server for protocol corner cases the real server does not produce on demand: a control
ROUTER and ``ranks`` data ROUTERs on loopback that speak enkflow.online.wire, hand out the tasks of
``tasks`` in order, then STOP (or, with ``hold``, leave READY unanswered), leave the GETs of the tasks in ``hold_get`` unanswered, and answer each PUT through ``put_reply(task, rank)`` (None: ACK, a string:
ERROR with that text; after ``put_delay[rank]`` seconds). With ``close_after_error``, a data rank closes its
socket right after an ERROR, as a server that stopped the study does. It records what the runner sent, and the
bytes of each forecast (``forecasts[(task, rank)]``). One float64 field "x" of ``n`` elements, split over the data
ranks as enkflow.online.fields.Ownership splits an assimilated field. With ``shm``, every data rank offers
shared memory in its WELCOME entry (online/segments.py's layout: a store holding member m's state as m
everywhere, a slot per task; with ``shm == "other-nonce"`` the store's header bears another nonce) and
answers GET_SLOT and PUT_SLOT; its segments are removed at close. ``retire[(task, rank)]`` says when data rank
``rank`` retires the task's slot, as a server that declared the task stale does (AT_GET: unlinked just before
its SLOT reply names it; AT_PUT: when its PUT_SLOT comes, which is refused as the real server refuses it);
``spoil_slot(task, rank, where)`` gives the SLOT reply's JSON in place of ``where``. HELLOs are answered only
once ``welcome_gate`` (when given) is set."""

from __future__ import annotations

import json
import os
import secrets
import struct
import threading
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path

import numpy as np
import zmq

from enkflow.online.wire import NO_SLOT, Header, Kind, credential, decode_index
from enkflow.shm_names import new_segment

HEADER_PAGE = 4096


class Retire(Enum):
    AT_GET = "at-get"
    AT_PUT = "at-put"


class _SharedMemory:
    """One data rank's segments: its store (members 1..``members``, ``rows`` elements each, member-major) and a
    slot per task."""

    def __init__(self, lo: int, hi: int, members: int, other_nonce: bool):
        self.rows, self.lo, self.nonce = hi - lo, lo, secrets.token_bytes(16)
        self.store = self._make(b"ENKFSTOR", secrets.token_bytes(16) if other_nonce else self.nonce,
                                np.repeat(np.arange(1.0, members + 1), self.rows))
        self.slots: dict[int, str] = {}

    def _make(self, magic: bytes, nonce: bytes, data: np.ndarray) -> str:
        path = str(new_segment("online"))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.pwrite(fd, struct.pack("<8sII16sQ", magic, 1, 0, nonce, 0).ljust(HEADER_PAGE, b"\0"), 0)
            os.pwrite(fd, data.astype("<f8").tobytes() or b"\0", HEADER_PAGE)
        finally:
            os.close(fd)
        return path

    def offer(self) -> dict:
        return {"segment": self.store, "nonce": self.nonce.hex()}

    def where(self, task: int, member: int, idx: np.ndarray) -> dict:
        """The SLOT reply's JSON for these pieces of the task (its slot made on first use)."""
        if task not in self.slots:
            self.slots[task] = self._make(b"ENKFSLOT", self.nonce, np.zeros(self.rows))
        at = [[HEADER_PAGE + 8 * ((member - 1) * self.rows + off - self.lo), HEADER_PAGE + 8 * (off - self.lo)]
              for off in idx[:, 1].tolist()]
        return {"read": self.store, "write": self.slots[task], "at": at}

    def forecast(self, task: int, idx: np.ndarray) -> bytes:
        with open(self.slots[task], "rb") as fh:
            data = fh.read()
        return b"".join(data[HEADER_PAGE + 8 * (off - self.lo):HEADER_PAGE + 8 * (off - self.lo + cnt)]
                        for _, off, cnt in idx)

    def remove(self) -> None:
        for path in [self.store, *self.slots.values()]:
            Path(path).unlink(missing_ok=True)  # retired slots are gone already


class ScriptedServer:
    def __init__(self, token: str, tasks: list[tuple[int, int, int]], *, ranks: int = 2,
                 put_reply: Callable[[int, int], str | None] = lambda task, rank: None, epoch: int = 7,
                 hold: bool = False, hold_get: set[int] = frozenset(), like: "ScriptedServer | None" = None,
                 put_delay: dict[int, float] | None = None, close_after_error: bool = False,
                 shm: bool | str = False, n: int = 40, retire: dict[tuple[int, int], Retire] | None = None,
                 spoil_slot: Callable[[int, int, dict], dict] = lambda task, rank, where: where,
                 welcome_gate: threading.Event | None = None):
        self.cred, self.tasks, self.put_reply, self.epoch = credential(token), list(tasks), put_reply, epoch
        self.retire, self.spoil_slot, self.welcome_gate = dict(retire or {}), spoil_slot, welcome_gate
        self._hellos: list[tuple[bytes, Header]] = []  # held until welcome_gate is set
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
        self.forecasts: dict[tuple[int, int], bytes] = {}
        self.shm = [self._shared_memory(rank, ranks, n, shm) for rank in range(ranks)] if shm else []
        self.fails: list[str] = []
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _shared_memory(self, rank: int, ranks: int, n: int, shm: bool | str) -> _SharedMemory:
        block = -(-n // ranks)
        return _SharedMemory(min(rank * block, n), min((rank + 1) * block, n),
                             max([m for _, m, _ in self.tasks], default=1), shm == "other-nonce")

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
            while self._hellos and self.welcome_gate.is_set():
                self._welcome(*self._hellos.pop(0))
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
            if self.welcome_gate is not None and not self.welcome_gate.is_set():
                self._hellos.append((identity, hdr))
            else:
                self._welcome(identity, hdr)
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

    def _welcome(self, identity: bytes, hdr: Header) -> None:
        body = {"epoch": self.epoch, "ranks": len(self.data), "data": self.data_addresses, "heartbeat_s": 0.5,
                "shm": [m.offer() for m in self.shm] or [None] * len(self.data)}
        self.control.send_multipart([identity, hdr.reply(Kind.WELCOME, epoch=self.epoch).pack(),
                                     json.dumps(body).encode()])

    def _on_data(self, rank: int, identity: bytes, hdr: Header, rest: list[bytes]) -> None:
        sock = self.data[rank]
        self.received.append((hdr.kind.name, hdr.task, rank))
        idx = decode_index(rest[0], hdr.count)
        if hdr.kind in (Kind.GET, Kind.GET_SLOT) and hdr.task in self.hold_get:
            return  # never answered
        if hdr.kind is Kind.GET:
            frames = [np.full(cnt, float(hdr.member)).tobytes() for _, _, cnt in idx]
            sock.send_multipart([identity, hdr.reply(Kind.DATA, epoch=self.epoch).pack(), rest[0], *frames])
        elif hdr.kind is Kind.GET_SLOT:
            where = self.shm[rank].where(hdr.task, hdr.member, idx)
            if self.retire.get((hdr.task, rank)) is Retire.AT_GET:
                os.unlink(where["write"])
            where = json.dumps(self.spoil_slot(hdr.task, rank, where)).encode()
            sock.send_multipart([identity, hdr.reply(Kind.SLOT, epoch=self.epoch).pack(), rest[0], where])
        elif hdr.kind is Kind.PUT_SLOT and (hdr.task, rank) in self.retire:
            Path(self.shm[rank].slots[hdr.task]).unlink(missing_ok=True)
            error = f"task {hdr.task} (member {hdr.member}) {NO_SLOT} {rank}: stale, or its state was never fetched"
            sock.send_multipart([identity, hdr.reply(Kind.ERROR, epoch=self.epoch).pack(),
                                 json.dumps({"error": error}).encode()])
        elif hdr.kind in (Kind.PUT, Kind.PUT_SLOT):
            self.forecasts[(hdr.task, rank)] = (b"".join(rest[1:]) if hdr.kind is Kind.PUT
                                                else self.shm[rank].forecast(hdr.task, idx))
            error = self.put_reply(hdr.task, rank)
            reply = ([identity, hdr.reply(Kind.ACK, epoch=self.epoch).pack()] if error is None else
                     [identity, hdr.reply(Kind.ERROR, epoch=self.epoch).pack(), json.dumps({"error": error}).encode()])
            self._later.append((time.monotonic() + self.put_delay.get(rank, 0.0), rank, reply))

    def close(self) -> None:
        self.done.set()
        self._thread.join(10)
        for memory in self.shm:
            memory.remove()
        self.shm = []
