"""A study-wide output service: one :class:`~enkflow.output.Output` (its writer processes) serving
many client processes over ZeroMQ, as an I/O server does for a weather model.

``python -m enkflow.output.service`` reads its start-up spec (JSON) on stdin, starts the
Output's writers, binds a ROUTER socket (``ipc`` by default, ``tcp`` on request), writes the
address atomically to ``DIR/address`` and prints ``READY <address>``. Its owner (the process that
started it: the experiment driver, the online supervisor, a test) uses :class:`OutputService`;
the other processes (analysis tasks, MPI ranks, model runners) use
:class:`~enkflow.output.remote.RemoteOutput`.

Messages (multipart: one UTF-8 JSON frame, never pickle, then for ``add`` one raw frame with the
array's bytes, C order); client -> service, each reply to the same client:

    hello    {credential, pid, host}           reply welcome {config, pid, host}, or error {error}
    add      {seq, field, time, member, region, dtype, shape} + data     no reply
    sync     {seq}                             reply synced {seq, error, stats}: every piece added so
                                               far (by any client) is written
    discard  {seq, time}                       reply discarded {seq, dropped, error}
    bye      {seq}                             reply bye {seq, error, stats}: every add of this client
                                               was received and handed to the writers (not yet written)
    stop     {credential}   (the owner only)   reply stopped {error, stats, notes}; the service exits

``credential`` is the hex SHA-256 of ``"enkflow-output-token" NUL token`` (:func:`enkflow.tokens.credential`).
``dtype`` is ``"<f4"`` or ``"<f8"``; ``region`` ``[[start, stop], ...]`` per dimension or null (the
whole field). Errors of an add (a writer's failure) are kept for the client that made it and
returned by its next sync/discard/bye. A piece identical to one already received (same field, time,
member, region and bytes: an online member run twice) is dropped. Back-pressure: the service reads a client's messages
only as fast as the writers take them (the Output's ``buffer_mb``); ZeroMQ's high-water marks
(``HWM`` messages each side) bound what waits in between, and the client's send then blocks.

The service's own progress is a heartbeat page (:mod:`enkflow.output.heartbeat`; its owner makes
it, the welcome names it) bumped at every turn of its loop: a client or the owner on the same node
that waits for a service without progress for :func:`hang_limit` seconds (stopped, stuck in the
file system) gives up with :class:`~enkflow.output.client.OutputError` naming what the kernel says
the service is doing; the owner kills it. A client on another node watches its connection instead
(:mod:`enkflow.output.connection_watch`).

A client that dies is noticed (same node: its pid) and forgotten; what it added stays, and a
(field, time) it left incomplete is reported by the stop (as :meth:`Output.close` does) unless
another client completes it or discards that time. The service stops on ``stop``, or when its
owner dies (closing the Output: complete files are written, incomplete ones dropped).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from enkflow.errors import EnkflowError, StorageError
from enkflow.fsutil import write_bytes_atomic
from enkflow.jobs.files import log_tail
from enkflow.output import protocol as P
from enkflow.output.client import Output, OutputError
from enkflow.output.config import OutputConfig
from enkflow.output.heartbeat import Heartbeat, Silence, process_state
from enkflow.tokens import credential, secret_file

log = logging.getLogger("enkflow.output.service")

DOMAIN = b"enkflow-output-token"
HWM = 8  # messages queued per client on each side before its send blocks
ADD, STOP, STOPPED = "add", "stop", "stopped"
START_TIMEOUT_S = 60.0
TIMEOUT_KEY = "output.writer_timeout"  # the setting a service's writer timeout comes from, unless told otherwise
_CHECK_S = 0.5
DTYPES = ("<f4", "<f8", ">f4", ">f8")  # the client's byte order, converted here
# Pieces remembered to recognise a rerun's identical piece (most recent first kept): a rerun comes within
# its cycle, long before this many pieces later.
SEEN_PIECES = 1 << 16


def hang_limit(cfg: OutputConfig) -> float | None:
    """Seconds a service may go without progress before a client or its owner gives up on it (None:
    never): ``writer_timeout``, and a margin. The service beats also while it waits for its writers
    (they have their own watch), so only its own main thread stuck counts."""
    return cfg.writer_timeout + 5.0 if cfg.writer_timeout > 0 else None


def hang_message(silence: Silence, limit: float, hb: Heartbeat | None, pid: int, key: str) -> str | None:
    """Why the service (``pid``, progress page ``hb``) counts as hung, or None while it does not;
    ``key``: the setting its writer timeout came from, named in the message."""
    silent = silence.seconds()
    if silent <= limit:
        return None
    doing = hb.activity() if hb is not None else ""
    state = process_state(pid)
    return (f"hung: made no progress for {silent:.0f} s (limit {limit:g} s: {key}, and 5 s)"
            f"{f'; last activity: {doing}' if doing else ''}{f'; the process is {state}' if state else ''}")


def token_credential(token: str) -> str:
    return credential(token, DOMAIN).hex()


def _fields_named(text: str, t: float) -> list[str]:
    """The fields a writer's message names at time ``t`` ("field F time T", T as ``:g`` writes it and
    not the start of a longer number: time 1 is not time 10 or 1.5)."""
    return re.findall(rf"field (\S+) time {re.escape(f'{t:g}')}(?![\w.])", text)


@dataclass
class _Client:
    pid: int
    host: str
    adds: int = 0
    times: set = field(default_factory=set)  # (field, time) this client added to
    errors: list[str] = field(default_factory=list)


class _Service:
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
        self.seen: OrderedDict[tuple, bytes] = OrderedDict()
        self.duplicates = 0
        # Every failure of the writers, also those told to a client: what they lost is lost for the
        # study, whose stop reports them (a run must not end well with a file missing), unless a
        # discard of the time they name lets it be written again.
        self.failures: list[str] = []
        # Failures of a discarded time, per (field, time): forgiven once that field is added again there.
        self.redo: dict[tuple[str, float], str] = {}

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

    def _add(self, c: _Client, msg: dict[str, Any], frames: list[Any]) -> None:
        what = f"add of field {msg.get('field')!r} time {msg.get('time')}"
        if len(frames) != 3:
            c.errors.append(f"{what}: expected one data frame, got {len(frames) - 2}")
            return
        dtype, shape = msg.get("dtype"), msg.get("shape")
        if dtype not in DTYPES or not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            c.errors.append(f"{what}: bad dtype {dtype!r} or shape {shape!r}")
            return
        buf = frames[2].buffer
        if int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize != len(buf):
            c.errors.append(f"{what}: {len(buf)} data bytes do not match dtype {dtype} shape {shape}")
            return
        a = np.frombuffer(buf, dtype=dtype).reshape(shape)
        a = a.astype(a.dtype.newbyteorder("="), copy=False)
        region = msg.get("region")
        reg = tuple(slice(int(s), int(e)) for s, e in region) if region is not None else None
        try:
            key = (str(msg["field"]), float(msg["time"]), msg.get("member"),
                   None if reg is None else tuple((r.start, r.stop) for r in reg))
        except (KeyError, TypeError, ValueError) as exc:
            c.errors.append(f"{what}: {exc}")
            return
        digest = hashlib.blake2b(buf, digest_size=16).digest()
        if self.seen.get(key) == digest:
            self.duplicates += 1
            c.adds += 1
            c.times.add(key[:2])
            return
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
            return
        c.adds += 1
        c.times.add(key[:2])
        self.redo.pop(key[:2], None)
        self.seen[key] = digest
        self.seen.move_to_end(key)
        if len(self.seen) > SEEN_PIECES:
            self.seen.popitem(last=False)

    def serve(self, sock: Any) -> dict[str, Any]:
        """Serve until stopped (returns the stop's reply, sent) or the owner dies."""
        last = time.monotonic()
        while True:
            if self.hb is not None:
                self.hb.beat()
            if sock.poll(int(_CHECK_S * 1000), zmq.POLLIN):
                frames = sock.recv_multipart(copy=False)
                ident = frames[0].bytes
                try:
                    msg = P.decode(frames[1].bytes) if len(frames) >= 2 else None
                except P.ProtocolError as exc:
                    msg = None
                    log.warning("output service: %s", exc)
                if msg is None:
                    continue
                kind = msg["kind"]
                c = self.clients.get(ident)
                if self.hb is not None and kind != ADD:
                    self.hb.doing(f"{kind} of client {c.pid if c else '?'}")
                if kind in (P.HELLO, STOP):
                    given = str(msg.get("credential", "")).encode("utf-8", "replace")
                    if not hmac.compare_digest(given, token_credential(self.token).encode()):
                        self._reply(sock, ident, P.ERROR, error="the output service refused the connection: "
                                    "wrong token (read the service's token file)")
                        continue
                    if kind == STOP:
                        return self._stop(sock, ident)
                    c = self.clients[ident] = _Client(int(msg.get("pid") or 0), str(msg.get("host") or ""))
                    self._reply(sock, ident, P.WELCOME, config=self.cfg.model_dump(mode="json"), pid=os.getpid(),
                                host=self.host, heartbeat=str(self.hb.path) if self.hb is not None else None,
                                timeout_key=self.timeout_key)
                elif c is None:
                    if kind != ADD:  # adds of an unknown client get no reply; its next call learns
                        self._reply(sock, ident, P.ERROR, error="the output service does not know this client "
                                    "(say hello first; the service may have been restarted)")
                elif kind == ADD:
                    self._add(c, msg, frames)
                elif kind == P.SYNC:
                    err = None
                    try:
                        self.out.sync()
                    except EnkflowError as exc:
                        err = self._route(str(exc), c)
                    self._reply(sock, ident, P.SYNCED, seq=msg.get("seq"), error=self._errors(c, err),
                                stats=self._stats())
                elif kind == P.DISCARD:
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
                elif kind == P.BYE:
                    del self.clients[ident]
                    self._reply(sock, ident, P.BYE, seq=msg.get("seq"), error=self._errors(c), stats=self._stats())
                else:
                    self._reply(sock, ident, P.ERROR, error=f"unknown message kind {kind!r}")
            if time.monotonic() - last >= _CHECK_S:
                last = time.monotonic()
                if os.getppid() != self.owner:
                    log.error("output service: its owner (pid %d) is gone; closing", self.owner)
                    self._forget_address()
                    self._close()
                    if self.endpoint.startswith("ipc://"):  # nobody else will remove its temporary directory

                        shutil.rmtree(Path(self.endpoint[6:]).parent, ignore_errors=True)
                    return {}
                self._check_clients()

    def _forget_address(self) -> None:
        """No client is sent here any more: remove the address file, unless a new service (of a
        restarted owner) has written its own there."""
        path = self.dir / "address"
        try:
            if path.read_text().strip() == self.address:
                path.unlink()
        except OSError:
            pass

    def _stats(self) -> dict[str, Any]:
        s = self.out.stats()
        s.pop("writers", None)
        s["duplicates_dropped"] = self.duplicates
        return s

    def _close(self) -> str | None:
        try:
            self.out.close()
        except EnkflowError as exc:
            return str(exc)
        return None

    def _stop(self, sock: Any, ident: bytes) -> dict[str, Any]:
        self._check_clients()
        err = self._close()
        pending = [e for c in self.clients.values() for e in c.errors]
        pending += [f for f in [*self.failures, *self.redo.values()] if f not in pending]
        if pending:
            err = "\n".join(([err] if err else []) + pending)
        reply = {"error": err, "stats": self._stats(), "notes": self.notes}
        self._reply(sock, ident, STOPPED, **reply)
        return reply


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    spec = json.loads(sys.stdin.read())
    try:
        svc = _Service(spec)
    except Exception as exc:
        print(f"enkflow.output.service: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
    try:
        sock.bind(spec["endpoint"])
        address = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        if address.startswith("tcp://0.0.0.0:"):
            address = address.replace("0.0.0.0", socket.getfqdn(), 1)
        svc.address = address
        write_bytes_atomic(Path(spec["dir"]) / "address", (address + "\n").encode())
    except Exception as exc:
        svc._close()
        print(f"enkflow.output.service: cannot bind {spec['endpoint']}: {exc}", file=sys.stderr, flush=True)
        return 2
    print(f"READY {address}", flush=True)
    try:
        reply = svc.serve(sock)
    except BaseException:
        svc._close()
        raise
    finally:
        sock.close()
        ctx.term()
    return 1 if reply.get("error") else 0


class OutputService:
    """The owner's handle on a running service (:meth:`start` it, :meth:`stop` it at the end).

    ``directory``: where the service keeps ``address`` (the endpoint, one line), ``token`` (mode
    0600, made once) and ``service.log``; an ipc socket is in a temporary directory. ``config``: the Output's
    configuration (a relative ``directory`` is relative to ``base_dir``)."""

    def __init__(self, proc: subprocess.Popen, address: str, directory: Path, runtime: Path | None,
                 cfg: OutputConfig, hb: Heartbeat, timeout_key: str = TIMEOUT_KEY) -> None:
        self.proc = proc
        self.cfg = cfg
        self.timeout_key = timeout_key
        self.hb = hb
        self.silence = Silence(hb, proc.pid)
        self.address = address
        self.directory = directory
        self.token_file = directory / "token"
        self.log = directory / "service.log"
        self._runtime = runtime
        self.result: dict[str, Any] | None = None

    @classmethod
    def start(cls, config: OutputConfig | dict[str, Any], directory: str | os.PathLike[str], *, transport: str = "ipc",
              bind: str = "127.0.0.1", base_dir: str | os.PathLike[str] | None = None,
              coords: dict[str, Any] | None = None, timeout: float = START_TIMEOUT_S,
              timeout_key: str = TIMEOUT_KEY) -> "OutputService":
        """Start the service (its writers are ready when this returns); raises OutputError.
        ``timeout_key``: the setting ``config.writer_timeout`` came from, named when the service
        hangs (default ``output.writer_timeout``)."""
        cfg = config if isinstance(config, OutputConfig) else OutputConfig.model_validate(config)
        d = Path(directory).resolve()
        d.mkdir(parents=True, exist_ok=True)
        (d / "address").unlink(missing_ok=True)
        secret_file(d / "token")
        runtime = None
        hb = Heartbeat.create()
        if transport == "tcp":
            endpoint = f"tcp://{bind}:*"
        elif transport == "ipc":
            # Not in the experiment directory: a socket file there would stop it from being copied,
            # and the path could be longer than an ipc address may be.
            runtime = Path(tempfile.mkdtemp(prefix="enkflow-outsvc-"))
            endpoint = f"ipc://{runtime / 'service.sock'}"
        else:
            raise ValueError(f"transport {transport!r}: 'ipc' or 'tcp'")
        spec = {"config": cfg.model_dump(mode="json"), "owner": os.getpid(), "token_file": str(d / "token"),
                "endpoint": endpoint, "dir": str(d), "base_dir": str(base_dir or os.getcwd()), "coords": coords or {},
                "heartbeat": str(hb.path), "timeout_key": timeout_key}
        try:
            with open(d / "service.log", "ab") as err:
                proc = subprocess.Popen([sys.executable, "-m", "enkflow.output.service"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=err)
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(spec).encode())
            proc.stdin.close()

            if not select.select([proc.stdout], [], [], timeout)[0]:
                proc.kill()
                proc.wait()
                raise OutputError(f"the output service did not start within {timeout:g} s; killed:\n"
                                  f"{log_tail(d / 'service.log', 20)}")
            line = proc.stdout.readline().decode().strip()
            proc.stdout.close()
            if not line.startswith("READY "):
                proc.wait(timeout=START_TIMEOUT_S)
                raise OutputError(f"the output service did not start (exit {proc.returncode}):\n"
                                  f"{log_tail(d / 'service.log', 20)}")
        except BaseException:
            if runtime is not None:
                shutil.rmtree(runtime, ignore_errors=True)
            hb.unlink()
            hb.close()
            raise
        return cls(proc, line.split(" ", 1)[1], d, runtime, cfg, hb, timeout_key)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def hung(self) -> str | None:
        """Why the service counts as hung (:func:`hang_limit`), or None."""
        limit = hang_limit(self.cfg)
        return None if limit is None else hang_message(self.silence, limit, self.hb, self.proc.pid, self.timeout_key)

    def stop(self, timeout: float | None = None) -> dict[str, Any]:
        """Close the Output (everything received is written), stop the service; returns its
        figures. Raises OutputError with what went wrong (a writer's error, incomplete output, a
        service without progress for :func:`hang_limit` s, which is killed)."""
        if self.result is not None:
            return self.result
        try:
            if self.proc.poll() is not None:
                raise OutputError(f"the output service (pid {self.proc.pid}) ended early (exit {self.proc.returncode}); "
                                  f"what it had not written is lost:\n{log_tail(self.log, 20)}")
            ctx = zmq.Context()
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                sock.connect(self.address)
                sock.send(P.encode(STOP, credential=token_credential(secret_file(self.token_file))))
                deadline = None if timeout is None else time.monotonic() + timeout
                while not sock.poll(200, zmq.POLLIN):
                    if self.proc.poll() is not None:
                        raise OutputError(f"the output service (pid {self.proc.pid}) died while stopping (exit "
                                          f"{self.proc.returncode}):\n{log_tail(self.log, 20)}")
                    if deadline is not None and time.monotonic() > deadline:
                        self._kill()
                        raise OutputError(f"the output service did not stop within {timeout:g} s; killed")
                    why = self.hung()
                    if why is not None:
                        self._kill()
                        raise OutputError(f"the output service (pid {self.proc.pid}) {why}; killed: what it had "
                                          "not written is lost")
                msg = P.decode(sock.recv())
            finally:
                sock.close()
                ctx.term()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            if msg.get("kind") != STOPPED or msg.get("error"):
                raise OutputError(f"the output service: {msg.get('error') or msg}"
                                  + "".join(f"\n  note: {n}" for n in msg.get("notes", [])))
            self.result = msg
            return msg
        finally:
            self._cleanup()

    def kill(self) -> None:
        """Stop the service at once (after an error): its writers see it go and drop what is
        incomplete; no file is left under its final name half-written."""
        self._kill()
        self._cleanup()

    def _kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _cleanup(self) -> None:
        (self.directory / "address").unlink(missing_ok=True)
        self.hb.unlink()
        if self._runtime is not None:
            shutil.rmtree(self._runtime, ignore_errors=True)
            self._runtime = None


if __name__ == "__main__":
    sys.exit(main())
