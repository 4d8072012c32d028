"""One driver per experiment directory.

``enkflow run`` holds an exclusive POSIX record lock (``fcntl.lockf``) on
``EXPDIR/driver.lock`` for its whole run. POSIX locks are what NFS (NLM, or
NFSv4's own locking) and Lustre (mounted with ``flock`` or ``localflock``)
implement across clients, unlike ``flock(2)`` on older NFS clients; the
kernel (or the lock server) releases the lock when the holder dies, so a
killed driver never leaves a stale lock behind. The lock file also holds the
holder's host, PID and start time, so a refused driver can name it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from enkflow.errors import EnkflowError, StorageError


class ExperimentBusyError(EnkflowError):
    """Another driver runs on the same experiment directory; names it."""


class DriverLock:
    """The exclusive lock on the lock file ``path`` of an experiment directory
    (:attr:`ExperimentDir.lock <enkflow.experiment.directory.ExperimentDir.lock>`); use as a context manager."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self) -> "DriverLock":
        """Take the lock, or raise :class:`ExperimentBusyError` naming the holder."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageError.from_os_error(exc, path=str(self.path)) from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise StorageError(f"cannot lock: {exc.strerror} (does this file system support POSIX locks? "
                                   "on Lustre mount with -o flock)", path=str(self.path)) from None
            raise ExperimentBusyError(self._busy_message()) from None
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise StorageError.from_os_error(exc, path=str(self.path)) from None
        self.fd = fd
        return self

    def _busy_message(self) -> str:
        try:
            holder = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            holder = {}
        since = holder.get("since")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?"
        return (f"experiment directory {self.path.parent} is in use by another enkflow run "
                f"(host {holder.get('host', '?')}, PID {holder.get('pid', '?')}, since {when}); "
                "wait for it to end or stop it, then rerun")

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the lock
            self.fd = None

    def __enter__(self) -> "DriverLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
