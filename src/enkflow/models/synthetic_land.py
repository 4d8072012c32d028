"""The synthetic global land problem of Zheng et al. (2020).

Zheng, Y., Albergel, C., Munier, S., Bonan, B. and Calvet, J.-C. (2020): An
offline framework for high-dimensional ensemble Kalman filters to reduce the
time to solution. Geosci. Model Dev., 13, 3607-3625.

On an ``n_x`` x ``n_y`` longitude-latitude grid (``dx = 2 pi / n_x``,
``dy = pi / n_y`` radians) the truth at land point ``(i, j)`` is::

    sin(-3 + 4 i dx / (2 pi - dx))**2 * cos(-2 + 4 j dy / (pi - dy))**3

with ``i = 0..n_x-1`` the longitude index and ``j = 0..n_y-1`` the latitude
index (south to north). Member ``k`` adds one random shift ``s_k ~ U[-0.5, 0.5]``
inside the sine. Observations sample the land points, ``F`` observations per point
on average (a random fraction ``F`` of them for ``F <= 1``; every point
``floor(F)`` times and a random ``F - floor(F)`` of them once more for ``F > 1``),
with independent N(0, obs_std**2) errors added to the truth; the observation
operator H is the selection of those land points.

The field is dimensionless and lies in [-1, 1]. Everything here is a pure
function of the grid, the indices and the seed; :mod:`.synthetic_land_files`
writes the NetCDF files.

Seeds
-----
All randomness comes from ``numpy.random.default_rng`` fed with
``numpy.random.SeedSequence(seed, spawn_key=...)``, one stream per purpose:

* ``spawn_key=(0, k)``: the shift of member ``k`` (member IDs start at 1), so
  member ``k`` is the same whatever the ensemble size and generation order;
* ``spawn_key=(1,)``: the observation locations and errors: first the observed points
  (``choice`` without replacement: the points of ``F <= 1``, the points observed once more
  for ``F > 1``), then one error per observation in file order (by state index);
* ``spawn_key=(2,)``: the auxiliary patch fraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from enkflow.errors import InputError
from enkflow.models.synthetic_land_mask import globe_land

# Spawn-key prefixes of the random streams; see the module docstring.
_STREAM_MEMBER = 0
_STREAM_OBS = 1
_STREAM_PATCH = 2

# Half-width of the uniform member shift inside the sine (radians).
SHIFT_HALF_WIDTH = 0.5


class Size(str, Enum):
    """Bundled problem sizes; ``shape`` is ``(n_x, n_y)``.

    Land points with cell-centre masking (see :func:`land_mask`): tiny 877,
    small 21,546, medium 2,149,692 (the paper's "medium" has 2,127,104),
    large 8,598,360.
    """

    TINY = "tiny"
    SMALL = "small"
    MEDIUM = "medium"
    LARGE = "large"

    @property
    def shape(self) -> tuple[int, int]:
        return _SHAPES[self]

    @classmethod
    def parse(cls, value: "str | Size") -> "Size":
        """``value`` as a Size; an unknown name is an InputError listing the valid ones."""
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(s.value for s in cls)
            raise InputError(f"unknown problem size {value!r}; valid sizes: {valid}", item="size") from None


_SHAPES = {
    Size.TINY: (72, 36),
    Size.SMALL: (360, 180),
    Size.MEDIUM: (3600, 1800),
    Size.LARGE: (7200, 3600),
}


@dataclass(frozen=True)
class LonLatGrid:
    """A regular global longitude-latitude grid of ``n_x`` x ``n_y`` cells.

    Cell centres are at ``lon = -180 + (i + 0.5) * 360 / n_x`` and
    ``lat = -90 + (j + 0.5) * 180 / n_y`` degrees.
    """

    n_x: int
    n_y: int

    def __post_init__(self) -> None:
        for name in ("n_x", "n_y"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 2:
                raise InputError(f"grid {name} must be an integer >= 2, got {v!r}", item=f"grid.{name}")

    @classmethod
    def for_size(cls, size: "str | Size") -> "LonLatGrid":
        """The grid of a bundled problem size."""
        n_x, n_y = Size.parse(size).shape
        return cls(n_x, n_y)

    @property
    def dx(self) -> float:
        """Longitude spacing in radians."""
        return 2.0 * math.pi / self.n_x

    @property
    def dy(self) -> float:
        """Latitude spacing in radians."""
        return math.pi / self.n_y

    @property
    def lon(self) -> np.ndarray:
        """(n_x,) float64 cell-centre longitudes in degrees east, in (-180, 180)."""
        return -180.0 + (np.arange(self.n_x, dtype=np.float64) + 0.5) * (360.0 / self.n_x)

    @property
    def lat(self) -> np.ndarray:
        """(n_y,) float64 cell-centre latitudes in degrees north, south to north."""
        return -90.0 + (np.arange(self.n_y, dtype=np.float64) + 0.5) * (180.0 / self.n_y)


def land_mask(grid: LonLatGrid) -> np.ndarray:
    """(n_y, n_x) bool: True where the cell centre is land.

    Uses the 1-km GLOBE mask of the ``global-land-mask`` package, sampled at
    cell centres (lakes count as land): ``globe.is_land(lat, lon)``. Only the
    mask rows of the grid's latitudes are kept (:mod:`.synthetic_land_mask`),
    not the package's whole 933 MB mask; reading it takes about 3 s.
    """
    return globe_land(grid.lat, grid.lon)


@dataclass(frozen=True, eq=False)
class LandPoints:
    """The land points of a grid, in state-vector order.

    Land points are ordered latitude-major, south to north and west to east
    within a latitude row (C order of the ``(n_y, n_x)`` mask).

    Attributes
    ----------
    grid : LonLatGrid
    i : (n_land,) int32
        Longitude index, 0..n_x-1.
    j : (n_land,) int32
        Latitude index, 0..n_y-1.
    """

    grid: LonLatGrid
    i: np.ndarray
    j: np.ndarray

    @property
    def n_land(self) -> int:
        return int(self.i.size)

    @property
    def lon(self) -> np.ndarray:
        """(n_land,) float64 longitudes in degrees east."""
        return self.grid.lon[self.i]

    @property
    def lat(self) -> np.ndarray:
        """(n_land,) float64 latitudes in degrees north."""
        return self.grid.lat[self.j]


def land_points(grid: LonLatGrid, mask: np.ndarray | None = None) -> LandPoints:
    """The land points of ``grid``; ``mask`` ((n_y, n_x) bool) defaults to :func:`land_mask`."""
    m = land_mask(grid) if mask is None else np.asarray(mask, dtype=bool)
    if m.shape != (grid.n_y, grid.n_x):
        raise InputError(f"land mask has shape {m.shape}, expected (n_y, n_x) = ({grid.n_y}, {grid.n_x})", item="mask")
    j, i = np.nonzero(m)
    return LandPoints(grid, i.astype(np.int32), j.astype(np.int32))


def _check_indices(grid: LonLatGrid, i: np.ndarray, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    i = np.asarray(i)
    j = np.asarray(j)
    for name, a, n in (("i", i, grid.n_x), ("j", j, grid.n_y)):
        if not np.issubdtype(a.dtype, np.integer):
            raise InputError(f"index {name} must be integer, got dtype {a.dtype}", item=name)
        if a.size and (a.min() < 0 or a.max() >= n):
            bad = int(np.argmax((a < 0) | (a >= n)))
            raise InputError(f"index {name} must lie in 0..{n - 1}; element {bad} is {a.reshape(-1)[bad]}", item=name, index=bad)
    return i, j


def member_field(grid: LonLatGrid, i: np.ndarray, j: np.ndarray, shift: float = 0.0) -> np.ndarray:
    """The field ``sin(-3 + 4 i dx/(2pi - dx) + shift)**2 * cos(-2 + 4 j dy/(pi - dy))**3``.

    Parameters
    ----------
    grid : LonLatGrid
    i, j : int arrays, broadcastable
        Longitude and latitude indices (0-based).
    shift : float
        Phase shift inside the sine, radians; 0 gives the truth.

    Returns
    -------
    float64 array of the broadcast shape of ``i`` and ``j``; dimensionless, in [-1, 1].
    """
    i, j = _check_indices(grid, i, j)
    # The sine depends on i only and the cosine on j only: evaluating them on the
    # n_x + n_y grid lines and gathering is ~50x cheaper than per point, and gives
    # the same bits because each factor sees the same operands.
    ii = np.arange(grid.n_x, dtype=np.float64)
    jj = np.arange(grid.n_y, dtype=np.float64)
    lon_factor = np.sin(-3.0 + 4.0 * ii * grid.dx / (2.0 * math.pi - grid.dx) + shift) ** 2
    lat_factor = np.cos(-2.0 + 4.0 * jj * grid.dy / (math.pi - grid.dy)) ** 3
    return lon_factor[i] * lat_factor[j]


def truth(grid: LonLatGrid, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """The true field at indices ``(i, j)``: :func:`member_field` with no shift."""
    return member_field(grid, i, j, 0.0)


def _rng(seed: int, *key: int) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}", item="seed")
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=key))


def member_shift(seed: int, member: int) -> float:
    """The phase shift ``s_k ~ U[-0.5, 0.5]`` (radians) of member ``member`` (IDs from 1)."""
    if isinstance(member, bool) or not isinstance(member, (int, np.integer)) or member < 1:
        raise InputError(f"member IDs start at 1, got {member!r}", item="member")
    return float(_rng(seed, _STREAM_MEMBER, int(member)).uniform(-SHIFT_HALF_WIDTH, SHIFT_HALF_WIDTH))


def patch_fraction(n_land: int, seed: int) -> np.ndarray:
    """(n_land,) float64 in [0.05, 1): the auxiliary (non-state) patch weight of each land point.

    The same in every member and the truth, as a model's static surface data is.
    """
    return _rng(seed, _STREAM_PATCH).uniform(0.05, 1.0, size=n_land)


@dataclass(frozen=True, eq=False)
class SampledObs:
    """Observations of the truth at land points.

    Attributes
    ----------
    state_index : (n_obs,) int64
        Observed land-point indices, increasing (non-decreasing where a point is observed more
        than once); H selects these state rows.
    values : (n_obs,) float64
        Truth plus error, dimensionless.
    error_std : (n_obs,) float64
        Observation error standard deviations (the same units as ``values``).
    """

    state_index: np.ndarray
    values: np.ndarray
    error_std: np.ndarray

    @property
    def n_obs(self) -> int:
        return int(self.state_index.size)


def n_observations(n_land: int, fraction: float) -> int:
    """How many observations ``fraction`` (observations per land point on average) makes of ``n_land``
    points: ``round(fraction * n_land)``, at least 1, for ``fraction <= 1``; for ``fraction > 1``
    ``floor(fraction) * n_land`` plus ``round((fraction - floor(fraction)) * n_land)``."""
    if fraction <= 1.0:
        return max(1, int(round(fraction * n_land)))
    whole = math.floor(fraction)
    return whole * n_land + int(round((fraction - whole) * n_land))


def _observed_points(rng: np.random.Generator, n_land: int, fraction: float) -> np.ndarray:
    """(n_obs,) int64 increasing state indices (a point observed k times appears k times)."""
    if fraction <= 1.0:
        return np.sort(rng.choice(n_land, size=n_observations(n_land, fraction), replace=False)).astype(np.int64)
    whole = math.floor(fraction)
    counts = np.full(n_land, whole, dtype=np.int64)
    counts[rng.choice(n_land, size=n_observations(n_land, fraction) - whole * n_land, replace=False)] += 1
    return np.repeat(np.arange(n_land, dtype=np.int64), counts)


def sample_observations(truth_land: np.ndarray, *, fraction: float = 0.1, std: float = 0.25, seed: int = 0) -> SampledObs:
    """Observe the land points, ``fraction`` observations per point on average, with N(0, std**2) errors.

    Parameters
    ----------
    truth_land : (n_land,) float64
        The truth at every land point, in state order.
    fraction : float > 0
        Observations per land point on average: for ``fraction <= 1`` that fraction of the points
        (without replacement), once each; for ``fraction > 1`` every point ``floor(fraction)`` times and
        a random ``fraction - floor(fraction)`` of them once more (see :func:`n_observations`). Every
        observation has its own error.
    std : float > 0
        Observation error standard deviation, units of the field.
    seed : int
        Problem seed; the stream ``spawn_key=(1,)`` is used (see the module docstring).
    """
    t = np.asarray(truth_land, dtype=np.float64).reshape(-1)
    if not 0.0 < fraction < math.inf:
        raise InputError(f"observations per land point must be > 0 and finite, got {fraction!r}", item="obs_fraction")
    if not std > 0.0 or not math.isfinite(std):
        raise InputError(f"observation error std must be > 0 and finite, got {std!r}", item="obs_std")
    if t.size == 0:
        raise InputError("no land points to observe", item="truth_land")
    rng = _rng(seed, _STREAM_OBS)
    idx = _observed_points(rng, t.size, fraction)
    n_obs = idx.size
    err = rng.normal(0.0, std, size=n_obs)
    return SampledObs(idx, t[idx] + err, np.full(n_obs, float(std)))
