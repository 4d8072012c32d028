"""The observation space of one cycle's observation file (an
:class:`~enkflow.experiment.cycling.ObservationSpace`).

H is the selection of the observed state rows (the file's ``state_index``),
applied rank-locally and summed across ranks, unless an operator stage wrote
H(x) per member (NetCDF files with ``hx(obs)``, see docs/formats.md), which is
then used as given; the analysis mean is always mapped with the selection.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from enkflow.analysis.obsset import ObsSet
from enkflow.errors import FileFormatError
from enkflow.obs.obsfile import ObsFile
from enkflow.obs.operators import GivenHX, LinearObsOperator
from enkflow.parallel import Comm


def read_given_hx(paths: Sequence[Path], n_obs: int) -> np.ndarray:
    """H(x) per member from an operator stage: each file holds ``hx(obs)``; returns (n_obs, N)."""
    import netCDF4

    HX = np.empty((n_obs, len(paths)))
    for m, p in enumerate(paths):
        try:
            with netCDF4.Dataset(p, "r") as ds:
                if "hx" not in ds.variables:
                    raise FileFormatError("no variable 'hx' (the operator's H(x) per observation)", path=str(p), variable="hx")
                v = np.asarray(ds.variables["hx"][:], dtype=np.float64).reshape(-1)
        except OSError as exc:
            raise FileFormatError(f"cannot read the operator output: {exc}", path=str(p), variable="hx") from None
        if v.size != n_obs:
            raise FileFormatError(f"hx has {v.size} values, the observation file {n_obs}", path=str(p), variable="hx")
        HX[:, m] = v
    return HX


class FileObservations:
    """The observations of one cycle, from ``obs_file`` (as :func:`~enkflow.obs.obsfile.load_for_state`
    read and checked it) on a state of ``n_rows`` rows; ``hx_files`` (member 1 first) hold H(x)
    of the cycle's forecasts, read when :meth:`apply` is called."""

    def __init__(self, obs_file: ObsFile, n_rows: int, hx_files: Sequence[Path] | None = None):
        self.file = obs_file
        self.selection = LinearObsOperator.selection(obs_file.state_index, n_rows)
        self.hx_files = list(hx_files) if hx_files else None

    def observations(self, cycle: int) -> ObsSet:
        return self.file.obs

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        op = GivenHX(read_given_hx(self.hx_files, self.file.obs.n_obs)) if self.hx_files else self.selection
        return op.apply(X, row_start, comm)

    def apply_mean(self, cycle: int, x: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return self.selection.apply(x[:, None], row_start, comm)[:, 0]
