"""EnsembleFiles: reads equal netCDF4's, updates change only the state bytes."""

from __future__ import annotations

import os

import netCDF4
import numpy as np
import pytest
from io_helpers import bytes_outside_state, expected_after_update, netcdf4_X

from enkflow.errors import InputError
from enkflow.io import EnsembleFiles, IOConfig, SafeUpdateConfig, UpdateMethod
from enkflow.io.generate import land_mask_config
from enkflow.state import StateLayout

CASES = [(fmt, dts, masked) for fmt in ("nc4", "cdf1", "cdf2", "cdf5") for dts in (("f8", "f8"), ("f4", "f8")) for masked in (False, True)]


def _layout(paths, cfg, masked):
    return StateLayout.from_file(paths[0], cfg.variables, mask=land_mask_config() if masked else None)


def _new_values(X):
    return np.asfortranarray(np.sin(X) * 3.0 + np.arange(X.shape[1]))


@pytest.mark.parametrize("fmt,dts,masked", CASES)
def test_read_equals_netcdf4(ensemble, fmt, dts, masked):
    paths, cfg = ensemble(fmt, dts, n=3)
    lay = _layout(paths, cfg, masked)
    with EnsembleFiles(paths, lay) as ef:
        X = ef.read()
    assert X.flags.f_contiguous and X.dtype == np.float64 and X.shape == (lay.n_rows, 3)
    np.testing.assert_array_equal(X, netcdf4_X(paths, lay))


@pytest.mark.parametrize("threads,chunk_kb", [(1, 1024), (3, 4), (2, 64)])
def test_threads_and_request_sizes_give_the_same_X(ensemble, threads, chunk_kb):
    paths, cfg = ensemble("cdf5", ("f8", "f4"), n=5)
    lay = _layout(paths, cfg, True)
    with EnsembleFiles(paths, lay, config=IOConfig(threads=threads, chunk_kb=chunk_kb)) as ef:
        X = ef.read()
    np.testing.assert_array_equal(X, netcdf4_X(paths, lay))


@pytest.mark.parametrize("method", [None, UpdateMethod.LOG, UpdateMethod.SHADOW])  # None: unsafe
@pytest.mark.parametrize("fmt,dts,masked", [c for c in CASES if c[0] in ("nc4", "cdf5")])
def test_update_in_place(ensemble, tmp_path, fmt, dts, masked, method):
    import xarray as xr

    paths, cfg = ensemble(fmt, dts, n=3)
    lay = _layout(paths, cfg, masked)
    before = [bytes_outside_state(p, lay) for p in paths]
    attrs = []
    for p in paths:
        with netCDF4.Dataset(p) as ds:
            attrs.append({n: {k: ds[n].getncattr(k) for k in ds[n].ncattrs()} for n in ds.variables} | {"": {k: ds.getncattr(k) for k in ds.ncattrs()}})
    os.chmod(paths[1], 0o640)
    stats = [os.stat(p) for p in paths]
    safe = method is not None
    cfg_io = IOConfig(chunk_kb=16, safe_update=SafeUpdateConfig(log_dir=str(tmp_path / "wal"),
                                                                method=method or UpdateMethod.AUTO))
    with EnsembleFiles(paths, lay, mode="r+", config=cfg_io) as ef:
        assert ef.update_method is (method or UpdateMethod.SHADOW)  # auto: shadow files fit these
        X = ef.read()
        Xn = _new_values(X)
        want = [expected_after_update(p, lay, Xn[:, m]) for m, p in enumerate(paths)]
        st = ef.update(Xn, safe=safe)
        assert st.safe is safe and st.nbytes == ef.state_bytes * 3
        X2 = ef.read()  # after a shadow update, from the new files
    for m, p in enumerate(paths):
        now = os.stat(p)
        # In place (the log, unsafe) or a new file in its place (shadow), with the file's mode.
        assert (now.st_ino == stats[m].st_ino) is (method is not UpdateMethod.SHADOW)
        assert (now.st_mode, now.st_uid, now.st_gid, now.st_size) == (stats[m].st_mode, stats[m].st_uid, stats[m].st_gid,
                                                                      stats[m].st_size)
        assert bytes_outside_state(p, lay) == before[m]  # auxiliary variables and metadata byte-identical
        with netCDF4.Dataset(p) as ds:
            ds.set_auto_maskandscale(False)
            for name, arr in want[m].items():
                np.testing.assert_array_equal(ds[name][:], arr)  # masked-out points keep their values too
            got = {n: {k: ds[n].getncattr(k) for k in ds[n].ncattrs()} for n in ds.variables} | {"": {k: ds.getncattr(k) for k in ds.ncattrs()}}
            assert repr(got) == repr(attrs[m])
        with xr.open_dataset(p) as xds:
            np.testing.assert_array_equal(xds[lay.names[0]].values.astype(want[m][lay.names[0]].dtype), want[m][lay.names[0]])
    np.testing.assert_array_equal(X2, netcdf4_X(paths, lay))
    assert not list((tmp_path / "wal").glob("*.log"))  # the log space is freed on close
    assert not [f for f in os.listdir(os.path.dirname(paths[0])) if f.startswith(".enkflow-") or ".enkflow-new-" in f]


