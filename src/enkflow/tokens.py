"""Shared secrets of an experiment's services (the online server, the output service).

A token is made once per experiment (a file readable by its owner only, mode 0600); every
message to a service carries a credential derived from it, never the token itself.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path


def secret_file(path: str | os.PathLike[str], make=None) -> str:
    """The secret in ``path``, created (mode 0600, atomically) on first use by ``make()`` (default: 64 hex digits)."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write((make() if make is not None else secrets.token_hex(32)) + "\n")
        os.replace(tmp, path)
    return path.read_text().strip()


def credential(token: str | bytes, domain: bytes) -> bytes:
    """The 32-byte credential of ``token`` for the service ``domain``: SHA-256 of both."""
    raw = token.encode() if isinstance(token, str) else bytes(token)
    return hashlib.sha256(domain + b"\0" + raw).digest()
