"""The output service's process (:mod:`enkflow.output.service`): its clients, their requests, and the
one :class:`~enkflow.output.Output` they share (:class:`ServiceLoop`).

Errors of an add (a writer's failure) are kept for the client that made it and returned by its next
sync/discard/bye. A piece identical to one already received (same field, time, member, region and
bytes: an online member run twice) is dropped. Back-pressure: the loop reads a client's messages only
as fast as the writers take them (the Output's ``buffer_mb``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import shutil
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from enkflow.errors import EnkflowError, StorageError
from enkflow.output import protocol as P
from enkflow.output.client import Output, OutputError
from enkflow.output.config import OutputConfig
from enkflow.output.heartbeat import Heartbeat, process_state
from enkflow.output.service_protocol import ADD, DTYPES, STOP, STOPPED, TIMEOUT_KEY, token_credential
from enkflow.tokens import secret_file

log = logging.getLogger("enkflow.output.service")

_CHECK_S = 0.5
# Pieces remembered to recognise a rerun's identical piece (most recent first kept): a rerun comes within
# its cycle, long before this many pieces later.
SEEN_PIECES = 1 << 16

PieceKey = tuple[str, float, Any, tuple[tuple[int, int], ...] | None]
"""(field, time, member, region as ((start, stop), ...) or None) of a piece received."""


def _fields_named(text: str, t: float) -> list[str]:
    """The fields a writer's message names at time ``t`` ("field F time T", T as ``:g`` writes it and
    not the start of a longer number: time 1 is not time 10 or 1.5)."""
    return re.findall(rf"field (\S+) time {re.escape(f'{t:g}')}(?![\w.])", text)


@dataclass
class _Client:
    pid: int
    host: str
    adds: int = 0
    times: set[tuple[str, float]] = field(default_factory=set)  # (field, time) this client added to
    errors: list[str] = field(default_factory=list)


class _Turn(Enum):
    """What a message made of a turn of the loop."""

    DONE = "done"  # handled: the periodic checks may follow
    IGNORED = "ignored"  # unreadable, or a refused credential: on to the next message
    STOPPED = "stopped"  # the owner's stop, answered: the loop ends


class ServiceLoop:
    """The service's state, from its start-up ``spec`` (:meth:`OutputService.start
    <enkflow.output.service.OutputService.start>` writes it): the Output and its writers, the clients."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.cfg = OutputConfig.model_validate(spec["config"])
        self.owner = int(spec["owner"])
        self.dir = Path(spec["dir"])
        self.endpoint = str(spec["endpoint"])
        self.token = secret_file(spec["token_file"])
        self.timeout_key = str(spec.get("timeout_key", TIMEOUT_KEY))
        self.hb = Heartbeat(spec["heartbeat"]) if spec.get("heartbeat") else None
        self.out = Output(self.cfg, coords=spec.get("coords") or None, base_dir=spec.get("base_dir"))
        if self.hb is not None:
            self.out.on_wait = self.hb.beat  # waiting for its writers (watched by the Output) is progress
        self.clients: dict[bytes, _Client] = {}
        self.notes: list[str] = []
        self.host = socket.gethostname()
        self.address = ""
        # (field, time, member, region) -> digest of the bytes: an online member run twice (the stateless
        # check, a lost runner's rerun) adds the same piece again; an identical one is dropped here, as the
        # writer would refuse it ("added twice") and lose that time's file. One with other values still is.
        self.seen: OrderedDict[PieceKey, bytes] = OrderedDict()
        self.duplicates = 0
        # Every failure of the writers, also those told to a client: what they lost is lost for the
        # study, whose stop reports them (a run must not end well with a file missing), unless a
        # discard of the time they name lets it be written again.
        self.failures: list[str] = []
        # Failures of a discarded time, per (field, time): forgiven once that field is added again there.
        self.redo: dict[tuple[str, float], str] = {}
        self.stopped: dict[str, Any] = {}  # the stop's reply, once stopped

    def _reply(self, sock: Any, ident: bytes, kind: str, **meta: Any) -> None:
        sock.send_multipart([ident, P.encode(kind, **meta)])

    def _errors(self, c: _Client, extra: str | None = None) -> str | None:
        errs, c.errors = c.errors + ([extra] if extra else []), []
        return "\n".join(errs) if errs else None

    def _check_clients(self) -> None:
        for ident, c in list(self.clients.items()):
            if c.host != self.host or not c.pid:
                continue
            try:
                os.kill(c.pid, 0)
                gone = process_state(c.pid) == "a zombie"
            except ProcessLookupError:
                gone = True
            except PermissionError:
                gone = False
            if gone:
                del self.clients[ident]
                if c.times:
                    note = (f"client pid {c.pid} ended without bye after {c.adds} add(s); the times it added to "
                            f"are incomplete unless completed or discarded: "
                            + ", ".join(f"{f} {t:g}" for f, t in sorted(c.times)[:10]))
                    log.warning("output service: %s", note)
                    self.notes.append(note)

    def _route(self, text: str, caller: _Client) -> str | None:
        """A failure of the writers goes to the clients that added to the (field, time) it names
        (their next call raises it); to ``caller`` when it names none of theirs. Returns what
        ``caller`` gets now."""
        for line in text.splitlines():  # the Output joins the failures it found since the last call
            if line.strip() and line not in self.failures:
                self.failures.append(line)
        owners = [c for c in self.clients.values() if any(f in _fields_named(text, t) for f, t in c.times)] or [caller]
        for c in owners:
            if c is not caller:
                c.errors.append(text)
        return text if caller in owners else None

    # -- add ----------------------------------------------------------------------------------

    def _add(self, c: _Client, msg: dict[str, Any], frames: list[Any]) -> None:
        what = f"add of field {msg.get('field')!r} time {msg.get('time')}"
        array = self._array(c, msg, frames, what)
        if array is None:
            return
        region = msg.get("region")
        reg = tuple(slice(int(s), int(e)) for s, e in region) if region is not None else None
        try:
            key: PieceKey = (str(msg["field"]), float(msg["time"]), msg.get("member"),
                             None if reg is None else tuple((r.start, r.stop) for r in reg))
        except (KeyError, TypeError, ValueError) as exc:
            c.errors.append(f"{what}: {exc}")
            return
        digest = hashlib.blake2b(frames[2].buffer, digest_size=16).digest()
        if self.seen.get(key) == digest:
            self.duplicates += 1
            c.adds += 1
            c.times.add(key[:2])
            return
        if not self._hand_on(c, msg, array, reg, what):
            return
        c.adds += 1
        c.times.add(key[:2])
        self.redo.pop(key[:2], None)
        self.seen[key] = digest
        self.seen.move_to_end(key)
        if len(self.seen) > SEEN_PIECES:
            self.seen.popitem(last=False)

    def _array(self, c: _Client, msg: dict[str, Any], frames: list[Any], what: str) -> np.ndarray | None:
        """The add's data frame as an array in this machine's byte order; None (the client's error kept)
        when the message does not describe it."""
        if len(frames) != 3:
            c.errors.append(f"{what}: expected one data frame, got {len(frames) - 2}")
            return None
        dtype, shape = msg.get("dtype"), msg.get("shape")
        if dtype not in DTYPES or not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            c.errors.append(f"{what}: bad dtype {dtype!r} or shape {shape!r}")
            return None
        buf = frames[2].buffer
        if int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize != len(buf):
            c.errors.append(f"{what}: {len(buf)} data bytes do not match dtype {dtype} shape {shape}")
            return None
        a = np.frombuffer(buf, dtype=dtype).reshape(shape)
        return a.astype(a.dtype.newbyteorder("="), copy=False)

    def _hand_on(self, c: _Client, msg: dict[str, Any], a: np.ndarray, reg: tuple[slice, ...] | None,
                 what: str) -> bool:
        """Add the piece to the Output; whether it took it (else the client's error is kept)."""
        try:
            try:
                self.out.add(msg["field"], a, msg["time"], member=msg.get("member"), region=reg)
            except (OutputError, StorageError) as exc:
                # A failure of earlier pieces (maybe another client's), raised before this one was sent:
                # to whom it concerns; then this piece, once more.
                err = self._route(str(exc), c)
                if err:
                    c.errors.append(err)
                self.out.add(msg["field"], a, msg["time"], member=msg.get("member"), region=reg)
        except (EnkflowError, KeyError, TypeError, ValueError) as exc:
            c.errors.append(f"{what}: {exc}")
            return False
        return True

    # -- the loop -----------------------------------------------------------------------------

    def serve(self, sock: Any) -> dict[str, Any]:
        """Serve until stopped (returns the stop's reply, sent) or the owner dies."""
        last = time.monotonic()
        while True:
            if self.hb is not None:
                self.hb.beat()
            if sock.poll(int(_CHECK_S * 1000), zmq.POLLIN):
                turn = self._receive(sock)
                if turn is _Turn.STOPPED:
                    return self.stopped
                if turn is _Turn.IGNORED:
                    continue
            if time.monotonic() - last >= _CHECK_S:
                last = time.monotonic()
                if os.getppid() != self.owner:
                    log.error("output service: its owner (pid %d) is gone; closing", self.owner)
                    self._orphaned()
                    return {}
                self._check_clients()

    def _receive(self, sock: Any) -> _Turn:
        frames = sock.recv_multipart(copy=False)
        ident = frames[0].bytes
        try:
            msg = P.decode(frames[1].bytes) if len(frames) >= 2 else None
        except P.ProtocolError as exc:
            msg = None
            log.warning("output service: %s", exc)
        if msg is None:
            return _Turn.IGNORED
        kind = msg["kind"]
        c = self.clients.get(ident)
        if self.hb is not None and kind != ADD:
            self.hb.doing(f"{kind} of client {c.pid if c else '?'}")
        if kind in (P.HELLO, STOP):
            return self._admit(sock, ident, msg)
        if c is None:
            if kind != ADD:  # adds of an unknown client get no reply; its next call learns
                self._reply(sock, ident, P.ERROR, error="the output service does not know this client "
                            "(say hello first; the service may have been restarted)")
        elif kind == ADD:
            self._add(c, msg, frames)
        else:
            self._request(sock, ident, c, msg)
        return _Turn.DONE

    def _admit(self, sock: Any, ident: bytes, msg: dict[str, Any]) -> _Turn:
        """A hello (a new client) or the owner's stop, once its credential is right."""
        given = str(msg.get("credential", "")).encode("utf-8", "replace")
        if not hmac.compare_digest(given, token_credential(self.token).encode()):
            self._reply(sock, ident, P.ERROR, error="the output service refused the connection: "
                        "wrong token (read the service's token file)")
            return _Turn.IGNORED
        if msg["kind"] == STOP:
            self.stopped = self._stop(sock, ident)
            return _Turn.STOPPED
        self.clients[ident] = _Client(int(msg.get("pid") or 0), str(msg.get("host") or ""))
        self._reply(sock, ident, P.WELCOME, config=self.cfg.model_dump(mode="json"), pid=os.getpid(),
                    host=self.host, heartbeat=str(self.hb.path) if self.hb is not None else None,
                    timeout_key=self.timeout_key)
        return _Turn.DONE

    def _request(self, sock: Any, ident: bytes, c: _Client, msg: dict[str, Any]) -> None:
        """A known client's sync, discard or bye, answered."""
        kind = msg["kind"]
        if kind == P.SYNC:
            err = None
            try:
                self.out.sync()
            except EnkflowError as exc:
                err = self._route(str(exc), c)
            self._reply(sock, ident, P.SYNCED, seq=msg.get("seq"), error=self._errors(c, err), stats=self.stats())
        elif kind == P.DISCARD:
            self._discard(sock, ident, c, msg)
        elif kind == P.BYE:
            del self.clients[ident]
            self._reply(sock, ident, P.BYE, seq=msg.get("seq"), error=self._errors(c), stats=self.stats())
        else:
            self._reply(sock, ident, P.ERROR, error=f"unknown message kind {kind!r}")

    def _discard(self, sock: Any, ident: bytes, c: _Client, msg: dict[str, Any]) -> None:
        err, dropped, done = None, [], True
        try:
            t = float(msg["time"])
            dropped = self.out.discard(t)
        except (OutputError, StorageError) as exc:
            err = self._route(str(exc), c)  # an earlier failure found now; the discard is done
        except (EnkflowError, KeyError, TypeError, ValueError) as exc:
            err, done = str(exc), False
        if done:
            for k in [k for k in self.seen if k[1] == t]:
                del self.seen[k]
            for f in [f for f in self.failures if _fields_named(f, t)]:
                self.failures.remove(f)
                for name in _fields_named(f, t):
                    self.redo[(name, t)] = f
        self._reply(sock, ident, P.DISCARDED, seq=msg.get("seq"), dropped=dropped, error=self._errors(c, err))

    # -- the end ------------------------------------------------------------------------------

    def _orphaned(self) -> None:
        """The owner is gone: no client is sent here any more, what is complete is written."""
        self._forget_address()
        self.close()
        # Nobody else will remove its temporary directory or its progress page's name (clients that
        # watch the page have it mapped already; no new client comes without the address).
        if self.endpoint.startswith("ipc://"):
            shutil.rmtree(Path(self.endpoint[6:]).parent, ignore_errors=True)
        if self.hb is not None:
            self.hb.unlink()

    def _forget_address(self) -> None:
        """No client is sent here any more: remove the address file, unless a new service (of a
        restarted owner) has written its own there."""
        path = self.dir / "address"
        try:
            if path.read_text().strip() == self.address:
                path.unlink()
        except OSError:
            pass

    def stats(self) -> dict[str, Any]:
        s = self.out.stats()
        s.pop("writers", None)
        s["duplicates_dropped"] = self.duplicates
        return s

    def close(self) -> str | None:
        """Close the Output (everything complete is written); its error, or None."""
        try:
            self.out.close()
        except EnkflowError as exc:
            return str(exc)
        return None

    def _stop(self, sock: Any, ident: bytes) -> dict[str, Any]:
        self._check_clients()
        err = self.close()
        pending = [e for c in self.clients.values() for e in c.errors]
        pending += [f for f in [*self.failures, *self.redo.values()] if f not in pending]
        if pending:
            err = "\n".join(([err] if err else []) + pending)
        reply = {"error": err, "stats": self.stats(), "notes": self.notes}
        self._reply(sock, ident, STOPPED, **reply)
        return reply
