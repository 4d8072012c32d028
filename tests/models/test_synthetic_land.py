"""The synthetic global land problem (Zheng et al. 2020) and ``enkflow synth``."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import h5py
import netCDF4
import numpy as np
import pytest

from enkflow.errors import EnkflowError, InputError
from enkflow.models import synthetic_land as sl
from enkflow.models import synthetic_land_files as slf
from enkflow.obs.obsfile import read_obs_file

TINY = sl.LonLatGrid.for_size("tiny")


def _direct(grid: sl.LonLatGrid, i: int, j: int, shift: float = 0.0) -> float:
    """The issue's formula evaluated point by point with math."""
    dx, dy = 2 * math.pi / grid.n_x, math.pi / grid.n_y
    return math.sin(-3 + 4 * i * dx / (2 * math.pi - dx) + shift) ** 2 * math.cos(-2 + 4 * j * dy / (math.pi - dy)) ** 3


# --- grid, mask, fields -----------------------------------------------------------------------


def test_grid_cell_centres() -> None:
    g = sl.LonLatGrid(4, 2)
    np.testing.assert_array_equal(g.lon, [-135.0, -45.0, 45.0, 135.0])
    np.testing.assert_array_equal(g.lat, [-45.0, 45.0])
    assert g.dx == pytest.approx(math.pi / 2) and g.dy == pytest.approx(math.pi / 2)
    assert sl.Size.MEDIUM.shape == (3600, 1800) and sl.Size.LARGE.shape == (7200, 3600)


def test_truth_at_known_points() -> None:
    g = sl.LonLatGrid(3600, 1800)
    # Corners of the index range: the sine argument runs from -3 to 1, the cosine's from -2 to 2.
    assert sl.truth(g, np.array(0), np.array(0)) == pytest.approx(math.sin(-3) ** 2 * math.cos(-2) ** 3, rel=1e-14)
    assert sl.truth(g, np.array(3599), np.array(1799)) == pytest.approx(math.sin(1) ** 2 * math.cos(2) ** 3, rel=1e-13)
    i = np.array([0, 17, 1800, 3599, 2500])
    j = np.array([0, 900, 1799, 5, 1234])
    expect = [_direct(g, a, b) for a, b in zip(i, j)]
    np.testing.assert_allclose(sl.truth(g, i, j), expect, rtol=1e-13, atol=1e-15)
    # i dx / (2pi - dx) = i / (n_x - 1), so on n_x = 5 the sine's argument is 0 at i = 3.
    assert sl.truth(sl.LonLatGrid(5, 4), np.array(3), np.array(1)) == pytest.approx(0.0, abs=1e-30)


def test_member_field_is_the_formula_with_shift() -> None:
    ii, jj = np.meshgrid(np.arange(TINY.n_x), np.arange(TINY.n_y))
    f = sl.member_field(TINY, ii, jj, 0.3)
    assert f.shape == (TINY.n_y, TINY.n_x) and f.dtype == np.float64
    dx, dy = TINY.dx, TINY.dy
    vec = np.sin(-3 + 4 * ii * dx / (2 * np.pi - dx) + 0.3) ** 2 * np.cos(-2 + 4 * jj * dy / (np.pi - dy)) ** 3
    np.testing.assert_array_equal(f, vec)  # same operands per factor, so the same bits
    assert abs(f).max() <= 1.0
    np.testing.assert_array_equal(sl.member_field(TINY, ii, jj, 0.0), sl.truth(TINY, ii, jj))


def test_index_validation() -> None:
    with pytest.raises(InputError, match="index i must lie in 0..71") as e:
        sl.truth(TINY, np.array([0, 72]), np.array([0, 0]))
    assert e.value.index == 1
    with pytest.raises(InputError, match="integer"):
        sl.truth(TINY, np.array([0.5]), np.array([0]))
    with pytest.raises(InputError, match="n_x"):
        sl.LonLatGrid(1, 10)


def test_land_counts_small_sizes() -> None:
    assert sl.land_mask(TINY).shape == (36, 72)
    assert sl.land_points(TINY).n_land == 877
    assert sl.land_points(sl.LonLatGrid.for_size("small")).n_land == 21546


