"""Errors that reach every rank: a check one rank makes on its share of the input must not leave the
others waiting in the next collective call."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from enkflow.errors import EnkflowError
from enkflow.parallel.comm import Comm

T = TypeVar("T")


class PeerError(EnkflowError):
    """Another rank's error, raised on this rank too; the message is that rank's, prefixed with it."""


def raise_together(comm: Comm, fn: Callable[[], T]) -> T:
    """``fn()`` on every rank (collective). Where it raises (any :class:`Exception`) on some rank, every
    rank raises: the lowest failing rank its own error, every other rank a :class:`PeerError` with it."""
    try:
        result = fn()
    except Exception as exc:
        _agree(comm, exc)
        raise
    _agree(comm, None)
    return result


def _agree(comm: Comm, failure: Exception | None) -> None:
    """Raise on every rank where some rank failed (collective)."""
    every = comm.allgather_obj(None if failure is None else str(failure))
    for rank, msg in enumerate(every):
        if msg is None:
            continue
        if rank == comm.rank and failure is not None:
            raise failure
        raise PeerError(f"rank {rank}: {msg}")
