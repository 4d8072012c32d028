"""The shim answers the netCDF calls it intercepts as libnetcdf answers them on a file holding the same
values: the same status codes (valid and invalid hyperslabs, NULL start or count, a count so large that
start + count wraps around), the same values, several handles of one restart, and everything else (other
variables, define mode, closes) passed through; and writes (tiles out of order, a scalar, int64, invalid
writes) give the same codes and leave what libnetcdf leaves in the file. The documented refusals (another memory type, strides,
partial writes) are tested in test_intercept.py. Each test runs with the fields in the wrapper's memfd
(as through TCP), in place (read from a store, written to a slot, each field in two extents) and in a
kept state (read and written in the slot)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.online.fields import Field

from intercept_helpers import ShimMemory

DATA = Path(__file__).parent / "data"
VALUES = 1000.0 + np.arange(24.0)
LAYOUTS = ("memfd", "in_place", "kept")


def _restart(path: Path, x: np.ndarray) -> Path:
    # Classic format: libnetcdf's status for a write to a read-only netCDF-4 file is an HDF5 error (-101).
    with netCDF4.Dataset(path, "w", format="NETCDF3_64BIT_OFFSET") as ds:
        ds.createDimension("y", 4)
        ds.createDimension("x", 6)
        ds.createDimension("k", 3)
        ds.createVariable("x", "f8", ("y", "x"))[:] = x.reshape(4, 6)
        ds.createVariable("other", "f8", ("k",))[:] = 7.0
    return path


def _compile(directory: Path, name: str) -> Path:
    exe = directory / name
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "netcdf"], capture_output=True, text=True,
                           check=True).stdout.split()
    subprocess.run(["cc", "-O1", "-o", str(exe), str(DATA / f"{name}.c"), *flags], check=True)
    return exe


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    return _compile(tmp_path_factory.mktemp("same"), "intercept_same_as_libnetcdf")


@pytest.mark.parametrize("how", LAYOUTS)
def test_intercepted_reads_answer_as_libnetcdf(native_build, program: Path, tmp_path: Path, how: str) -> None:
    plain = subprocess.run([str(program), str(_restart(tmp_path / "plain.nc", VALUES))], capture_output=True,
                           text=True, timeout=60)
    assert plain.returncode == 0, plain.stderr
    restart = _restart(tmp_path / "restart.nc", np.zeros(24))  # the state comes from the segment
    memory = ShimMemory([Field("x", "float64", (4, 6))], how, tmp_path)
    memory.set_state("x", VALUES)
    seg = memory.seg
    seg.reset(1, 1, 6, 1)
    env = dict(os.environ, LD_PRELOAD=str(native_build.lib / "libenkflow_intercept.so"),
               ENKFLOW_INTERCEPT_FD=str(seg.fd), ENKFLOW_INTERCEPT_PATH=str(restart.resolve()))
    shim = subprocess.run([str(program), str(restart)], env=env, pass_fds=(seg.fd,), capture_output=True, text=True,
                          timeout=60)
    memory.close()
    assert shim.returncode == 0, f"the model died under the shim ({shim.returncode}):\n{shim.stderr}"
    want, got = plain.stdout.splitlines(), shim.stdout.splitlines()
    assert "vara 0 1008 1009 1010 1014 1015 1016" in want  # the program did read the values
    diff = [f"libnetcdf: {w!r}  shim: {g!r}" for w, g in zip(want, got) if w != g]
    assert not diff and len(want) == len(got), "\n".join(diff) + "\n" + shim.stderr
    assert "start 1 + count 18446744073709551615 in dimension 1 of 6" in shim.stderr
    assert "no start index (NULL)" in shim.stderr


def _write_restart(path: Path) -> Path:
    with netCDF4.Dataset(path, "w", format="NETCDF3_64BIT_DATA") as ds:
        ds.createDimension("y", 4)
        ds.createDimension("x", 6)
        ds.createDimension("k", 3)
        ds.createVariable("x", "f8", ("y", "x"))[:] = 5.0
        ds.createVariable("s", "f4", ())[...] = 1.0
        ds.createVariable("n", "i8", ("k",))[:] = 0
        ds.createVariable("other", "f8", ("k",))[:] = 7.0
    return path


@pytest.mark.parametrize("how", LAYOUTS)
def test_intercepted_writes_answer_as_libnetcdf(native_build, tmp_path: Path, how: str) -> None:
    exe = _compile(tmp_path, "intercept_writes_as_libnetcdf")
    plain = subprocess.run([str(exe), str(_write_restart(tmp_path / "plain.nc"))], capture_output=True, text=True,
                           timeout=60)
    assert plain.returncode == 0, plain.stderr
    restart = _write_restart(tmp_path / "restart.nc")
    before = restart.read_bytes()
    memory = ShimMemory([Field("x", "float64", (4, 6)), Field("s", "float32", ()), Field("n", "int64", (3,), assimilated=False)],
                        how, tmp_path)
    memory.set_state("x", np.full(24, 5.0))
    memory.set_state("s", np.ones(1, np.float32))
    seg = memory.seg
    seg.reset(1, 1, 6, 1)
    env = dict(os.environ, LD_PRELOAD=str(native_build.lib / "libenkflow_intercept.so"),
               ENKFLOW_INTERCEPT_FD=str(seg.fd), ENKFLOW_INTERCEPT_PATH=str(restart.resolve()))
    shim = subprocess.run([str(exe), str(restart)], env=env, pass_fds=(seg.fd,), capture_output=True, text=True,
                          timeout=60)
    try:
        assert shim.returncode == 0, f"the model died under the shim ({shim.returncode}):\n{shim.stderr}"
        want, got = plain.stdout.splitlines(), shim.stdout.splitlines()
        assert "n 1 -2 3000000000000" in want and "put_bad_varid -49" in want, want
        diff = [f"libnetcdf: {w!r}  shim: {g!r}" for w, g in zip(want, got) if w != g]
        assert not diff and len(want) == len(got), "\n".join(diff) + "\n" + shim.stderr
        assert "x -0 -1.5 -3 -4.5 -6 -7.5 -9 -10.5 -12 -13.5 -15 -16.5 3 3.25 3.5 3.75 4 4.25 4.5 4.75 5 5.25 5.5 5.75" in got
        assert np.array_equal(memory.forecast("x"), 0.25 * np.arange(24)) and list(seg.records["complete"]) == [1, 1, 1]
        assert list(seg.records["generations"]) == [2, 1, 1]
        assert restart.read_bytes() == before  # the forecast went into the segment only
    finally:
        memory.close()