@pytest.mark.slow
def test_land_count_medium_matches_issue() -> None:
    # 3600 x 1800 cell centres give 2,149,692 land points (the paper's medium: 2,127,104).
    mask = sl.land_mask(sl.LonLatGrid.for_size("medium"))
    assert int(mask.sum()) == 2_149_692


def test_land_points_order_and_coordinates() -> None:
    p = sl.land_points(TINY)
    flat = p.j.astype(np.int64) * TINY.n_x + p.i
    assert (np.diff(flat) > 0).all()  # latitude-major, south to north
    assert p.i.dtype == np.int32 and p.j.dtype == np.int32
    np.testing.assert_array_equal(p.lon, TINY.lon[p.i])
    np.testing.assert_array_equal(p.lat, TINY.lat[p.j])
    from global_land_mask import globe

    assert globe.is_land(p.lat, p.lon).all()


def test_member_shift_seeded_and_in_range() -> None:
    s = [sl.member_shift(7, k) for k in range(1, 201)]
    assert all(-0.5 <= v <= 0.5 for v in s)
    assert len(set(s)) == 200
    assert sl.member_shift(7, 5) == s[4]  # independent of how many members are drawn, or in what order
    assert sl.member_shift(8, 5) != s[4]
    with pytest.raises(InputError, match="start at 1"):
        sl.member_shift(7, 0)


def test_observation_error_statistics() -> None:
    n = 200_000
    t = np.linspace(-1, 1, n)
    o = sl.sample_observations(t, fraction=0.1, std=0.25, seed=3)
    assert o.n_obs == 20_000
    assert o.state_index.dtype == np.int64 and (np.diff(o.state_index) > 0).all()
    err = o.values - t[o.state_index]
    # Sample mean and std of 20,000 N(0, 0.25^2) draws: 5-sigma bands.
    assert abs(err.mean()) < 5 * 0.25 / math.sqrt(o.n_obs)
    assert abs(err.std() - 0.25) < 5 * 0.25 / math.sqrt(2 * o.n_obs)
    np.testing.assert_array_equal(o.error_std, 0.25)
    again = sl.sample_observations(t, fraction=0.1, std=0.25, seed=3)
    np.testing.assert_array_equal(again.values, o.values)
    np.testing.assert_array_equal(again.state_index, o.state_index)
    assert not np.array_equal(sl.sample_observations(t, seed=4).state_index, o.state_index)


@pytest.mark.parametrize(("fraction", "n_obs"), [(2.5, 2 * 877 + 438), (3.0, 3 * 877), (1.001, 877 + 1)])
def test_more_observations_than_points(fraction: float, n_obs: int) -> None:
    """F > 1: every point floor(F) times, a random F - floor(F) of them once more, sorted, own errors."""
    t = np.linspace(-1, 1, 877)
    o = sl.sample_observations(t, fraction=fraction, std=0.25, seed=3)
    assert o.n_obs == sl.n_observations(877, fraction) == n_obs
    assert (np.diff(o.state_index) >= 0).all() and o.state_index[0] >= 0 and o.state_index[-1] < 877
    counts = np.bincount(o.state_index, minlength=877)
    whole = math.floor(fraction)
    assert set(counts.tolist()) <= {whole, whole + 1} and int((counts > whole).sum()) == n_obs - whole * 877
    first = o.values[np.searchsorted(o.state_index, np.arange(877))]  # one observation of each point
    assert not np.array_equal(first, o.values[np.searchsorted(o.state_index, np.arange(877), side="right") - 1])
    np.testing.assert_array_equal(sl.sample_observations(t, fraction=fraction, std=0.25, seed=3).values, o.values)


@pytest.mark.parametrize(("kw", "item"), [({"fraction": 0.0}, "obs_fraction"), ({"fraction": math.inf}, "obs_fraction"),
                                          ({"std": 0.0}, "obs_std"), ({"std": float("nan")}, "obs_std"),
                                          ({"seed": -1}, "seed")])
def test_observation_bad_parameters(kw: dict, item: str) -> None:
    with pytest.raises(InputError) as e:
        sl.sample_observations(np.zeros(10), **kw)
    assert e.value.item == item


# --- files --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> slf.SynthResult:
    return slf.generate(tmp_path_factory.mktemp("synth"), size="tiny", members=4, seed=11)


