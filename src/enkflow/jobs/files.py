"""Small crash-safe file primitives shared by the job scheme.

Every state file is JSON, rewritten atomically (:mod:`enkflow.fsutil`), so
that a reader, or a process started after a ``kill -9``, sees either the old
or the new content, never a mixture.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from enkflow.fsutil import fsync_dir, read_json, write_json_atomic

_HOST = socket.gethostname()

__all__ = ["fingerprint", "fsync_dir", "hostname", "log_tail", "newest", "read_json", "write_json_atomic"]


def hostname() -> str:
    """This machine's host name, as recorded in claims and heartbeats."""
    return _HOST


def fingerprint(path: str | os.PathLike[str]) -> dict[str, int] | None:
    """Identity of a file's current content: inode, size and mtime in ns (None if absent).

    A write in place changes the mtime, a replacement by rename the
    inode. Used to tell whether a restart changed (a model that did nothing;
    restarts advanced by another experiment), never as proof that a forecast
    finished.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def newest(directory: Path, pattern: str) -> Path | None:
    """The most recently modified file of ``directory`` matching ``pattern`` (None: none)."""
    files = sorted(directory.glob(pattern), key=lambda p: p.stat().st_mtime)
    return files[-1] if files else None


def log_tail(path: Path, lines: int, max_bytes: int = 8192) -> str:
    """The last ``lines`` lines of a log (within its last ``max_bytes``), indented, for an error message."""
    text = path.read_bytes()[-max_bytes:].decode(errors="replace").splitlines()[-lines:]
    return "\n".join("    " + t for t in text)
