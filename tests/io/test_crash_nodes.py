"""A committed update killed on one node is finished exactly once by a rerun on another node.

Shadow files (the default method) live beside the member files, as the default log does.
The rerun runs in a mount namespace with its own empty ``/dev/shm`` (as another node, which does
not see the first node's memory). With the default log place (beside the member files, on the
file system every node sees) it completes the update; with ``log_dir = "/dev/shm"`` (the explicit
one-node choice) it refuses naming the log, and the files stay as the kill left them until a
rerun on the first node.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from io_helpers import netcdf4_X

from enkflow.io.generate import make_ensemble
from enkflow.state import StateLayout

CHILD = Path(__file__).with_name("crash_child.py")
OTHER_NODE = ("unshare", "--mount", "--propagation", "private", "sh", "-c",
              'mount -t tmpfs -o size=256m enkflow-test-node /dev/shm && exec "$@"', "other-node")


def _other_node_works() -> str | None:
    """Why a private /dev/shm cannot be made here (None: it can)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "a mount namespace with its own /dev/shm needs root and unshare"
    r = subprocess.run([*OTHER_NODE, "true"], capture_output=True, text=True)
    return None if r.returncode == 0 else f"unshare --mount failed: {r.stderr.strip()}"


def _child(d: Path, log_dir: str, env: dict[str, str], *extra: str, where: tuple[str, ...] = (),
           method: str = "log") -> subprocess.Popen[str]:
    return subprocess.Popen([*where, sys.executable, str(CHILD), str(d), log_dir, method, *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _kill_after_commit(d: Path, log_dir: str, env: dict[str, str], method: str) -> None:
    p = _child(d, log_dir, env, "pause", method=method)
    assert p.stdout is not None and p.stderr is not None
    try:
        for line in p.stdout:
            if line.startswith("committed"):
                break
        else:
            raise AssertionError(f"the child ended before its commit: {p.stderr.read()}")
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    assert list(d.glob(".enkflow-update-*.json")), "no commit marker after the kill"


@pytest.fixture
def ensembles(tmp_path: Path, subprocess_env) -> tuple[Path, dict[str, bytes]]:
    """Pristine member files (with the old state saved) and the fault-free update's bytes."""
    pristine = tmp_path / "pristine"
    paths, _ = make_ensemble(pristine, 4, 1.0, fmt="nc4", dtypes=("f8", "f4"))
    np.save(pristine / "old.npy", netcdf4_X(paths, StateLayout.from_file(paths[0], ["var0", "var1"])))
    ok = tmp_path / "ok"
    shutil.copytree(pristine, ok)
    p = _child(ok, "default", subprocess_env)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return pristine, {f.name: f.read_bytes() for f in ok.glob("member_*.nc")}


def _killed_copy(tmp_path: Path, pristine: Path, log_dir: str, env: dict[str, str], method: str = "log") -> Path:
    """A copy of the pristine members whose update was killed after its commit (skips without
    a second node)."""
    why = _other_node_works()
    if why:
        pytest.skip(why)
    d = tmp_path / "killed"
    shutil.copytree(pristine, d)
    _kill_after_commit(d, log_dir, env, method)
    return d


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["log", "shadow"])
def test_the_default_update_survives_a_rerun_on_another_node(tmp_path, subprocess_env, ensembles, method):
    """The default log, and the shadow files, are beside the member files: another node finishes the update."""
    pristine, expected = ensembles
    d = _killed_copy(tmp_path, pristine, "default", subprocess_env, method)
    if method == "log":
        assert list((d / ".enkflow-wal").glob("*.log")), "the default log is not beside the member files"
    else:
        assert len(list(d.glob(".member_*.enkflow-new-*"))) == 4, "the shadows are not beside the member files"

    q = _child(d, "default", subprocess_env, where=OTHER_NODE, method=method)
    out, err = q.communicate(timeout=120)
    assert q.returncode == 0, err
    assert out.split("state")[1].split()[0] == "new", "the committed update was not finished on the other node"
    assert {f.name: f.read_bytes() for f in d.glob("member_*.nc")} == expected
    assert not list(d.glob(".enkflow-update-*")) and not list((d / ".enkflow-wal").glob("*.log"))
    assert not list(d.glob(".member_*")), "a shadow or spare left behind"


@pytest.mark.timeout(300)
def test_a_log_in_dev_shm_is_refused_on_another_node(tmp_path, subprocess_env, ensembles):
    pristine, expected = ensembles
    d = _killed_copy(tmp_path, pristine, "/dev/shm", subprocess_env)
    try:
        q = _child(d, "/dev/shm", subprocess_env, where=OTHER_NODE)
        _, err = q.communicate(timeout=120)
        assert q.returncode != 0 and "RecoveryError" in err and "/dev/shm/" in err, err
    finally:
        home = _child(d, "/dev/shm", subprocess_env)  # on this node: finishes it, and removes the log
        out, err = home.communicate(timeout=120)
    assert home.returncode == 0, err
    assert out.split("state")[1].split()[0] == "new"
    assert {f.name: f.read_bytes() for f in d.glob("member_*.nc")} == expected