def _structure(path: Path) -> dict:
    with netCDF4.Dataset(path) as ds:
        return {
            "dims": {k: len(d) for k, d in ds.dimensions.items()},
            "vars": {k: (v.dimensions, v.dtype.str, v.chunking(), v.filters()) for k, v in ds.variables.items()},
            "attrs": sorted(ds.ncattrs()),
        }


def test_members_share_structure_and_offsets(tiny_run: slf.SynthResult) -> None:
    paths = [*tiny_run.member_paths, tiny_run.truth_path]
    ref = _structure(paths[0])
    assert ref["dims"] == {"land": 877, "lon": 72, "lat": 36}
    assert set(ref["vars"]) == {"soil_moisture", "lon", "lat", "land_lon", "land_lat", "land_i", "land_j", "patch_fraction"}
    assert ref["vars"]["soil_moisture"][2] == "contiguous"
    assert not any(ref["vars"]["soil_moisture"][3].get(f) for f in ("zlib", "shuffle", "szip", "zstd", "bzip2", "blosc"))
    offsets = set()
    for p in paths:
        assert _structure(p) == ref, p
        with h5py.File(p, "r") as h:
            offsets.add(tuple(h[v].id.get_offset() for v in ("soil_moisture", "patch_fraction", "land_lon")))
    assert len(offsets) == 1 and None not in next(iter(offsets))


def test_member_contents(tiny_run: slf.SynthResult) -> None:
    p = sl.land_points(TINY)
    with netCDF4.Dataset(tiny_run.truth_path) as ds:
        assert ds.member == 0
        np.testing.assert_array_equal(ds["soil_moisture"][:], sl.truth(TINY, p.i, p.j))
        patch = ds["patch_fraction"][:]
    for k, path in enumerate(tiny_run.member_paths, start=1):
        with netCDF4.Dataset(path) as ds:
            assert ds.member == k and ds.source == "enkflow synth" and ds.Conventions == "CF-1.8"
            assert ds.member_shift == sl.member_shift(11, k)
            np.testing.assert_array_equal(ds["soil_moisture"][:], sl.member_field(TINY, p.i, p.j, ds.member_shift))
            np.testing.assert_array_equal(ds["land_i"][:], p.i)
            np.testing.assert_array_equal(ds["land_j"][:], p.j)
            np.testing.assert_array_equal(ds["land_lon"][:], p.lon)
            np.testing.assert_array_equal(ds["land_lat"][:], p.lat)
            np.testing.assert_array_equal(ds["patch_fraction"][:], patch)
            assert ds["soil_moisture"].units == "1" and ds["land_lon"].units == "degrees_east"
    assert not list(tiny_run.out_dir.glob(".*.tmp"))


def test_obs_file_matches_truth(tiny_run: slf.SynthResult) -> None:
    f = read_obs_file(tiny_run.obs_path, n_state=tiny_run.n_land)
    assert f.n_obs == tiny_run.n_obs == round(0.1 * 877)
    with netCDF4.Dataset(tiny_run.truth_path) as ds:
        t = ds["soil_moisture"][:]
        lon, lat = ds["land_lon"][:], ds["land_lat"][:]
    np.testing.assert_array_equal(f.obs.coords[:, 0], lon[f.state_index])
    np.testing.assert_array_equal(f.obs.coords[:, 1], lat[f.state_index])
    np.testing.assert_array_equal(f.obs.error_var, 0.0625)
    assert np.abs(f.obs.values - t[f.state_index]).max() < 6 * 0.25
    assert f.attrs["n_state"] == 877 and f.attrs["state_variable"] == "soil_moisture"


def test_obs_file_with_more_observations_than_points(tmp_path: Path) -> None:
    """obs_fraction 2.5: 2.5 observations per land point in the file, sorted by state index, all located."""
    r = slf.generate(tmp_path, size="tiny", members=2, seed=11, obs_fraction=2.5)
    f = read_obs_file(r.obs_path, n_state=r.n_land)
    assert f.n_obs == r.n_obs == 2 * 877 + 438
    assert (np.diff(f.state_index) >= 0).all() and f.state_index.min() == 0 and f.state_index.max() == 876
    with netCDF4.Dataset(r.truth_path) as ds:
        np.testing.assert_array_equal(f.obs.coords[:, 1], ds["land_lat"][:][f.state_index])


