"""The observation file: the observations of one analysis time, and where they are.

Layout (``docs/formats.md``, section "Observation file"): one dimension ``obs``
and the variables

* ``value(obs)`` float64 - observed values y;
* ``error_std(obs)`` float64 - observation error standard deviations, > 0,
  same units as ``value`` (R = diag(error_std**2)); a file may hold
  ``error_var(obs)`` (the variances) instead;
* the location, matching the configured observation operator
  (``[observations] interpolation``, :mod:`enkflow.obs.registry`):

  - ``index``: ``state_index(obs)`` int64, the 0-based state row observed, H(x) = x[state_index];
    the observation sits at that row (no coordinate variable is read);
  - ``nearest`` / ``bilinear``: the observation's own coordinates, matching the metric:
    ``lon(obs)``, ``lat(obs)`` (degrees) for ``sphere``, ``x``, ``y`` (, ``z``) in the state's
    coordinate units for ``cartesian``, ``x`` (the position on the ring) for ``periodic``;
* ``kind(obs)`` int32 - observation kind code (optional, 0 if absent; CF ``flag_values`` /
  ``flag_meanings`` name the codes); ``[observations.kinds.NAME]`` selects per kind the error
  factor, the localization radius, the QC threshold and the observed state variable;
* ``time(obs)`` float64 - optional: the observation time relative to the analysis time, in the
  model's time unit; it must lie in the window (``[observations] window``);
* ``level(obs)`` float64 - optional: the vertical coordinate, for vertical localization.

This module holds the variable names and :class:`ObsFile`, what a file holds once read
(:mod:`enkflow.obs.reader`, :mod:`enkflow.obs.writer`, :mod:`enkflow.obs.load`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from enkflow.analysis.obsset import ObsSet
from enkflow.errors import InputError
from enkflow.obs.operators import LinearObsOperator

OBS_DIM = "obs"
VALUE = "value"
ERROR_STD = "error_std"
ERROR_VAR = "error_var"
LON = "lon"
LAT = "lat"
X, Y, Z = "x", "y", "z"
STATE_INDEX = "state_index"
KIND = "kind"
TIME = "time"
LEVEL = "level"

# Accepted ranges, degrees: latitudes, and longitudes in either the [-180, 180] or the [0, 360] convention.
LAT_RANGE = (-90.0, 90.0)
LON_RANGE = (-180.0, 360.0)

# netCDF4-python format names the writer accepts; NetCDF-3 classic/64-bit offset lack int64.
WritableFormat = Literal["NETCDF4", "NETCDF4_CLASSIC", "NETCDF3_64BIT_DATA"]
WRITABLE_FORMATS: tuple[WritableFormat, ...] = get_args(WritableFormat)


@dataclass(frozen=True, eq=False)
class ObsFile:
    """An observation file's contents.

    Attributes
    ----------
    obs : ObsSet
        Values, error variances (``error_std**2``, times the kind's ``error_factor**2``),
        coordinates, kinds. Read by :func:`~enkflow.obs.reader.read_obs_file`: the coordinate
        variables read, or ``(n_obs, 0)``; from :func:`~enkflow.obs.load.load_for_state`: the
        localization coordinates (the observed state rows' with ``interpolation = "index"``, the
        file's own otherwise).
    state_index : (n_obs,) int64 or None
        0-based state row observed by each observation (``index``: the file's; ``nearest``: the
        nearest row); None where ``operator`` interpolates.
    attrs : dict
        The file's global attributes.
    time : (n_obs,) float64 or None
        Observation times relative to the analysis time (model time unit), where the file has them.
    kind_names : dict
        Kind code -> name, from the file's ``flag_values``/``flag_meanings`` and the configuration.
    operator : LinearObsOperator or None
        H where it is not the selection of ``state_index`` (bilinear interpolation).
    qc_sigma : (n_obs,) float64 or None
        Gross-error threshold k per observation (inf: not checked); None: no gross-error check.
    lonlat : bool
        The coordinates are longitude/latitude in degrees.
    """

    obs: ObsSet
    state_index: np.ndarray | None
    attrs: dict[str, Any] = field(default_factory=dict)
    time: np.ndarray | None = None
    kind_names: dict[int, str] = field(default_factory=dict)
    operator: LinearObsOperator | None = None
    qc_sigma: np.ndarray | None = None
    lonlat: bool = False  # the coordinates are (lon, lat) in degrees

    def __post_init__(self) -> None:
        if self.state_index is None:  # located by coordinates: H is known once the state is (load_for_state)
            return
        s = np.asarray(self.state_index)
        if not np.issubdtype(s.dtype, np.integer):
            raise InputError(f"state_index must be integer, got dtype {s.dtype}", item="state_index")
        s = np.ascontiguousarray(s, dtype=np.int64).reshape(-1)
        if s.shape != (self.obs.n_obs,):
            raise InputError(f"state_index has {s.size} elements, expected {self.obs.n_obs} (one per observation)", item="state_index")
        if s.size and s.min() < 0:
            i = int(np.argmax(s < 0))
            raise InputError(f"state_index must be >= 0; observation {i} has {s[i]}", item="state_index", index=i)
        object.__setattr__(self, "state_index", s)

    @property
    def n_obs(self) -> int:
        return self.obs.n_obs

    def operator_for(self, n_rows: int) -> LinearObsOperator:
        """H on a state of ``n_rows`` rows: ``operator``, or the selection of ``state_index``."""
        if self.operator is not None:
            return self.operator
        if self.state_index is None:
            raise InputError("observations located by coordinates: read them with load_for_state (H needs the state)",
                             item="state_index")
        return LinearObsOperator.selection(self.state_index, n_rows)

    def kind_name(self, code: int) -> str:
        return self.kind_names.get(int(code), str(int(code)))
