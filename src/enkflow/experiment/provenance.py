"""Which experiment last wrote a set of restarts, so that no experiment silently starts
from restarts another one has advanced.

Every directory holding member restarts gets a registry ``.enkflow-restarts.json``:
``{file name: {"experiment": EXPDIR, "cycle": c, "state": "advancing" | "analysed",
"fingerprint": {...}}}``. An experiment marks its restarts ``advancing`` before the
forecasts of a cycle touch them and ``analysed`` (with their fingerprints) once the
cycle's analysis is done. A new experiment refuses restarts that the registry says
another experiment (or an earlier run whose directory is gone) advanced; a resumed
one refuses restarts that changed since it last wrote them. Either can be overridden
(``enkflow run --accept-restarts``), and ``experiment.initial = "copy"`` avoids the
question by giving each experiment its own copy of the initial ensemble.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Any, Iterator

from enkflow.errors import EnkflowError
from enkflow.fsutil import read_json, write_json_atomic
from enkflow.jobs.files import fingerprint

REGISTRY = ".enkflow-restarts.json"


class RestartState(StrEnum):
    """What the registry says an experiment did to a restart (its ``state``)."""

    ADVANCING = "advancing"  # a cycle's forecasts may be rewriting it
    ANALYSED = "analysed"  # the cycle's analysis is done: its fingerprint is recorded


class RestartProvenanceError(EnkflowError):
    """The restarts are not what this experiment may start or resume from."""


@contextmanager
def _registry(directory: Path) -> Iterator[dict[str, Any]]:
    """The registry of ``directory``, locked for a read-modify-write."""
    lock = os.open(directory / (REGISTRY + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        data = read_json(directory / REGISTRY, {})
        before = dict(data)
        yield data
        if data != before:
            write_json_atomic(directory / REGISTRY, data)
    finally:
        os.close(lock)


def entries(paths: Sequence[Path]) -> dict[Path, dict[str, Any] | None]:
    """The registry entry of every path (None when no experiment recorded it)."""
    out: dict[Path, dict[str, Any] | None] = {}
    cache: dict[Path, dict[str, Any]] = {}
    for p in paths:
        d = p.parent
        if d not in cache:
            cache[d] = read_json(d / REGISTRY, {}) or {}
        out[p] = cache[d].get(p.name)
    return out


def mark(paths: Sequence[Path], expdir: Path, cycle: int, state: RestartState) -> None:
    """Record that ``expdir`` is advancing (or has analysed) ``paths`` in ``cycle``."""
    by_dir: dict[Path, list[Path]] = {}
    for p in paths:
        by_dir.setdefault(p.parent, []).append(p)
    for d, ps in by_dir.items():
        with _registry(d) as reg:
            for p in ps:
                reg[p.name] = {"experiment": str(expdir), "cycle": cycle, "state": state.value,
                               "fingerprint": fingerprint(p) if state is RestartState.ANALYSED else None}


def check_new(paths: Sequence[Path], expdir: Path) -> None:
    """A new experiment in ``expdir`` may start from ``paths`` only if no experiment advanced them."""
    for p, e in entries(paths).items():
        if e is None:
            continue
        other = e["experiment"]
        who = (f"experiment {other}" if Path(other) != expdir else
               f"an earlier run in {other} whose state is gone")
        raise RestartProvenanceError(
            f"restart {p} was advanced by {who} (cycle {e['cycle']}, {e['state']}): it is not an initial "
            "ensemble. Restore the initial restarts, or set experiment.initial = \"copy\" in a run that "
            "starts from pristine files, or, to start from these states on purpose, rerun with --accept-restarts")


def check_resume(paths: Sequence[Path], expdir: Path) -> None:
    """A resumed experiment's restarts must be what it last wrote (checked between cycles)."""
    for p, e in entries(paths).items():
        if e is None or e.get("state") != RestartState.ANALYSED.value:
            continue
        if Path(e["experiment"]) != expdir:
            raise RestartProvenanceError(
                f"restart {p} was advanced by experiment {e['experiment']} (cycle {e['cycle']}) since this "
                f"experiment ({expdir}) last wrote it; rerun with --accept-restarts to continue from it anyway")
        if e.get("fingerprint") is not None and fingerprint(p) != e["fingerprint"]:
            raise RestartProvenanceError(
                f"restart {p} changed since this experiment wrote it at the end of cycle {e['cycle']} "
                f"(was {e['fingerprint']}, now {fingerprint(p)}); restore it, or rerun with --accept-restarts")