def test_reproducible_and_member_count_independent(tiny_run: slf.SynthResult, tmp_path: Path) -> None:
    r = slf.generate(tmp_path, size="tiny", members=2, seed=11)
    for a, b in [(r.member_paths[0], tiny_run.member_paths[0]), (r.member_paths[1], tiny_run.member_paths[1]),
                 (r.obs_path, tiny_run.obs_path)]:
        with netCDF4.Dataset(a) as da, netCDF4.Dataset(b) as db:
            for v in da.variables:
                np.testing.assert_array_equal(da[v][:], db[v][:])
        assert a.read_bytes() == b.read_bytes()


def test_cdf5_format(tmp_path: Path) -> None:
    r = slf.generate(tmp_path, size="tiny", members=2, format="cdf5")
    with netCDF4.Dataset(r.member_paths[0]) as ds:
        assert ds.data_model == "NETCDF3_64BIT_DATA"
    assert r.member_paths[0].stat().st_size == r.member_paths[1].stat().st_size
    assert read_obs_file(r.obs_path).state_index.dtype == np.int64


def test_refuses_to_overwrite(tiny_run: slf.SynthResult) -> None:
    with pytest.raises(InputError, match="exists"):
        slf.generate(tiny_run.out_dir, size="tiny", members=2)


@pytest.mark.parametrize(("kw", "item"), [({"members": 1}, "members"), ({"members": 0}, "members"),
                                          ({"size": "huge"}, "size"), ({"format": "hdf4"}, "format"),
                                          ({"obs_fraction": 0.0}, "obs_fraction"), ({"obs_std": -1.0}, "obs_std"),
                                          ({"seed": -3}, "seed")])
def test_generate_bad_input(tmp_path: Path, kw: dict, item: str) -> None:
    args = {"size": "tiny", "members": 3} | kw
    with pytest.raises(InputError) as e:
        slf.generate(tmp_path, **args)
    assert e.value.item == item
    assert not list(tmp_path.iterdir())  # nothing written
    if item == "size":
        assert "tiny, small, medium, large" in str(e.value)


def test_atomic_output_removes_temp_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "x.nc"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with slf.atomic_output(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.nc"]


# --- command line --------------------------------------------------------------------------------


def _synth_main(argv: list[str]) -> int:
    """Run `enkflow synth` through a parser holding only this command, like enkflow.cli.main does."""
    from enkflow.cli import synth

    parser = argparse.ArgumentParser(prog="enkflow")
    synth.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except EnkflowError as exc:
        print(f"enkflow synth: error: {exc}", file=sys.stderr)
        return 2


def test_cli_end_to_end_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert _synth_main(["synth", "--size", "tiny", "--members", "3", "--out", str(out), "--seed", "5"]) == 0
    cap = capsys.readouterr()
    assert "72x36" in cap.out and "877 land points" in cap.out and "3 members" in cap.out and "88 observations" in cap.out
    assert "member 3/3 written" in cap.err
    assert sorted(p.name for p in out.iterdir()) == ["member_0001.nc", "member_0002.nc", "member_0003.nc", "obs.nc", "truth.nc"]
    with netCDF4.Dataset(out / "member_0002.nc") as ds:
        assert ds.seed == 5 and ds.member == 2


def test_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _synth_main(["synth", "--size", "tiny", "--members", "1", "--out", str(tmp_path)]) == 2
    assert "at least 2 members" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        _synth_main(["synth", "--size", "huge", "--members", "4", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def test_cli_registered_in_commands() -> None:
    from enkflow import cli

    assert "synth" in cli.COMMANDS


def test_cli_subprocess_help(subprocess_env: dict[str, str]) -> None:
    # `python -m enkflow synth --help` needs every registered sub-command importable.
    import importlib.util

    if any(importlib.util.find_spec(f"enkflow.cli.{c}") is None for c in __import__("enkflow.cli").cli.COMMANDS):
        pytest.skip("another sub-command of enkflow.cli.COMMANDS is not written yet")
    r = subprocess.run([sys.executable, "-m", "enkflow", "synth", "--help"], capture_output=True, text=True, env=subprocess_env)
    assert r.returncode == 0 and "--members" in r.stdout
