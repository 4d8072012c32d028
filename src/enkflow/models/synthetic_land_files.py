"""NetCDF files of the synthetic global land problem: member restarts, truth, observations.

The restart layout imitates a land-model (CLM-like) restart: the state lives on a
1-D ``land`` dimension of gathered land points, next to auxiliary variables that
are not part of the state. Every member file has the same structure, so the
state variable sits at the same byte offset in each (NetCDF-4 with contiguous,
uncompressed storage, or NetCDF-3 CDF-5), which is what the fast byte-offset
I/O path of :mod:`enkflow.io` needs. ``docs/formats.md`` documents the layout.

Every file is written under a temporary name in the target directory, flushed
to disk and then renamed over the final name, so a crash leaves either the old
file, the complete new one, or a hidden ``.NAME.PID.tmp`` file - never a
half-written file under the final name.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import netCDF4
import numpy as np

from enkflow.errors import InputError
from enkflow.analysis.obsset import ObsSet
from enkflow.fsutil import atomic_output
from enkflow.models import synthetic_land as sl
from enkflow.obs.obsfile import ObsFile, write_obs_file

STATE_VARIABLE = "soil_moisture"
LAND_DIM = "land"
TRUTH_FILE = "truth.nc"
OBS_FILE = "obs.nc"
REFERENCE = "Zheng, Y., et al. (2020), Geosci. Model Dev., 13, 3607-3625, doi:10.5194/gmd-13-3607-2020"
MIN_MEMBERS = 2

# One title for members and truth, naming no member: attributes of different
# lengths could move the data of one file relative to another. The truth is the
# file with global attribute member = 0.
_RESTART_TITLE = "enkflow synthetic global land restart"
_OBS_TITLE = "enkflow synthetic global land observations"


class NcFormat(str, Enum):
    """On-disk format of the written files."""

    NC4 = "nc4"  # NetCDF-4 (HDF5), contiguous, uncompressed
    CDF5 = "cdf5"  # NetCDF-3 64-bit data (CDF-5)

    @property
    def netcdf4_name(self) -> Literal["NETCDF4", "NETCDF3_64BIT_DATA"]:
        """The netCDF4-python ``format`` argument."""
        return "NETCDF4" if self is NcFormat.NC4 else "NETCDF3_64BIT_DATA"

    @classmethod
    def parse(cls, value: "str | NcFormat") -> "NcFormat":
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(f.value for f in cls)
            raise InputError(f"unknown file format {value!r}; valid formats: {valid}", item="format") from None


def member_filename(member: int) -> str:
    """File name of member ``member`` (IDs from 1): ``member_0001.nc``."""
    return f"member_{member:04d}.nc"


def _create_var(ds: Any, name: str, dtype: str, dims: tuple[str, ...], attrs: dict[str, Any], hdf5: bool) -> Any:
    # Contiguous and unfiltered, so the variable is one byte range at a fixed offset.
    extra: dict[str, Any] = {"contiguous": True} if hdf5 else {}
    v = ds.createVariable(name, dtype, dims, **extra)
    v.setncatts(attrs)
    return v


@dataclass(frozen=True)
class _Var:
    """A variable of the restart files: name, netCDF type, dimensions, attributes."""

    name: str
    dtype: str
    dims: tuple[str, ...]
    attrs: dict[str, str]


# In the order they are defined and written: the order fixes where HDF5 allocates each contiguous
# block; it is the same for every file, so offsets agree across members.
_RESTART_VARIABLES = (
    _Var(STATE_VARIABLE, "f8", (LAND_DIM,), {
        "long_name": "synthetic soil moisture (Zheng et al. 2020 test field)",
        "units": "1",
        "coordinates": "land_lat land_lon",
        "comment": "dimensionless test field in [-1, 1]; the assimilated state",
    }),
    _Var("lon", "f8", ("lon",), {
        "standard_name": "longitude", "long_name": "grid cell centre longitude", "units": "degrees_east"}),
    _Var("lat", "f8", ("lat",), {
        "standard_name": "latitude", "long_name": "grid cell centre latitude", "units": "degrees_north"}),
    _Var("land_lon", "f8", (LAND_DIM,), {
        "standard_name": "longitude", "long_name": "land point longitude", "units": "degrees_east"}),
    _Var("land_lat", "f8", (LAND_DIM,), {
        "standard_name": "latitude", "long_name": "land point latitude", "units": "degrees_north"}),
    _Var("land_i", "i4", (LAND_DIM,), {
        "long_name": "0-based longitude index of the land point into lon", "units": "1"}),
    _Var("land_j", "i4", (LAND_DIM,), {
        "long_name": "0-based latitude index of the land point into lat", "units": "1"}),
    _Var("patch_fraction", "f8", (LAND_DIM,), {
        "long_name": "patch weight relative to the grid cell (auxiliary, not assimilated)", "units": "1",
        "coordinates": "land_lat land_lon"}),
)


def _restart_attrs(member: int, shift: float, seed: int) -> dict[str, Any]:
    return {
        "title": _RESTART_TITLE,
        "source": "enkflow synth",
        "Conventions": "CF-1.8",
        "references": REFERENCE,
        "member": np.int32(member),
        "member_shift": np.float64(shift),
        "seed": np.int64(seed),
        "state_variables": STATE_VARIABLE,
    }


def write_restart(
    path: str | Path,
    points: sl.LandPoints,
    state: np.ndarray,
    patch: np.ndarray,
    *,
    member: int,
    shift: float,
    seed: int,
    format: NcFormat = NcFormat.NC4,
) -> None:
    """Write one restart file (not atomically; see :func:`atomic_output`).

    Parameters
    ----------
    points : LandPoints
        The grid and its ``n_land`` land points.
    state : (n_land,) float64
        The state variable, dimensionless.
    patch : (n_land,) float64
        The auxiliary patch fraction in (0, 1].
    member : int
        Member ID (1..N_e), 0 for the truth; a global attribute.
    shift : float
        The member's phase shift (radians), a global attribute.
    seed : int
        Problem seed, a global attribute.
    """
    n = points.n_land
    for name, a in (("state", state), ("patch_fraction", patch)):
        if np.shape(a) != (n,):
            raise InputError(f"{name} has shape {np.shape(a)}, expected (n_land,) = ({n},)", item=name)
    fmt = NcFormat.parse(format)
    grid = points.grid
    values = (state, grid.lon, grid.lat, points.lon, points.lat, points.i, points.j, patch)  # as _RESTART_VARIABLES
    with netCDF4.Dataset(path, "w", format=fmt.netcdf4_name) as ds:
        # No prefill: every variable is written in full, and prefilling would write each byte twice.
        ds.set_fill_off()
        ds.createDimension(LAND_DIM, n)
        ds.createDimension("lon", grid.n_x)
        ds.createDimension("lat", grid.n_y)
        created = [_create_var(ds, v.name, v.dtype, v.dims, v.attrs, fmt is NcFormat.NC4) for v in _RESTART_VARIABLES]
        ds.setncatts(_restart_attrs(member, shift, seed))
        for var, a in zip(created, values, strict=True):
            var[:] = a


@dataclass(frozen=True)
class SynthResult:
    """What :func:`generate` wrote.

    ``bytes_written`` is the total size of all files; ``seconds`` the wall time.
    """

    out_dir: Path
    grid: sl.LonLatGrid
    n_land: int
    n_obs: int
    member_paths: tuple[Path, ...]
    truth_path: Path
    obs_path: Path
    bytes_written: int
    seconds: float

    @property
    def members(self) -> int:
        return len(self.member_paths)


def _estimated_restart_bytes(grid: sl.LonLatGrid, n_land: int) -> int:
    # 4 float64 and 2 int32 land variables plus the coordinates; headers are a few kB.
    return n_land * (4 * 8 + 2 * 4) + 8 * (grid.n_x + grid.n_y) + 16384


def _check_parameters(members: int, seed: int, obs_fraction: float, obs_std: float) -> None:
    if isinstance(members, bool) or not isinstance(members, (int, np.integer)) or members < MIN_MEMBERS:
        raise InputError(f"an ensemble needs at least {MIN_MEMBERS} members, got {members!r}", item="members")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**63:
        raise InputError(f"seed must be an integer in [0, 2**63), got {seed!r}", item="seed")
    if not 0.0 < obs_fraction < float("inf"):
        raise InputError(f"obs_fraction (observations per land point) must be > 0 and finite, got {obs_fraction!r}",
                         item="obs_fraction")
    if not 0.0 < obs_std < float("inf"):
        raise InputError(f"obs_std must be > 0 and finite, got {obs_std!r}", item="obs_std")


def _check_space(out: Path, grid: sl.LonLatGrid, n_land: int, members: int, n_obs: int) -> None:
    """InputError where ``out`` lacks the room for the truth, the members and the ``n_obs`` observations."""
    need = (members + 1) * _estimated_restart_bytes(grid, n_land) + 8 * 6 * max(n_land, n_obs)
    free = shutil.disk_usage(out).free
    if need > free:
        raise InputError(f"{out} has {free / 1e9:.1f} GB free, the files need about {need / 1e9:.1f} GB", item="out_dir")


def _write_observations(path: Path, points: sl.LandPoints, true_land: np.ndarray, *, seed: int, obs_fraction: float,
                        obs_std: float, fmt: NcFormat) -> int:
    """Sample the truth ``true_land`` (n_land,) and write the observation file; returns n_obs."""
    sampled = sl.sample_observations(true_land, fraction=obs_fraction, std=obs_std, seed=seed)
    idx = sampled.state_index
    obs = ObsSet(sampled.values, sampled.error_std**2, np.column_stack([points.lon[idx], points.lat[idx]]))
    attrs = {
        "title": _OBS_TITLE,
        "source": "enkflow synth",
        "Conventions": "CF-1.8",
        "references": REFERENCE,
        "seed": np.int64(seed),
        "obs_fraction": np.float64(obs_fraction),
        "n_state": np.int64(points.n_land),
        "state_variable": STATE_VARIABLE,
        "observation_operator": "identity: H(x) = x[state_index]",
    }
    with atomic_output(path) as tmp:
        write_obs_file(tmp, ObsFile(obs, idx, attrs), format=fmt.netcdf4_name, units="1", kind_names=[STATE_VARIABLE])
    return sampled.n_obs


def generate(
    out_dir: str | Path,
    *,
    size: str | sl.Size,
    members: int,
    seed: int = 0,
    obs_fraction: float = 0.1,
    obs_std: float = 0.25,
    format: str | NcFormat = NcFormat.NC4,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
) -> SynthResult:
    """Write ``members`` restart files, ``truth.nc`` and ``obs.nc`` into ``out_dir``.

    Members are generated and written one at a time, so memory stays at a few
    arrays of ``n_land`` float64 whatever the ensemble size.

    Parameters
    ----------
    size : "tiny", "small", "medium" or "large"
        Grid 72x36, 360x180, 3600x1800 or 7200x3600 (see :class:`Size`).
    members : int >= 2
        Ensemble size N_e; files ``member_0001.nc`` ... (see :func:`member_filename`).
    seed : int >= 0
        Problem seed; see :mod:`enkflow.models.synthetic_land` for the streams.
    obs_fraction, obs_std
        Observations per land point on average (> 0; see :func:`~enkflow.models.synthetic_land.sample_observations`:
        a fraction of the points for ``obs_fraction <= 1``, every point at least once above) and the
        observation error standard deviation.
    format : "nc4" or "cdf5"
    overwrite : bool
        Replace existing files of the same names; otherwise finding one is an error.
    progress : callable, optional
        Called with one line of text per step.

    Raises
    ------
    InputError
        Bad parameters, existing files without ``overwrite``, not enough disk space.
    """
    t0 = time.perf_counter()
    say = progress or (lambda _msg: None)
    grid = sl.LonLatGrid.for_size(size)
    fmt = NcFormat.parse(format)
    _check_parameters(members, seed, obs_fraction, obs_std)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    member_paths = tuple(out / member_filename(k) for k in range(1, members + 1))
    truth_path, obs_path = out / TRUTH_FILE, out / OBS_FILE
    if not overwrite:
        for p in (truth_path, obs_path, *member_paths):
            if p.exists():
                raise InputError(f"{p} exists; choose an empty directory or pass overwrite (--overwrite)", item="out_dir")

    say(f"land mask for {grid.n_x}x{grid.n_y} grid")
    points = sl.land_points(grid)
    _check_space(out, grid, points.n_land, members, sl.n_observations(points.n_land, obs_fraction))
    patch = sl.patch_fraction(points.n_land, seed)
    true_land = sl.truth(grid, points.i, points.j)
    with atomic_output(truth_path) as tmp:
        write_restart(tmp, points, true_land, patch, member=0, shift=0.0, seed=seed, format=fmt)
    n_obs = _write_observations(obs_path, points, true_land, seed=seed, obs_fraction=obs_fraction, obs_std=obs_std,
                                fmt=fmt)
    say(f"truth and {n_obs} observations written")

    for k, path in enumerate(member_paths, start=1):
        tk = time.perf_counter()
        shift = sl.member_shift(seed, k)
        field = sl.member_field(grid, points.i, points.j, shift)
        with atomic_output(path) as tmp:
            write_restart(tmp, points, field, patch, member=k, shift=shift, seed=seed, format=fmt)
        del field
        say(f"member {k}/{members} written ({time.perf_counter() - tk:.2f} s)")

    total = sum(p.stat().st_size for p in (truth_path, obs_path, *member_paths))
    return SynthResult(out, grid, points.n_land, n_obs, member_paths, truth_path, obs_path, total,
                       time.perf_counter() - t0)
