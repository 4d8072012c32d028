"""The physical limit of a state exchange on one node: one memory copy of the state (``numpy.copyto``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

COPY_REPEATS = 7


@dataclass(frozen=True)
class CopyLimit:
    """The fastest of ``repeats`` copies of ``nbytes`` bytes: ``seconds`` and ``gbps`` (1 GB = 1e9 bytes)."""

    nbytes: int
    seconds: float
    repeats: int

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9


def memcpy_limit(n: int, repeats: int = COPY_REPEATS) -> CopyLimit:
    """``np.copyto`` of ``n`` float64 from one array into another, both touched first (no page fault is
    timed): the best of ``repeats``, the least disturbed by other work on a shared machine."""
    src, dst = np.full(n, 1.5), np.zeros(n)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return CopyLimit(nbytes=8 * n, seconds=best, repeats=repeats)