def test_safe_and_unsafe_updates_give_identical_files(ensemble):
    pa, cfg = ensemble("cdf2", ("f4", "f8"), n=3)
    pb, _ = ensemble("cdf2", ("f4", "f8"), n=3)
    lay = _layout(pa, cfg, True)
    for paths, safe in ((pa, True), (pb, False)):
        with EnsembleFiles(paths, lay, mode="r+") as ef:
            ef.update(_new_values(ef.read()), safe=safe)
    for a, b in zip(pa, pb):
        assert open(a, "rb").read() == open(b, "rb").read()


def test_chunked_compressed_variables_use_the_library(ensemble, capfd):
    paths, cfg = ensemble("nc4", ("f8", "f4"), n=3, chunked=True)
    lay = _layout(paths, cfg, True)
    with EnsembleFiles(paths, lay, mode="r+") as ef:
        assert ef.update_method is UpdateMethod.LOG  # auto: a library write cannot go into a shadow
        X = ef.read()
        np.testing.assert_array_equal(X, netcdf4_X(paths, lay))
        Xn = _new_values(X)
        want = [expected_after_update(p, lay, Xn[:, m]) for m, p in enumerate(paths)]
        ef.update(Xn, safe=True)
    err = capfd.readouterr().err
    assert "notice" in err and "NetCDF library" in err and "chunked" in err
    for m, p in enumerate(paths):
        with netCDF4.Dataset(p) as ds:
            ds.set_auto_maskandscale(False)
            for name, arr in want[m].items():
                np.testing.assert_array_equal(ds[name][:], arr)


def test_mean_and_spread_files(ensemble, tmp_path):
    import xarray as xr

    from enkflow.io import write_mean_spread

    paths, cfg = ensemble("cdf5", ("f8", "f4"), n=4)
    lay = _layout(paths, cfg, True)
    with EnsembleFiles(paths, lay) as ef:
        X = ef.read()
    write_mean_spread(X, lay, tmp_path / "mean.nc", tmp_path / "spread.nc")
    fields_mean = lay.to_fields(X.mean(axis=1))
    fields_sd = lay.to_fields(X.std(axis=1, ddof=1))
    with xr.open_dataset(tmp_path / "mean.nc") as m, xr.open_dataset(tmp_path / "spread.nc") as s:
        assert m.attrs["Conventions"] == "CF-1.8"
        for name in lay.names:
            np.testing.assert_allclose(m[name].values, fields_mean[name], equal_nan=True)
            np.testing.assert_allclose(s[name].values, fields_sd[name], equal_nan=True)
            assert m[name].attrs["cell_methods"] == "member: mean"
            assert s[name].attrs["cell_methods"] == "member: standard_deviation"
        assert m["lon"].attrs["standard_name"] == "longitude" and "lat" in m.coords


def test_row_ranges_and_the_streamed_mean_and_spread(ensemble):
    """read_rows reads any row range; the initial ensemble's statistics streamed in row blocks of every member
    are bitwise those of the whole ensemble in memory (here 3 blocks of 65536 rows)."""
    from enkflow.experiment.initial_statistics import streamed_mean_spread
    from enkflow.io.meanspread import ensemble_mean_spread

    paths, cfg = ensemble("cdf5", ("f8", "f4"), n=3, mb=1.6)
    lay = _layout(paths, cfg, False)
    with EnsembleFiles(paths, lay) as ef:
        X = ef.read()
        assert lay.n_rows > 2 * 65536
        np.testing.assert_array_equal(ef.read_rows(65530, 65547), X[65530:65547])
        assert ef.read_rows(7, 7).shape == (0, 3)
        with pytest.raises(InputError, match=r"rows \[5, 2\)"):
            ef.read_rows(5, 2)
        want = ensemble_mean_spread(X)
        for got in (streamed_mean_spread(ef, max_bytes=1), streamed_mean_spread(ef)):
            assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))


def test_x_shape_and_mode_are_checked(ensemble):
    from enkflow.errors import FileFormatError, InputError

    paths, cfg = ensemble("nc4", n=2)
    lay = _layout(paths, cfg, False)
    with EnsembleFiles(paths, lay) as ef:
        with pytest.raises(InputError, match="Fortran order"):
            ef.read(np.zeros((lay.n_rows, 2)))
        with pytest.raises(InputError, match="shape"):
            ef.read(np.zeros((lay.n_rows, 3), order="F"))
        with pytest.raises(FileFormatError, match="read-only"):
            ef.update(np.zeros((lay.n_rows, 2), order="F"))
