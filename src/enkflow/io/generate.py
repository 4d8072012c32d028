"""Ensembles of identical-structure restart files, for the I/O benchmark and tests."""

from __future__ import annotations

import os
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.io.lustre import setstripe
from enkflow.state import MaskConfig, StateConfig

FORMATS = {"nc4": "NETCDF4", "cdf1": "NETCDF3_CLASSIC", "cdf2": "NETCDF3_64BIT_OFFSET", "cdf5": "NETCDF3_64BIT_DATA"}


def grid_for(mb_per_file: float, n_levels: int = 4, n_state_vars: int = 2, itemsize: int = 8) -> tuple[int, int]:
    """``(ny, nx)`` with nx = 2 ny so that the state takes about ``mb_per_file`` MB (1e6 bytes)."""
    n = max(mb_per_file * 1e6 / (itemsize * n_state_vars * n_levels), 8.0)
    ny = max(int(np.sqrt(n / 2)), 2)
    return ny, 2 * ny


def make_ensemble(
    directory: str | os.PathLike[str],
    n_members: int,
    mb_per_file: float,
    *,
    fmt: str = "nc4",
    n_levels: int = 4,
    dtypes: tuple[str, ...] = ("f8", "f8"),
    chunked: bool = False,
    seed: int = 0,
) -> tuple[list[str], StateConfig]:
    """Write ``member_0000.nc``... with one structure: state variables ``var0``, ``var1``...
    (lev, y, x) of ``dtypes``, plus auxiliary ``lon(x)``, ``lat(y)``, ``landmask(y, x)`` (int32,
    1 on "land"), ``area(y, x)`` (float32) and global attributes. ``chunked`` stores the state
    chunked and deflated (the library path). Returns the paths and a state configuration
    (all state variables, no mask)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {fmt!r}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ny, nx = grid_for(mb_per_file, n_levels, len(dtypes), int(np.dtype(dtypes[0]).itemsize))
    lon = -180 + (np.arange(nx) + 0.5) * 360 / nx
    lat = -90 + (np.arange(ny) + 0.5) * 180 / ny
    jj, ii = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    land = ((np.sin(ii / 7.0) + np.cos(jj / 5.0)) > 0.3).astype(np.int32)
    area = np.cos(np.deg2rad(lat))[:, None].repeat(nx, axis=1).astype(np.float32)
    base = np.sin(np.deg2rad(lon))[None, :] * np.cos(np.deg2rad(lat))[:, None]
    paths = []
    for m in range(n_members):
        p = d / f"member_{m:04d}.nc"
        if p.exists():
            p.unlink()
        setstripe(p)
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(m,)))
        ds = netCDF4.Dataset(p, "w", format=FORMATS[fmt])
        try:
            ds.set_fill_off()
            ds.createDimension("lev", n_levels)
            ds.createDimension("y", ny)
            ds.createDimension("x", nx)
            ds.setncatts({"title": "enkflow synthetic restart", "member": np.int32(m), "Conventions": "CF-1.8"})
            kw = {"contiguous": True} if fmt == "nc4" and not chunked else {}
            if chunked and fmt == "nc4":
                kw = {"zlib": True, "complevel": 1, "chunksizes": (1, min(ny, 64), min(nx, 64))}
            for k, dt in enumerate(dtypes):
                v = ds.createVariable(f"var{k}", dt, ("lev", "y", "x"), **kw)
                v.setncatts({"units": "1", "long_name": f"state variable {k}", "coordinates": "lat lon"})
                for lev in range(n_levels):
                    v[lev] = base + 0.1 * lev + rng.standard_normal((ny, nx))
            vx = ds.createVariable("lon", "f8", ("x",))
            vx.setncatts({"units": "degrees_east", "standard_name": "longitude"})
            vx[:] = lon
            vy = ds.createVariable("lat", "f8", ("y",))
            vy.setncatts({"units": "degrees_north", "standard_name": "latitude"})
            vy[:] = lat
            vm = ds.createVariable("landmask", "i4", ("y", "x"))
            vm.long_name = "1 on land"
            vm[:] = land
            va = ds.createVariable("area", "f4", ("y", "x"))
            va.units = "1"
            va[:] = area
        finally:
            ds.close()
        paths.append(str(p))
    return paths, StateConfig(variables=[f"var{k}" for k in range(len(dtypes))])


def land_mask_config() -> MaskConfig:
    """The mask of :func:`make_ensemble`'s files (``landmask == 1``)."""
    return MaskConfig(variable="landmask", values=[1])
