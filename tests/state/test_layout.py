"""StateLayout: rows, pieces, masks, coordinates, errors."""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest

from enkflow.errors import FileFormatError
from enkflow.io.generate import land_mask_config, make_ensemble
from enkflow.state import CoordAxis, MaskConfig, StateConfig, StateLayout, mask_index


@pytest.fixture
def files(tmp_path):
    paths, cfg = make_ensemble(tmp_path, 1, 0.05, n_levels=3, dtypes=("f8", "f4"))
    return paths, cfg


def test_unmasked_rows_and_pieces(files):
    paths, cfg = files
    lay = StateLayout.from_config(paths[0], cfg)
    v0, v1 = lay.variables
    assert lay.n_rows == v0.n_elems + v1.n_elems
    assert v1.row0 == v0.n_rows and v1.dtype == np.float32
    rows = []
    for p in lay.pieces(5, lay.n_rows - 3, max_rows=97):
        assert p.select is None and p.n_rows <= 97
        rows.extend(range(p.row_start, p.row_stop))
    assert rows == list(range(5, lay.n_rows - 3))


def test_masked_3d_repeats_the_mask_on_every_level(files):
    paths, cfg = files
    lay = StateLayout.from_file(paths[0], cfg.variables, mask=land_mask_config())
    with netCDF4.Dataset(paths[0]) as ds:
        land = ds["landmask"][:] == 1
    v0 = lay.variables[0]
    assert v0.n_rows == 3 * int(land.sum())
    np.testing.assert_array_equal(v0.index, np.flatnonzero(np.broadcast_to(land, v0.shape)))
    got = np.concatenate([v0.elements(p.row_start - v0.row0, p.row_stop - v0.row0) for p in lay.pieces(0, v0.n_rows, 50)])
    np.testing.assert_array_equal(got, v0.index)
    for p in lay.pieces(0, lay.n_rows, 50):
        idx = p.var.elements(p.row_start - p.var.row0, p.row_stop - p.var.row0)
        sel = np.arange(p.n_rows) if p.select is None else p.select
        np.testing.assert_array_equal(p.elem_start + sel, idx)
        assert p.elem_stop == idx[-1] + 1


def test_to_fields_round_trip_with_fill(files):
    paths, cfg = files
    lay = StateLayout.from_file(paths[0], cfg.variables, mask=land_mask_config())
    x = np.arange(lay.n_rows, dtype=float)
    f = lay.to_fields(x)
    v = lay.variables[1]
    flat = f[v.name].reshape(-1)
    np.testing.assert_array_equal(flat[v.index], x[v.rows])
    assert np.isnan(np.delete(flat, v.index)).all()


def test_lonlat_coordinates_from_cf(files):
    paths, cfg = files
    lay = StateLayout.from_config(paths[0], cfg)
    assert lay.coord_kind == "lonlat" and lay.coord_names == ("lon", "lat")
    with netCDF4.Dataset(paths[0]) as ds:
        lon, lat = ds["lon"][:], ds["lat"][:]
    v = lay.variables[0]
    k, j, i = np.unravel_index(np.arange(v.n_rows), v.shape)
    np.testing.assert_array_equal(lay.coords[v.rows, 0], lon[i])
    np.testing.assert_array_equal(lay.coords[v.rows, 1], lat[j])


def _clm_like(path, n=50):
    """A CLM-like restart: 1-D state over `land`, auxiliary coordinates and a patch fraction."""
    with netCDF4.Dataset(path, "w", format="NETCDF3_64BIT_DATA") as ds:
        ds.createDimension("land", n)
        ds.createDimension("levsoi", 4)
        sm = ds.createVariable("soil_moisture", "f8", ("land",))
        sm.coordinates = "land_lat land_lon"
        sw = ds.createVariable("h2osoi", "f8", ("land", "levsoi"))
        lo = ds.createVariable("land_lon", "f8", ("land",))
        lo.standard_name = "longitude"
        la = ds.createVariable("land_lat", "f8", ("land",))
        la.units = "degrees_north"
        pf = ds.createVariable("patch_fraction", "f8", ("land",))
        sm[:] = np.arange(n)
        sw[:] = np.arange(4 * n).reshape(n, 4)
        lo[:] = np.linspace(-170, 170, n)
        la[:] = np.linspace(-60, 70, n)
        pf[:] = 0.5


