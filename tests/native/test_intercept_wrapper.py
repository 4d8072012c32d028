"""The interception wrapper (enkflow.online.intercept) against a scripted server: what it does with the
model's processes. A model started through a shell script that leaves a process behind (killed at the
wrapper's --timeout, or exited) must not leave anything running that still maps the segment: it would
write into the next member's state."""

from __future__ import annotations

import time
from pathlib import Path

from enkflow.online import Runner
from enkflow.online.fields import Field
from enkflow.online.intercept import InterceptRunner

from scripted_server import ScriptedServer

TOKEN = "wrapper"


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "zombie" not in status


def _gone_soon(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_a_model_killed_at_the_timeout_takes_its_children_along(native_build, tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    model = tmp_path / "model.sh"
    model.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {marker}\nwait\n")
    model.chmod(0o755)
    server = ScriptedServer(TOKEN, [(1, 2, 1)], ranks=1)
    try:
        runner = Runner(server.address, TOKEN, reconnect_s=5, timeout_s=20)
        loop = InterceptRunner(runner, [Field("x", "float64", (40,))], [str(model)],
                               native_build.lib / "libenkflow_intercept.so", lambda m: tmp_path / f"r{m}.nc",
                               timeout_s=1.0)
        try:
            assert loop.run() == 0
        finally:
            runner.close()
    finally:
        server.close()
    assert len(server.fails) == 1 and "ran longer than 1 s (--timeout)" in server.fails[0], server.fails
    child = int(marker.read_text())
    assert _gone_soon(child), f"the model's child {child} outlived the model killed at the timeout"


def test_a_model_that_exits_leaves_nothing_running(native_build, tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    model = tmp_path / "model.sh"
    model.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {marker}\nexit 0\n")
    model.chmod(0o755)
    server = ScriptedServer(TOKEN, [(1, 2, 1)], ranks=1)
    try:
        runner = Runner(server.address, TOKEN, reconnect_s=5, timeout_s=20)
        loop = InterceptRunner(runner, [Field("x", "float64", (40,))], [str(model)],
                               native_build.lib / "libenkflow_intercept.so", lambda m: tmp_path / f"r{m}.nc")
        try:
            assert loop.run() == 0
        finally:
            runner.close()
    finally:
        server.close()
    assert len(server.fails) == 1 and "never opened" in server.fails[0], server.fails
    child = int(marker.read_text())
    assert _gone_soon(child), f"the model's child {child} outlived the model"


def test_a_runner_killed_hard_takes_the_model_behind_a_shell_script_along(native_build, tmp_path: Path) -> None:
    """kill -9 of the wrapper while its model, started by a shell script, runs: the shell dies with the wrapper
    (the shim's parent-death signal) and the model with the shell, each tied to its own parent."""
    import signal
    import subprocess
    import sys

    marker = tmp_path / "child.pid"
    model = tmp_path / "model.sh"
    model.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {marker}\nwait\n")
    model.chmod(0o755)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    server = ScriptedServer(TOKEN, [(1, 2, 1)], ranks=1, hold=True)
    try:
        wrapper = subprocess.Popen([sys.executable, "-m", "enkflow.online.intercept", "--address", server.address,
                                    "--token-file", str(token), "--field", "x:float64:40", "--path",
                                    str(tmp_path / "r{member}.nc"), "--shim",
                                    str(native_build.lib / "libenkflow_intercept.so"), "--", str(model)])
        deadline = time.monotonic() + 30
        while not (marker.exists() and marker.read_text().strip()):
            assert wrapper.poll() is None and time.monotonic() < deadline, "the model did not start"
            time.sleep(0.05)
        child = int(marker.read_text())
        time.sleep(0.2)  # the child's shim constructor has run
        wrapper.send_signal(signal.SIGKILL)
        wrapper.wait()
    finally:
        server.close()
    assert _gone_soon(child), f"the model {child} outlived its runner, killed with kill -9"
