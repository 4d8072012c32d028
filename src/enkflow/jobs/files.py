"""Small crash-safe file primitives shared by the job scheme.

Every state file is JSON, rewritten atomically (write a temporary sibling,
fsync, rename over the old one, fsync the directory) so that a reader, or a
process started after a ``kill -9``, sees either the old or the new content,
never a mixture.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

_HOST = socket.gethostname()


def hostname() -> str:
    """This machine's host name, as recorded in claims and heartbeats."""
    return _HOST


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename inside directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, durable: bool = True) -> None:
    """Replace ``path`` with the JSON of ``data`` atomically.

    ``durable=False`` skips the fsyncs: for files (heartbeats) whose loss in a
    power cut is harmless, where the rename alone gives atomicity.
    """
    p = Path(path)
    # pid and thread id make the temporary name unique among concurrent writers.
    tmp = p.with_name(f".{p.name}.tmp.{os.getpid()}.{threading.get_ident()}")
    payload = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, payload)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, p)
    if durable:
        fsync_dir(p.parent)


def read_json(path: str | os.PathLike[str], default: Any = None) -> Any:
    """The JSON content of ``path``, or ``default`` when the file does not exist."""
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except FileNotFoundError:
        return default


def fingerprint(path: str | os.PathLike[str]) -> dict[str, int] | None:
    """Identity of a file's current content: inode, size and mtime in ns (None if absent).

    A model that replaces its restart by rename changes the inode; one that
    rewrites it in place changes the mtime. Either way the fingerprint taken
    before the forecast no longer matches once the forecast has written.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
