"""Bad input is reported, naming the file and variable, before any byte is written."""

from __future__ import annotations

import hashlib
import os
import shutil

import netCDF4
import numpy as np
import pytest

from enkflow.errors import FileFormatError, StructureMismatchError
from enkflow.io import EnsembleFiles
from enkflow.state import StateLayout


def _digests(paths):
    return [hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.exists(p) else None for p in paths]


@pytest.fixture
def setup(ensemble):
    paths, cfg = ensemble("cdf5", ("f8", "f4"), n=4)
    lay = StateLayout.from_config(paths[0], cfg)
    return paths, lay


def _open_and_update(paths, lay):
    ef = EnsembleFiles(paths, lay, mode="r+")
    ef.update(np.zeros((lay.n_rows, len(paths)), order="F"))
    ef.close()


def _check(paths, lay, exc, bad_path, variable, match):
    before = _digests(paths)
    with pytest.raises(exc, match=match) as e:
        _open_and_update(paths, lay)
    assert e.value.path == str(bad_path) and str(bad_path) in str(e.value)
    assert e.value.variable == variable and f"'{variable}'" in str(e.value)
    assert _digests(paths) == before  # nothing written


def test_missing_file(setup):
    paths, lay = setup
    os.unlink(paths[2])
    _check(paths, lay, FileFormatError, paths[2], "var0", "not found")


def test_truncated_file(setup):
    paths, lay = setup
    from enkflow.io import read_structure

    os.truncate(paths[3], read_structure(paths[3]).variables["var1"].offset + 10)
    _check(paths, lay, FileFormatError, paths[3], "var1", "truncated")
    shutil.copy(paths[0], paths[3])
    os.truncate(paths[3], os.path.getsize(paths[3]) - 4)
    _check(paths, lay, FileFormatError, paths[3], "area", "truncated")


def test_truncated_hdf5_file(ensemble):
    paths, cfg = ensemble("nc4", n=3)
    lay = StateLayout.from_config(paths[0], cfg)
    os.truncate(paths[1], os.path.getsize(paths[1]) // 2)
    _check(paths, lay, FileFormatError, paths[1], "var0", "cannot open")


def test_read_only_file(setup):
    paths, lay = setup
    os.chmod(paths[1], 0o444)
    _check(paths, lay, FileFormatError, paths[1], "var0", "read-only")
    EnsembleFiles(paths, lay, mode="r").close()  # reading is fine


def test_structure_differs(setup, tmp_path):
    paths, lay = setup
    other = str(tmp_path / "other.nc")
    with netCDF4.Dataset(paths[0]) as src, netCDF4.Dataset(other, "w", format="NETCDF3_64BIT_DATA") as dst:
        for d in src.dimensions.values():
            dst.createDimension(d.name, len(d))
        for v in src.variables.values():
            dt = "f8" if v.name == "area" else v.dtype  # one auxiliary variable with another dtype
            dst.createVariable(v.name, dt, v.dimensions)[:] = v[:]
    shutil.copy(other, paths[2])
    _check(paths, lay, StructureMismatchError, paths[2], "area", "dtype/byte order >f8 vs >f4")


def test_format_differs(setup, ensemble):
    paths, lay = setup
    nc4, _ = ensemble("nc4", ("f8", "f4"), n=1)
    shutil.copy(nc4[0], paths[1])
    _check(paths, lay, StructureMismatchError, paths[1], "var0", "format nc4 differs")


def test_missing_variable(setup, tmp_path):
    paths, lay = setup
    other = str(tmp_path / "other.nc")
    with netCDF4.Dataset(paths[0]) as src, netCDF4.Dataset(other, "w", format="NETCDF3_64BIT_DATA") as dst:
        for d in src.dimensions.values():
            dst.createDimension(d.name, len(d))
        for v in src.variables.values():
            if v.name != "var1":
                dst.createVariable(v.name, v.dtype, v.dimensions)[:] = v[:]
    shutil.copy(other, paths[3])
    _check(paths, lay, FileFormatError, paths[3], "var1", "missing")


def test_unsupported_layout(setup, tmp_path):
    paths, lay = setup
    other = str(tmp_path / "other.nc")
    with netCDF4.Dataset(paths[0]) as src, netCDF4.Dataset(other, "w", format="NETCDF3_64BIT_DATA") as dst:
        for d in src.dimensions.values():
            dst.createDimension(d.name, len(d))
        for v in src.variables.values():
            dst.createVariable(v.name, "i4" if v.name == "var0" else v.dtype, v.dimensions)[:] = v[:]
    shutil.copy(other, paths[1])
    _check(paths, lay, FileFormatError, paths[1], "var0", "unsupported layout")
