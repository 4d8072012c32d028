"""Typed errors. Each names the file, variable, member, key or rank at fault.

Every enkflow error derives from :class:`EnkflowError`, so a caller can catch
them all; the subclasses say which part of the input was wrong.
"""

from __future__ import annotations


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


class RecoveryError(FileFormatError):
    """An interrupted in-place update cannot be finished (log unreachable or damaged)."""
