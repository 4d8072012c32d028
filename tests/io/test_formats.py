"""Byte offsets from the headers agree with what netCDF4 reads, for every format."""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest

from enkflow.errors import FileFormatError
from enkflow.io import read_structure

FORMATS = ["NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET", "NETCDF3_64BIT_DATA", "NETCDF4"]


def _write(path, fmt, nrec=1):
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.createDimension("t", None)
        ds.createDimension("y", 3)
        ds.createDimension("x", 5)
        ds.title = "t" * 17  # odd lengths exercise the header padding
        kw = {"contiguous": True} if fmt == "NETCDF4" else {}
        a = ds.createVariable("a", "f8", ("y", "x"), **kw)
        a.units = "m s-1"
        a[:] = np.arange(15.0).reshape(3, 5)
        b = ds.createVariable("b", "f4", ("y", "x"), **kw)
        b[:] = -np.arange(15.0).reshape(3, 5)
        c = ds.createVariable("c", "i2", ("x",), **kw)
        c[:] = np.arange(5)
        r = ds.createVariable("r", "f8", ("t", "x"))
        for k in range(nrec):
            r[k] = k + np.arange(5)
        if nrec > 1:  # a second record variable: records interleave
            r2 = ds.createVariable("r2", "f4", ("t",))
            r2[:] = np.arange(nrec)
        if fmt == "NETCDF3_64BIT_DATA":
            ds.createVariable("u", "u8", ("x",))[:] = np.arange(5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_offsets_match_netcdf4_values(tmp_path, fmt):
    p = str(tmp_path / "f.nc")
    _write(p, fmt)
    fs = read_structure(p)
    assert fs.format == {"NETCDF3_CLASSIC": "cdf1", "NETCDF3_64BIT_OFFSET": "cdf2", "NETCDF3_64BIT_DATA": "cdf5", "NETCDF4": "nc4"}[fmt]
    raw = open(p, "rb").read()
    with netCDF4.Dataset(p) as ds:
        for name in ("a", "b", "c"):
            vs = fs.variables[name]
            assert vs.contiguous, vs.reason
            got = np.frombuffer(raw, vs.dtype, int(np.prod(vs.shape)), vs.offset)
            np.testing.assert_array_equal(got, ds[name][:].reshape(-1))
            if fmt.startswith("NETCDF3"):
                assert vs.dtype.byteorder == ">"
        r = fs.variables["r"]
        if fmt == "NETCDF4":
            assert not r.contiguous and "chunked" in r.reason  # unlimited dims are chunked in HDF5
        else:
            assert r.contiguous and r.shape == (1, 5)  # one record: contiguous


def test_several_records_go_through_the_library(tmp_path):
    p = str(tmp_path / "f.nc")
    _write(p, "NETCDF3_64BIT_OFFSET", nrec=3)
    r = read_structure(p).variables["r"]
    assert not r.contiguous and "3 interleaved records" in r.reason


def test_not_netcdf(tmp_path):
    p = tmp_path / "x.nc"
    p.write_bytes(b"hello world, not netcdf")
    with pytest.raises(FileFormatError, match="unsupported format") as e:
        read_structure(p)
    assert str(p) in str(e.value)


def test_truncated_netcdf3_header(tmp_path):
    p = str(tmp_path / "f.nc")
    _write(p, "NETCDF3_CLASSIC")
    raw = open(p, "rb").read()
    open(p, "wb").write(raw[:40])
    with pytest.raises(FileFormatError, match="truncated"):
        read_structure(p)
