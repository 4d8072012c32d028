"""One writer process as a sender sees it (:class:`WriterProcess`): started, watched, killed, reported.

Rank 0 of the senders starts the writers (``python -m enkflow.output.writer``, its settings as JSON
on stdin) and waits for each to print ``READY <endpoint>``; it tells the other ranks where they
listen (:class:`WriterAddress`). Every sender watches the writer it sends to with what it can see:
the process itself (rank 0, its parent), its pid and progress page (another rank on the node,
:mod:`enkflow.output.heartbeat`), or only the connection (another node,
:mod:`enkflow.output.connection_watch`). A writer without progress is killed before its temporary
files are removed, so that it can never rename one of them later.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from enkflow.errors import EnkflowError
from enkflow.jobs.files import log_tail
from enkflow.netaddr import advertised
from enkflow.output.config import OutputConfig
from enkflow.output.connection_watch import ConnectionWatch
from enkflow.output.heartbeat import Heartbeat, Silence, process_state

START_TIMEOUT_S = 60.0


class OutputError(EnkflowError):
    """The output server failed: a writer died or could not write (the message says which and what was lost)."""


@dataclass(frozen=True)
class WriterAddress:
    """A started writer as rank 0 tells the other senders: where it listens (``endpoint``), its
    ``pid`` on node ``host``, the path of its progress page (``heartbeat``) and, over TCP, its CURVE
    public key (Z85; told only to the senders, so a process without it cannot connect)."""

    endpoint: str
    pid: int
    host: str
    heartbeat: str
    curve_key: str = ""


class WriterProcess:
    """Writer ``index`` (of ``fields``) as this sender sees it.

    ``proc``/``log``: the process and its stderr file where this sender started it (rank 0);
    ``pid`` 0 where the process cannot be seen (another node: ``watch`` is its connection);
    ``hb``: its progress page where it can be mapped here (``own_page``: made here, removed at the end).
    """

    def __init__(self, index: int, fields: list[str], pid: int, *, proc: subprocess.Popen[bytes] | None = None,
                 log: Path | None = None, hb: Heartbeat | None = None, own_page: bool = False,
                 watch: ConnectionWatch | None = None, curve_key: str = "") -> None:
        self.index = index
        self.curve_key = curve_key  # the public key of the writer started here (TCP)
        self.fields = fields
        self.pid = pid
        self.proc = proc
        self.log = log
        self.hb = hb
        self.own_page = own_page
        self.watch = watch
        self.silence = Silence(hb, pid)

    # -- starting ----------------------------------------------------------------------------

    @classmethod
    def start(cls, cfg: OutputConfig, index: int, fields: list[str], directory: Path, coords: dict[str, list[float]],
              endpoint: str, log: Path) -> "WriterProcess":
        """Start writer ``index`` (it binds ``endpoint``, writes into ``directory``, its stderr goes to
        ``log``); :meth:`wait_ready` waits for it. Over TCP the writer is a CURVE server with a key
        pair made here: its secret key goes on its stdin, its public key only to the senders."""
        hb = Heartbeat.create()
        spec = {"config": cfg.model_dump(mode="json"), "index": index, "directory": str(directory), "fields": fields,
                "coords": coords, "endpoint": endpoint, "heartbeat": str(hb.path)}
        public = ""
        if endpoint.startswith("tcp://"):
            pub, secret = zmq.curve_keypair()
            public, spec["curve_secret_key"] = pub.decode(), secret.decode()
        try:
            with open(log, "wb") as err:
                proc = subprocess.Popen([sys.executable, "-m", "enkflow.output.writer"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=err)
        except BaseException:
            hb.unlink()
            hb.close()
            raise
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
        return cls(index, fields, proc.pid, proc=proc, log=log, hb=hb, own_page=True, curve_key=public)

    def wait_ready(self, limit: float | None) -> WriterAddress:
        """Where the started writer listens, once it says so; raises OutputError when it fails to
        start, or is not ready within ``limit`` seconds (None: no limit; then it is killed)."""
        proc, logf = self.proc, self.log
        assert proc is not None and proc.stdout is not None and logf is not None and self.hb is not None
        if not select.select([proc.stdout], [], [], limit)[0]:
            state = process_state(proc.pid)
            proc.kill()
            proc.wait()
            raise OutputError(f"output writer {self.index} (pid {proc.pid}) did not start within {limit:g} s"
                              f"{f' (it was {state})' if state else ''}; it was killed:\n{log_tail(logf, 20)}")
        line = proc.stdout.readline().decode().strip()  # READY <endpoint>, or EOF when it failed
        proc.stdout.close()  # the writer prints nothing more
        if not line.startswith("READY "):
            proc.wait(timeout=START_TIMEOUT_S)
            raise OutputError(f"output writer {self.index} did not start (exit {proc.returncode}):\n"
                              f"{log_tail(logf, 20)}")
        endpoint = advertised(line.split(" ", 1)[1])  # bound on every interface: others reach this node's address
        return WriterAddress(endpoint, proc.pid, socket.gethostname(), str(self.hb.path), self.curve_key)

    @classmethod
    def neighbour(cls, index: int, fields: list[str], address: WriterAddress) -> "WriterProcess":
        """The writer at ``address`` seen from another process on its node: its pid and progress page."""
        return cls(index, fields, address.pid, hb=Heartbeat(address.heartbeat))

    @classmethod
    def across_nodes(cls, index: int, fields: list[str], address: WriterAddress, sock: Any,
                     timeout: float) -> "WriterProcess":
        """The writer at ``address`` seen from another node: only the connection of ``sock``, watched
        before it connects (pings unanswered for ``timeout`` s close it)."""
        return cls(index, fields, 0, watch=ConnectionWatch(sock, address.endpoint, timeout))

    # -- watching ----------------------------------------------------------------------------

    @property
    def who(self) -> str:
        """The writer as messages name it: its pid, or its address where this sender cannot see the
        process (another node)."""
        where = f"pid {self.pid}" if self.pid else f"at {self.watch.address}" if self.watch is not None else "pid unknown"
        return f"output writer {self.index} ({where}, fields {', '.join(self.fields)})"

    def dead(self) -> str | None:
        """Why the writer is gone, or None while it lives."""
        if self.proc is not None:
            rc = self.proc.poll()
            if rc is None:
                return None
            return f"killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
        if self.pid:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return "gone"
            except PermissionError:
                pass
        return self.watch.lost() if self.watch is not None else None

    def silent_beyond(self, limit: float) -> float | None:
        """The seconds the writer has made no progress, when more than ``limit`` (<= 0: never);
        None otherwise, or where its progress cannot be seen from here."""
        if limit <= 0 or not self.silence.observable():
            return None
        silent = self.silence.seconds()
        return silent if silent > limit else None

    # -- killing and reporting ---------------------------------------------------------------

    def kill_hung(self, silent: float, limit: float, oldest: str) -> str:
        """Kill the writer silent for ``silent`` s (``limit``: output.writer_timeout); why it is lost,
        with what it was doing (``oldest``: the oldest piece it has not written, or '')."""
        doing = self.hb.activity() if self.hb is not None else ""
        if oldest:
            doing += f"{'; ' if doing else ''}{oldest}"
        state = process_state(self.pid) if self.pid else ""
        killed = self.kill()
        return (f"made no progress for {silent:.1f} s (output.writer_timeout = {limit:g} s)"
                f"{f' (last activity: {doing})' if doing else ''}{f'; the process was {state}' if state else ''}; "
                f"{killed}")

    def kill(self) -> str:
        """SIGKILL the writer (SIGKILL also ends a stopped process); what came of it, for the message."""
        try:
            if self.proc is not None:
                self.proc.kill()
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    return "it was sent SIGKILL and has not ended yet (stuck in the kernel?)"
            elif self.pid:
                os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            return "it has ended"
        except PermissionError:
            return "it could not be killed from here"
        return "it was killed"

    def lost_report(self, why: str, pieces: int, nbytes: int, removed: int) -> str:
        """The message of a lost writer: ``why``, the ``pieces`` (``nbytes``) it had not written, the
        temporary files ``removed``, and the end of its log where this sender has it."""
        log = self.log
        tail = f"\n{log_tail(log, 10)}" if log is not None and log.exists() and log.stat().st_size else ""
        return (f"{self.who} {why}: {pieces} piece(s) "
                f"({nbytes} bytes) in flight were not written, nor the files it had open"
                f"{f' ({removed} temporary file(s) removed)' if removed else ''}; "
                f"later output of these fields is lost" + tail)

    def remove_temporaries(self, directory: Path) -> int:
        """The temporary files the writer left in ``directory`` (atomic_output's ``.NAME.PID.tmp``),
        removed: never under a final name. Their count."""
        if not self.pid or not directory.is_dir():
            return 0
        n = 0
        for p in directory.rglob(f".*.{self.pid}.tmp"):
            p.unlink(missing_ok=True)
            n += 1
        return n

    # -- the end -----------------------------------------------------------------------------

    def wait_finished(self) -> None:
        """After its ``finished``: wait for the process started here to exit (killed after 30 s)."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def end(self, directory: Path) -> None:
        """Kill the process started here if it still runs (a failed start, an Output never closed):
        its temporary files in ``directory`` go with it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            self.remove_temporaries(directory)

    def close_view(self) -> None:
        """Stop watching (before the sender's socket closes); unmap a page opened here."""
        if self.watch is not None:
            self.watch.close()
        if self.hb is not None and not self.own_page:
            self.hb.close()

    def unlink_page(self) -> None:
        """Remove the name of the progress page made here."""
        if self.hb is not None and self.own_page:
            self.hb.unlink()

    def release_page(self) -> None:
        """Remove and unmap the progress page made here."""
        if self.hb is not None and self.own_page:
            self.hb.unlink()
            self.hb.close()
