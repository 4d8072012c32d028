"""What an observation operator is: how its observations are read from the file, located on the
state and applied (H). One operator per module in :mod:`enkflow.obs.locators`, registered by name in
:mod:`enkflow.obs.registry`; :func:`enkflow.obs.load.load_for_state` runs them."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from enkflow.config import Metric
from enkflow.obs.fileformat import ObsFile
from enkflow.obs.operators import LinearObsOperator
from enkflow.obs.reader import Source
from enkflow.state import StateLayout


@dataclass(frozen=True)
class Target:
    """The state observations are located on, and what the file's kinds say of each observation.

    Attributes
    ----------
    layout : StateLayout
        The state (from the template restart).
    metric : Metric or None
        The localization metric (None: a global analysis).
    period : float or None
        The ring length of the periodic metric, in the state coordinate's units.
    source : Source
        The observation file (named in errors).
    variable : sequence of str or None, (n_obs,)
        The state variable each observation observes (None: the only one).
    kind_names : mapping
        Kind code -> name, the file's and the configured ones.
    configured_kinds : collection of str
        The names of ``[observations.kinds]``.
    """

    layout: StateLayout
    metric: Metric | None
    period: float | None
    source: Source
    variable: Sequence[str | None]
    kind_names: Mapping[int, str]
    configured_kinds: Collection[str]


@dataclass(frozen=True, eq=False)
class Location:
    """Where the observations are, and H.

    Attributes
    ----------
    coords : (n_obs, n_dim) float64
        The localization coordinates, in the metric's units.
    lonlat : bool
        ``coords`` are longitude/latitude in degrees.
    state_index : (n_obs,) int64 or None
        H selects these state rows (H x = x[state_index]); None: ``operator`` is H.
    operator : LinearObsOperator or None
        H where it is not a selection of rows.
    site_rows : (n_obs,) int64 or None
        The state rows the observations sit at (a file without ``level`` gives them their
        vertical coordinate); None: they are located by their own coordinates.
    """

    coords: np.ndarray
    lonlat: bool
    state_index: np.ndarray | None = None
    operator: LinearObsOperator | None = None
    site_rows: np.ndarray | None = None


@runtime_checkable
class ObsOperator(Protocol):
    """An observation operator (``[observations] interpolation = NAME``).

    ``name``: the configured name, also named in its error messages.
    """

    name: str

    def read(self, source: Source, layout: StateLayout, metric: Metric | None) -> ObsFile:
        """The file's observations (only ``source.part`` where it is set: pass it on to
        :func:`~enkflow.obs.reader.read_obs_file`) with the location variables this operator needs,
        checked on their own; errors name an observation by ``source.at(i)``, its index in the file."""
        ...

    def locate(self, of: ObsFile, target: Target) -> Location:
        """Where the observations of ``of`` are on the state, and H; errors name the file
        (FileFormatError) or the configuration key (ConfigError)."""
        ...
