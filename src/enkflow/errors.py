"""Typed errors. Each names the file, variable, member, key or rank at fault.

Every enkflow error derives from :class:`EnkflowError`, so a caller can catch
them all; the subclasses say which part of the input was wrong.
"""

from __future__ import annotations

import errno

# Exit status of a program that met a deterministic error (bad input or configuration): a retry
# would fail the same way, so the job scheme stops the experiment at once (EX_DATAERR, sysexits.h).
DETERMINISTIC_ERROR_RC = 65


class EnkflowError(Exception):
    """Base class of every error enkflow raises on purpose."""


class ConfigError(EnkflowError, ValueError):
    """A configuration key is unknown, ill-typed or out of range.

    ``key`` is the dotted path of the offending key (``analysis.radius``).
    """

    def __init__(self, message: str, *, key: str | None = None, file: str | None = None):
        self.key = key
        self.file = file
        where = []
        if file:
            where.append(f"file {file}")
        if key:
            where.append(f"key '{key}'")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)


class BindError(EnkflowError):
    """A socket cannot listen on ``address``: names it, the experiment (when known) and what to do.

    A process of an earlier run still holding the address is the usual cause; a rerun of
    ``enkflow run`` stops such processes first (docs/online.md), so this error means another
    program holds it, or the address is not one of this host's.
    """

    def __init__(self, reason: str, *, address: str, experiment: str | None = None, remedy: str = ""):
        self.reason, self.address, self.experiment, self.remedy = reason, address, experiment, remedy
        of = f" for experiment {experiment}" if experiment else ""
        super().__init__(f"cannot listen on {address}{of}: {reason}" + (f"; {remedy}" if remedy else ""))

    @classmethod
    def from_errno(cls, code: int, reason: str, *, address: str, key: str) -> "BindError":
        """The error for a failed bind with errno ``code``; ``key`` is the setting that chose the address."""
        if code == errno.EADDRINUSE:
            remedy = (f"another process listens there (a server of this experiment that an earlier `enkflow run` "
                      f"left running: rerun `enkflow run`, which stops it; or another program): stop it, or "
                      f"choose another address ({key}; port 0 takes any free one)")
        elif code == errno.EADDRNOTAVAIL:
            remedy = f"this host has no such interface: set {key} to one of its addresses"
        else:
            remedy = f"check {key}"
        return cls(reason, address=address, remedy=remedy)

    def of_experiment(self, experiment: str) -> "BindError":
        """The same error, naming the experiment directory ``experiment``."""
        return BindError(self.reason, address=self.address, experiment=experiment, remedy=self.remedy)


class InputError(EnkflowError, ValueError):
    """Bad numerical input: NaN/Inf, wrong shape, non-positive error variance...

    ``item`` names the array or parameter (``ensemble``, ``obs.error_var``), and
    ``index`` the first offending element where there is one.
    """

    def __init__(self, message: str, *, item: str, index: object = None):
        self.item = item
        self.index = index
        super().__init__(message)


class FileFormatError(EnkflowError):
    """A file cannot be read as expected; names the file and the variable."""

    def __init__(self, message: str, *, path: str, variable: str | None = None):
        self.path = str(path)
        self.variable = variable
        self._message = message
        where = f"{self.path}" + (f", variable '{variable}'" if variable else "")
        super().__init__(f"{where}: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only fields: rebuild from them so the error survives pickling (MPI bcast).
        return (_rebuild_file_error, (type(self), self._message, self.path, self.variable))


def _rebuild_file_error(cls: type, message: str, path: str, variable: str | None) -> "FileFormatError":
    return cls(message, path=path, variable=variable)


class StructureMismatchError(FileFormatError):
    """Ensemble member files that should share one structure do not."""


class MemberError(EnkflowError):
    """A member's model run failed; names the member and what it printed."""

    def __init__(self, message: str, *, member: int, cycle: int | None = None):
        self.member = member
        self.cycle = cycle
        where = f"member {member}" + (f", cycle {cycle}" if cycle is not None else "")
        super().__init__(f"{where}: {message}")


class RankError(EnkflowError):
    """Something failed on one MPI rank; names the rank."""

    def __init__(self, message: str, *, rank: int):
        self.rank = rank
        super().__init__(f"rank {rank}: {message}")


class StorageError(EnkflowError):
    """Writing a file failed (disk full, quota, read-only or vanished file system).

    ``path`` is the file; the message says what to do next. The file's old
    content is left in place, so a rerun after the cause is fixed resumes.
    """

    def __init__(self, message: str, *, path: str):
        self.path = str(path)
        self._message = message
        super().__init__(f"{self.path}: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_storage_error, (self._message, self.path))

    @classmethod
    def from_os_error(cls, exc: OSError, *, path: str) -> "StorageError":
        """The typed error for a failed write of ``path``, with advice for the usual causes."""
        advice = {
            errno.ENOSPC: "no space left on the device; free space there and rerun the same command to resume",
            errno.EDQUOT: "disk quota exceeded; free space or raise the quota, then rerun the same command to resume",
            errno.EROFS: "the file system is read-only; make it writable, then rerun the same command to resume",
            errno.EACCES: "permission denied; fix the permissions, then rerun the same command to resume",
            errno.EIO: "I/O error from the storage; check the file system, then rerun the same command to resume",
        }.get(exc.errno or 0, f"{exc.strerror or exc}; fix the cause, then rerun the same command to resume")
        return cls(f"cannot write: {advice}", path=path)


def _rebuild_storage_error(message: str, path: str) -> "StorageError":
    return StorageError(message, path=path)


class RecoveryError(FileFormatError):
    """An interrupted in-place update cannot be finished (log unreachable or damaged)."""
