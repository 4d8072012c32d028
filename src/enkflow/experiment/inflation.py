"""The adaptive inflation field carried from cycle to cycle (:mod:`enkflow.analysis.adaptive_inflation`).

The field (n_rows, 2: the factor of every state row and the deviation of its estimate) goes
from one cycle's posterior to the next cycle's prior: in memory where the analysis runs on
(the online server, Lorenz-96), and through each cycle's file (:mod:`enkflow.io.inflation_field`)
where files are kept, which a new analysis task, or a restarted server, reads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from enkflow.analysis.adaptive_inflation import AdaptiveScheme
from enkflow.io.inflation_field import FILE_NAME, read_state, write_field
from enkflow.parallel import Comm


class InflationCarrier:
    """The field of ``scheme`` on ``n_rows`` state rows, as the ranks of ``comm`` share it.

    ``dir_of(cycle)``: the directory of each cycle's field file (None: the field stays in memory);
    ``first_cycle``: the study's first cycle, which starts from the scheme's initial field (after
    it, the previous cycle's field is needed: in memory or its file). ``coords`` (n_rows, n_dim)
    go into the files."""

    def __init__(self, scheme: AdaptiveScheme, n_rows: int, comm: Comm, *, dir_of: Callable[[int], Path] | None = None,
                 first_cycle: int = 0, coords: np.ndarray | None = None):
        self.scheme, self.n_rows, self.comm = scheme, n_rows, comm
        self.dir_of, self.first_cycle, self.coords = dir_of, first_cycle, coords
        self._field: np.ndarray | None = None
        self._cycle: int | None = None

    def prior(self, cycle: int, row_start: int, row_stop: int) -> np.ndarray:
        """This rank's rows of the prior field of ``cycle``: (row_stop - row_start, 2) float64, a new
        array (the analysis updates it in place to the posterior)."""
        if self._field is not None and self._cycle == cycle - 1:
            posterior = self._field
        elif self.dir_of is None or cycle <= self.first_cycle:
            posterior = self.scheme.initial_field(self.n_rows)[row_start:row_stop]
        else:
            full = read_state(Path(self.dir_of(cycle - 1)) / FILE_NAME, self.n_rows, self.scheme.sd)
            posterior = full[row_start:row_stop]
        return np.array(self.scheme.forecast(posterior), dtype=np.float64)

    def posterior(self, cycle: int, field: np.ndarray) -> None:
        """Keep the posterior field of ``cycle`` (this rank's rows) and, with ``dir_of``, write the
        cycle's file (rank 0, atomically; collective)."""
        self._field, self._cycle = np.array(field, dtype=np.float64), cycle
        if self.dir_of is None:
            return
        full = self.comm.allgather_rows(np.ascontiguousarray(self._field))
        if self.comm.rank == 0:
            d = Path(self.dir_of(cycle))
            d.mkdir(parents=True, exist_ok=True)
            write_field(d / FILE_NAME, full, cycle=cycle, coords=self.coords)
        self.comm.barrier()
