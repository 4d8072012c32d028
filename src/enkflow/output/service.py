"""A study-wide output service: one :class:`~enkflow.output.Output` (its writer processes) serving
many client processes over ZeroMQ, as an I/O server does for a weather model.

``python -m enkflow.output.service`` reads its start-up spec (JSON) on stdin, starts the
Output's writers, binds a ROUTER socket (``ipc`` by default, ``tcp`` on request), writes the
address atomically to ``DIR/address`` and prints ``READY <address>``. Its owner (the process that
started it: the experiment driver, the online supervisor, a test) uses :class:`OutputService`;
the other processes (analysis tasks, MPI ranks, model runners) use
:class:`~enkflow.output.remote.RemoteOutput`.

Its messages are :mod:`enkflow.output.service_protocol`'s; its loop (clients, requests, the
Output they share) is :class:`~enkflow.output.service_loop.ServiceLoop`.

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

import json
import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from enkflow.errors import BindError
from enkflow.fsutil import write_bytes_atomic
from enkflow.jobs.files import log_tail
from enkflow.netaddr import advertised
from enkflow.output import protocol as P
from enkflow.output.config import OutputConfig
from enkflow.output.heartbeat import Heartbeat, Silence, process_state
from enkflow.output.service_loop import ServiceLoop
from enkflow.output.service_protocol import HWM, STOP, STOPPED, TIMEOUT_KEY, token_credential
from enkflow.output.writer_process import OutputError
from enkflow.tokens import secret_file

START_TIMEOUT_S = 60.0


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


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    spec = json.loads(sys.stdin.read())
    try:
        svc = ServiceLoop(spec)
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
        address = advertised(sock.getsockopt(zmq.LAST_ENDPOINT).decode())  # a wildcard: this node's address
        svc.address = address
        write_bytes_atomic(Path(spec["dir"]) / "address", (address + "\n").encode())
    except Exception as exc:
        svc.close()
        if isinstance(exc, zmq.ZMQError):
            # The directory is the study's (EXPDIR/output_service): the error names the experiment.
            exc = BindError.from_errno(exc.errno, exc.strerror, address=spec["endpoint"],
                                       key="the service's transport").of_experiment(str(Path(spec["dir"]).parent))
        print(f"enkflow.output.service: cannot bind {spec['endpoint']}: {exc}", file=sys.stderr, flush=True)
        return 2
    print(f"READY {address}", flush=True)
    try:
        reply = svc.serve(sock)
    except BaseException:
        svc.close()
        raise
    finally:
        sock.close()
        ctx.term()
    return 1 if reply.get("error") else 0


def _spawn(spec: dict[str, Any], log: Path, timeout: float) -> tuple[subprocess.Popen[bytes], str]:
    """Start the service's process with ``spec`` (stderr to ``log``); it and its address, once ready
    (within ``timeout`` s, else killed). Raises OutputError."""
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "enkflow.output.service"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(spec).encode())
    proc.stdin.close()

    if not select.select([proc.stdout], [], [], timeout)[0]:
        proc.kill()
        proc.wait()
        raise OutputError(f"the output service did not start within {timeout:g} s; killed:\n"
                          f"{log_tail(log, 20)}")
    line = proc.stdout.readline().decode().strip()
    proc.stdout.close()
    if not line.startswith("READY "):
        proc.wait(timeout=START_TIMEOUT_S)
        raise OutputError(f"the output service did not start (exit {proc.returncode}):\n"
                          f"{log_tail(log, 20)}")
    return proc, line.split(" ", 1)[1]


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
            proc, address = _spawn(spec, d / "service.log", timeout)
        except BaseException:
            if runtime is not None:
                shutil.rmtree(runtime, ignore_errors=True)
            hb.unlink()
            hb.close()
            raise
        return cls(proc, address, d, runtime, cfg, hb, timeout_key)

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
            msg = self._ask_to_stop(timeout)
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

    def _ask_to_stop(self, timeout: float | None) -> dict[str, Any]:
        """Send the stop and wait for its reply, as long as the service lives and makes progress."""
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
            return P.decode(sock.recv())
        finally:
            sock.close()
            ctx.term()

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