def test_clm_like_1d_state_with_aux_coordinates(tmp_path):
    p = str(tmp_path / "clm.nc")
    _clm_like(p)
    lay = StateLayout.from_config(p, StateConfig(variables=["soil_moisture"]))
    assert lay.n_rows == 50 and lay.coord_kind == "lonlat"
    np.testing.assert_allclose(lay.coords[:, 0], np.linspace(-170, 170, 50))
    np.testing.assert_allclose(lay.coords[:, 1], np.linspace(-60, 70, 50))
    lay2 = StateLayout.from_file(p, ["soil_moisture", "h2osoi"], coordinates=["land_lon", "land_lat"])
    assert lay2.n_rows == 250
    np.testing.assert_allclose(lay2.coords[50:54, 0], -170.0)  # h2osoi(land, levsoi): 4 rows per land point


def test_index_coordinates_without_cf(tmp_path):
    p = str(tmp_path / "plain.nc")
    with netCDF4.Dataset(p, "w") as ds:
        ds.createDimension("j", 3)
        ds.createDimension("i", 5)
        ds.createVariable("u", "f8", ("j", "i"), contiguous=True)[:] = 0.0
    lay = StateLayout.from_file(p, ["u"])
    assert lay.coord_kind == "index" and lay.coord_names == ("index:i", "index:j")
    np.testing.assert_array_equal(lay.coords[:6], [[0, 0], [1, 0], [2, 0], [3, 0], [4, 0], [0, 1]])


def test_coordinates_in_any_order_with_their_axes(tmp_path):
    """state.coordinates may list the axes in any order (observations at state rows do not care); the
    layout records which axis each column is, for the operators that compare them with a file's x, y, z."""
    p = str(tmp_path / "square.nc")
    with netCDF4.Dataset(p, "w") as ds:
        for d in ("depth", "y", "x"):
            ds.createDimension(d, 4)
            ds.createVariable(d, "f8", (d,))[:] = np.arange(4) * 10.0
        ds.createVariable("lat", "f8", ("y",)).units = "degrees_north"
        ds.createVariable("k", "f8", ("depth",)).positive = "down"
        ds.createVariable("c", "f8", ("depth", "y", "x"), contiguous=True)[:] = 0.0
    lay = StateLayout.from_file(p, ["c"], coordinates=["x", "y"])
    np.testing.assert_array_equal(lay.coords[:5], [[0, 0], [10, 0], [20, 0], [30, 0], [0, 10]])
    swapped = StateLayout.from_file(p, ["c"], coordinates=["y", "x"])
    np.testing.assert_array_equal(swapped.coords, lay.coords[:, ::-1])
    X, Y, Z = CoordAxis.X, CoordAxis.Y, CoordAxis.Z
    assert swapped.coord_axes == (Y, X)
    assert StateLayout.from_file(p, ["c"], coordinates=["x", "depth", "lat"]).coord_axes == (X, Z, Y)
    assert StateLayout.from_file(p, ["c"], coordinates=["k", "x"]).coord_axes == (Z, X)
    assert StateLayout.from_file(p, ["c"]).coord_axes == (X, Y)  # grid indices of the last two dims


def test_errors_name_file_and_variable(files, tmp_path):
    paths, cfg = files
    with pytest.raises(FileFormatError, match="nope") as e:
        StateLayout.from_file(paths[0], ["nope"])
    assert paths[0] in str(e.value)
    with pytest.raises(FileFormatError, match="landmask.*float32 or float64"):
        StateLayout.from_file(paths[0], ["landmask"])
    with pytest.raises(FileFormatError, match="missing_mask"):
        StateLayout.from_file(paths[0], ["var0"], mask=MaskConfig(variable="missing_mask"))
    with pytest.raises(FileFormatError, match="var0.*trailing dims"):
        StateLayout.from_file(paths[0], ["var0"], mask=MaskConfig(variable="lat", apply_to=["var0"]))
    with pytest.raises(FileFormatError, match="not found"):
        StateLayout.from_file(tmp_path / "absent.nc", ["var0"])


def test_state_config_rejects_duplicates_and_unknown_keys():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        StateConfig(variables=["a", "a"])
    with pytest.raises(ValidationError):
        StateConfig(variables=["a"], colour="red")  # type: ignore[call-arg]


def test_mask_index_broadcasts_over_leading_dims():
    m = np.array([[True, False], [False, True]])
    np.testing.assert_array_equal(mask_index(m, (2, 2, 2)), [0, 3, 4, 7])
