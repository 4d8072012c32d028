"""An online benchmark's study: its server (``ranks`` ranks) and runners as processes, until the end.

The server (:mod:`enkflow.bench.online_server`) writes its address once it
listens; then ``runners`` runners (:mod:`enkflow.bench.online_runner`) start.
The study is over once the server exits; a runner that asked for work after
the server's grace period is stopped as enkflow's supervisor would. The
records of the server and of every runner are returned together.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from enkflow.errors import EnkflowError, InputError
from enkflow.jobs.files import log_tail
from enkflow.transport import Transport
from enkflow.parallel.program import find_program


def say(msg: str) -> None:
    """Progress, on stderr (stdout has the table and the JSON line)."""
    print(msg, file=sys.stderr, flush=True)


def check_counts(args: argparse.Namespace) -> None:
    """The counts every online benchmark takes must be >= 1."""
    for name in ("ranks", "runners", "members", "cycles"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be >= 1", item=name)


@contextmanager
def scratch(args: argparse.Namespace, prefix: str) -> Iterator[Path]:
    """A new directory for the benchmark's files, under ``--dir`` (default: the system's temporary
    directory), removed at the end unless ``--keep``."""
    base = Path(args.dir) if args.dir else None
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        yield d
    finally:
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)
        else:
            say(f"files kept in {d}")


def child_env() -> dict[str, str]:
    """The environment of the benchmark's processes: this Python first, one thread per BLAS."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(k, "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _mpiexec() -> str:
    exe = find_program("mpiexec")
    if exe is None:
        raise EnkflowError("a server with --ranks > 1 needs mpiexec (pip install mpich)")
    return exe


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return f"{path} ends with:\n" + log_tail(path, lines, 4000)
    except OSError:
        return f"no log {path}"


def online_study(d: Path, *, problem: str, n: int, ranks: int, runners: int, members: int, cycles: int,
                 transport: Transport, nsteps: int = 1, check: bool = False, model: str = "zero", seed: int = 0,
                 timeout_s: float = 1800.0, say: Callable[[str], None] = lambda m: None) -> dict:
    """Run the server (``ranks`` ranks) of ``problem`` over ``cycles`` cycles with ``runners`` runners
    in ``d``, the server and the runners on ``transport``; returns the server's record (``server.json``)
    with the runners' (``runners``)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "token").write_text(secrets.token_hex(16) + "\n")
    env = child_env()
    argv = [sys.executable, "-m", "enkflow.bench.online_server", "--dir", str(d), "--problem", problem, "--n", str(n),
            "--members", str(members), "--cycles", str(cycles), "--nsteps", str(nsteps), "--seed", str(seed),
            "--runners", str(runners), "--transport", transport.value]
    argv += ["--check"] if check else []
    if ranks > 1:
        argv = [_mpiexec(), "-n", str(ranks), *argv]
    deadline = time.monotonic() + timeout_s
    with open(d / "server.log", "wb") as log:
        server = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    procs: list[subprocess.Popen] = []
    try:
        address = _address(d, server, deadline)
        for i in range(runners):
            with open(d / f"runner-{i}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "enkflow.bench.online_runner", "--address", address, "--token-file",
                     str(d / "token"), "--n", str(n), "--model", model, "--out", str(d / f"runner-{i}.json"), "--transport", transport.value]
                    + (["--check"] if check else []), env=env, stdout=log, stderr=subprocess.STDOUT))
        say(f"  server ({ranks} rank(s)) at {address}, {runners} runners started")
        _wait_server(d, server, procs, deadline, timeout_s)
        stopped = _end_runners(d, procs)
    finally:
        for p in [server, *procs]:
            if p.poll() is None:
                p.kill()
                p.wait()
    rec = json.loads((d / "server.json").read_text())
    rec["runners"] = [json.loads((d / f"runner-{i}.json").read_text()) for i in range(runners)]
    rec["runners_terminated"] = stopped
    return rec


def _address(d: Path, server: subprocess.Popen, deadline: float) -> str:
    """The server's address, once it listens."""
    while not (d / "address").exists():
        if server.poll() is not None or time.monotonic() > deadline:
            raise EnkflowError(f"the benchmark server did not start; {_tail(d / 'server.log')}")
        time.sleep(0.02)
    return (d / "address").read_text().strip()


def _wait_server(d: Path, server: subprocess.Popen, runners: list[subprocess.Popen], deadline: float,
                 timeout_s: float) -> None:
    """Until the server ends (it must succeed), or every runner failed, or the time is up."""
    while server.poll() is None:
        if time.monotonic() > deadline:
            raise EnkflowError(f"the benchmark server did not finish within {timeout_s:g} s")
        if runners and all(p.poll() not in (None, 0) for p in runners):
            raise EnkflowError(f"every runner failed; {_tail(d / 'runner-0.log')}")
        time.sleep(0.05)
    if server.returncode != 0:
        raise EnkflowError(f"the benchmark server failed (exit {server.returncode}); {_tail(d / 'server.log')}")


def _end_runners(d: Path, runners: list[subprocess.Popen]) -> int:
    """Wait for the runners to stop (each must succeed); returns how many had to be terminated."""
    stopped = 0
    for i, p in enumerate(runners):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            # Not told STOP (it asked for work after the server's grace period) and waiting for the
            # server to come back: the study is complete, so end it as enkflow's supervisor does.
            p.terminate()
            p.wait(timeout=30)
            stopped += 1
            continue
        if p.returncode != 0:
            raise EnkflowError(f"runner {i} failed (exit {p.returncode}); {_tail(d / f'runner-{i}.log')}")
    return stopped
