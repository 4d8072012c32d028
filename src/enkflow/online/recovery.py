"""A server's start: from the newest complete checkpoint when there is one, else from the initial ensemble.

Rank 0 finds the newest cycle whose analysis every rank checkpointed and the
forecasts of the next cycle that every rank checkpointed
(:func:`~enkflow.online.checkpoint.recoverable`); every rank loads its share of
them, so that no forecast that arrived before a crash is run again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from enkflow.online import checkpoint as ckpt
from enkflow.online.store import MemoryStore


class Start(NamedTuple):
    """Where a server starts: the cycles left to run and the members whose forecast of the first is in."""

    cycles: list[int]
    forecasts: set[int]


def recover(cycles: list[int], store: MemoryStore, checkpoint_dir: Path | None, *,
            initial: Callable[[MemoryStore], None], say: Callable[[str], None]) -> Start:
    """Fill ``store`` (this rank's shares) for a study of ``cycles`` (collective): the newest analysis
    checkpointed in ``checkpoint_dir`` and the next cycle's forecasts, or ``initial(store)``."""
    comm, fields = store.comm, store.own.fields
    info: tuple[int | None, dict[int, set[int]]] | None = None
    if comm.rank == 0 and checkpoint_dir is not None:
        info = ckpt.recoverable(checkpoint_dir, comm.size, store.n_members)
    found: tuple[int | None, dict[int, set[int]]] = comm.bcast(info, root=0) or (None, {})
    last, forecasts = found
    shapes: list[tuple[int, ...]] = [p.shape for p in store.parts]
    if last is not None and last >= cycles[0] and checkpoint_dir is not None:
        path = ckpt.analysis_path(checkpoint_dir, last, comm.rank)
        for dst, src in zip(store.parts, ckpt.read_h5(path, fields, shapes)):
            dst[...] = src
        todo = [k for k in cycles if k > last]
        say(f"resumed from the checkpoint of cycle {last}'s analysis")
    else:
        initial(store)
        todo = list(cycles)
    done: set[int] = set()
    if todo and checkpoint_dir is not None:
        done = set(forecasts.get(todo[0], set()))
        for m in sorted(done):
            path = ckpt.forecast_path(checkpoint_dir, todo[0], m, comm.rank)
            for k, c in enumerate(ckpt.read_h5(path, fields, [(s[0],) for s in shapes])):
                store.column(k, m)[...] = c
        if done:
            say(f"cycle {todo[0]}: {len(done)} forecasts recovered from the checkpoints")
    return Start(todo, done)

