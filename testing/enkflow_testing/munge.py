"""munge, SLURM's authentication daemon: a key, a daemon and a check that it answers.

Shared by the one-node local SLURM (the machine's own munged, default socket)
and the emulated cluster (a private munged inside its head node, with its own
key and socket under the cluster's state folder).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from enkflow.errors import EnkflowError

USER = "munge"


def munge_ok(socket: Path | None = None, enter: Sequence[str] = ()) -> bool:
    """Whether a munge daemon answers (``munge -n | unmunge``), on ``socket`` or the default one.

    ``enter``: a command prefix that runs the check elsewhere (in an emulated node).
    """
    opt = [f"--socket={socket}"] if socket else []
    try:
        enc = subprocess.run([*enter, "munge", "-n", *opt], capture_output=True, timeout=10)
        if enc.returncode != 0:
            return False
        dec = subprocess.run([*enter, "unmunge", *opt], input=enc.stdout, capture_output=True, timeout=10)
        return dec.returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


def own(paths: Sequence[Path | str]) -> None:
    """Make folders owned by the munge user (munged refuses ones others may write)."""
    for p in paths:
        Path(p).mkdir(parents=True, exist_ok=True)
        shutil.chown(p, USER, USER)


def install_key(key: Path) -> None:
    """A 1024-byte random key readable by the munge user only (kept if it exists)."""
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    shutil.chown(key, USER, USER)
    key.chmod(0o400)


def start_munged(options: Sequence[str] = (), socket: Path | None = None, enter: Sequence[str] = (),
                 log: Path | None = None, timeout_s: float = 5.0) -> subprocess.Popen:
    """Start ``munged`` in the foreground as the munge user and wait until it answers on ``socket``.

    ``log``: where its stderr goes (discarded if None).
    """
    sock = [f"--socket={socket}"] if socket else []
    with open(log or os.devnull, "wb") as err:
        proc = subprocess.Popen([*enter, "runuser", "-u", USER, "--", "munged", "--foreground", *sock, *options],
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if munge_ok(socket, enter):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    said = log.read_text(errors="replace").strip()[-500:] if log else ""
    raise EnkflowError(f"munged did not start within {timeout_s:.0f} s (checked with 'munge -n | unmunge') {said}")
