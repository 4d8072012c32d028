"""``[verification]``: the truth an experiment is scored against, and a no-assimilation reference.

Both are path templates with ``{cycle}`` (relative to the TOML's directory) of files that hold the state
variables under their names in the restart's layout (a copy of a restart is one). With a truth the analysis
fills its RMSE diagnostics (``rmse_prior``, ``rmse_analysis``) in every mode, and ``enkflow report`` scores
the forecast, analysis and reference means against it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import netCDF4
import numpy as np
from pydantic import Field, field_validator

from enkflow.config import Strict
from enkflow.errors import ConfigError, EnkflowError, StructureMismatchError
from enkflow.io.ensemble import EnsembleFiles
from enkflow.io.validate import validate_files
from enkflow.state import StateLayout

_HELP = "a path template with {cycle}, e.g. 'truth/truth_{cycle:04d}.nc'"


class VerificationSection(Strict):
    """``[verification]``: what the scores are computed against (docs/configuration.md)."""

    truth: str | None = Field(default=None, description="the true state of each cycle, " + _HELP)
    free_run: str | None = Field(default=None, description="a no-assimilation run's state of each cycle (e.g. the "
                                                           "free ensemble's mean), " + _HELP)

    @field_validator("truth", "free_run")
    @classmethod
    def _cycle_template(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            v.format(cycle=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"{v!r} is not {_HELP}: {exc!r}") from None
        if v.format(cycle=0) == v.format(cycle=1):
            raise ValueError(f"{v!r} has no {{cycle}}: expected {_HELP}")
        return v


def check_verification_files(section: VerificationSection, resolve: Callable[[str], Path], cycles: Iterable[int],
                             layout: StateLayout) -> None:
    """Each configured file of ``cycles`` exists and holds the state variables with the restart's shapes
    (``resolve``: a path of the TOML against its directory). Raises naming the cycle, file and variable."""
    for key in ("truth", "free_run"):
        template = getattr(section, key)
        if template is None:
            continue
        for k in cycles:
            p = resolve(template.format(cycle=k))
            if not p.is_file():
                raise ConfigError(f"the {key.replace('_', ' ')} file of cycle {k} not found: {p}",
                                  key=f"verification.{key}")
            try:
                validate_files([str(p)], layout, writable=False)
                _same_dimensions(p, layout)
            except EnkflowError as exc:
                raise ConfigError(f"the {key.replace('_', ' ')} file of cycle {k}: {exc}", key=f"verification.{key}") from exc


def _same_dimensions(path: Path, layout: StateLayout) -> None:
    """The state variables of ``path`` have the restart's dimension names (the shapes were checked): a square
    grid written as (x, y) has the shape of (y, x), and its points paired by position would be wrong silently."""
    with netCDF4.Dataset(path) as ds:
        for sv in layout.variables:
            dims = tuple(ds.variables[sv.name].dimensions)
            if dims != tuple(sv.dims):
                raise StructureMismatchError(f"dimensions {dims} differ from the restart's {tuple(sv.dims)}",
                                             path=str(path), variable=sv.name)


class TruthFile:
    """The state rows of one file in the restart's layout (a truth file), read on demand: ``f[r0:r1]`` reads
    rows ``[r0, r1)`` only ((r1 - r0,) float64), through the layout's row reading as the restarts are read, so
    that an analysis rank reads its own rows of the truth, not the whole state."""

    def __init__(self, path: Path, layout: StateLayout):
        self.path, self.layout = path, layout

    def __getitem__(self, rows: slice, /) -> np.ndarray:
        r0, r1, step = rows.indices(self.layout.n_rows)
        if step != 1:
            raise ValueError(f"rows of a truth file are read as a range, not with step {step}")
        with EnsembleFiles([self.path], self.layout, mode="r", recover=False) as f:
            return np.ascontiguousarray(f.read_rows(r0, max(r0, r1))[:, 0])


def truth_of(path_of: Callable[[int], Path | None], layout: StateLayout) -> Callable[[int], TruthFile | None]:
    """``truth(cycle)`` for :class:`~enkflow.experiment.step.AnalysisStep`: the rows of ``path_of(cycle)``
    (the experiment's ``truth_path``), read when sliced, None where no truth is configured."""
    def truth(cycle: int) -> TruthFile | None:
        p = path_of(cycle)
        return None if p is None else TruthFile(p, layout)
    return truth
