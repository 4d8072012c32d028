"""The growing files (``output.file`` without ``{time}``): one per field and per field and window,
opened by ``xarray.open_dataset`` as ``(time, member, ...)``; a writer killed with SIGKILL at random
moments leaves a file that opens and holds every time completed before, and a restarted writer continues."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from enkflow.errors import ConfigError
from enkflow.io.netcdf3 import read_header
from enkflow.output import Output, OutputError

xr = pytest.importorskip("xarray")

NY, NX, N = 6, 7, 4


def config(d: Path, **over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "directory": str(d), "members": N,
        "dims": {"y": {"size": NY, "start": 0.0, "step": 500.0, "units": "m", "axis": "Y"},
                 "x": {"size": NX, "start": 0.0, "step": 500.0, "units": "m", "axis": "X"}},
        "fields": {"u": {"dims": ["y", "x"], "units": "K", "dtype": "float64"},
                   "s": {"dims": ["x"], "ensemble": False, "dtype": "float32"}},
    }
    cfg.update(over)
    return cfg


def field(t: float, m: int, shape: tuple[int, ...] = (NY, NX)) -> np.ndarray:
    return np.random.default_rng(int(1000 * t) + m).standard_normal(shape)


def add_time(out: Output, t: float, members: list[int] | None = None) -> None:
    """Time ``t`` of ``members`` (all) of u, and s with the first of them."""
    for m in members or range(1, N + 1):
        out.add("u", field(t, m), time=t, member=m)
    if not members or 1 in members:
        out.add("s", field(t, 0, (NX,)), time=t)


def check_u(path: Path, times: list[float]) -> None:
    """``path`` opens with xarray and holds exactly ``times``, in order, each with its members, mean and spread."""
    with xr.open_dataset(path, decode_times=False) as ds:
        assert ds["u"].dims == ("time", "member", "y", "x") and ds["u_mean"].dims == ("time", "y", "x")
        assert list(ds["time"].values) == times and list(ds["member"].values) == list(range(1, N + 1))
        for k, t in enumerate(times):
            X = np.stack([field(t, m) for m in range(1, N + 1)])
            np.testing.assert_array_equal(ds["u"].values[k], X)
            np.testing.assert_allclose(ds["u_mean"].values[k], X.mean(0), rtol=0, atol=1e-14)
            np.testing.assert_allclose(ds["u_spread"].values[k], X.std(0, ddof=1), rtol=1e-13, atol=1e-14)


def test_one_file_per_field_grows_along_time_and_a_restart_continues(tmp_path: Path) -> None:
    d = tmp_path / "out"
    cfg = config(d, windows=[{"name": "day", "length": 24.0}], reductions={"total": "numpy:sum"})
    with Output(cfg) as out:
        add_time(out, 0.0)
        add_time(out, 6.0, [1, 2])  # completed after time 12: its record comes first, counted once whole
        add_time(out, 12.0)
        add_time(out, 6.0, [3, 4])
    check_u(d / "u.nc", [0.0, 6.0, 12.0])
    with Output(cfg) as out:  # a restarted run: time 12 again (written in place), then on
        for t in (12.0, 18.0, 24.0, 30.0):
            add_time(out, t)
    check_u(d / "u.nc", [0.0, 6.0, 12.0, 18.0, 24.0, 30.0])
    assert sorted(p.name for p in d.iterdir()) == [".checkpoint", "s.nc", "s_day.nc", "u.nc", "u_day.nc"]
    with xr.open_dataset(d / "u.nc", decode_times=False) as ds:
        assert "realization" not in ds.variables and ds["member"].attrs["standard_name"] == "realization"
        np.testing.assert_allclose(ds["u_total"].values, ds["u_mean"].values.sum(axis=(1, 2)), rtol=1e-12)
        assert ds["y"].attrs["units"] == "m" and ds["u"].attrs["units"] == "K"
    with xr.open_dataset(d / "s.nc", decode_times=False) as ds:
        assert ds["s"].dims == ("time", "x") and ds["s"].dtype == np.float32
        np.testing.assert_array_equal(ds["s"].values[4], field(24.0, 0, (NX,)).astype(np.float32))
    with xr.open_dataset(d / "u_day.nc", decode_times=False) as ds:
        means = np.stack([np.mean([field(t, m) for m in range(1, N + 1)], axis=0) for t in (0.0, 6.0, 12.0, 18.0)])
        assert list(ds["time"].values) == [12.0] and list(ds["window_complete"].values) == [1]
        np.testing.assert_allclose(ds["u_mean"].values[0], means.mean(0), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(ds["u_max"].values[0], means.max(0), rtol=0, atol=1e-14)


def test_a_failed_time_leaves_no_gap_and_other_settings_are_refused(tmp_path: Path) -> None:
    d = tmp_path / "out"
    out = Output(config(d))
    add_time(out, 0.0)
    out.add("u", np.full((NY, NX), np.nan), time=6.0, member=1)  # nan = "error": time 6 is not written
    add_time(out, 12.0)
    with pytest.raises(OutputError, match="NaN"):
        out.close()
    check_u(d / "u.nc", [0.0, 12.0])
    with pytest.raises(OutputError, match=r"u.nc.*other output settings.*move it away"):
        with Output(config(d, members=N + 1)) as out:
            out.add("u", field(18.0, 1), time=18.0, member=1)
    with pytest.raises(ConfigError, match=r"compression = 'zlib' needs one NetCDF-4 file per time"):
        Output(config(d, compression="zlib"))


def test_records_complete_out_of_order_and_a_gap_is_closed_at_the_end(tmp_path: Path) -> None:
    """RecordFile alone: the count is the complete prefix at every moment; a time given back below
    complete ones is filled by the highest of them at close."""
    from enkflow.output.config import OutputConfig
    from enkflow.output.series import open_field_series

    cfg = OutputConfig.model_validate(config(tmp_path))
    path = tmp_path / "u.nc"
    rf = open_field_series(path, cfg, "u", {}, {})
    for t in (0.0, 6.0, 12.0, 18.0):
        r = rf.record(t)
        rf.write(r, "u", (), np.stack([field(t, m) for m in range(1, N + 1)]))
    seen = []
    for t in (12.0, 0.0, 18.0):
        rf.commit(t)
        with xr.open_dataset(path, decode_times=False) as ds:
            seen.append(list(ds["time"].values))
    assert seen == [[], [0.0], [0.0]]  # 6 is still open: 12 and 18 wait behind it
    rf.release(6.0)  # time 6 failed
    rf.close()
    with xr.open_dataset(path, decode_times=False) as ds:
        assert list(ds["time"].values) == [0.0, 18.0, 12.0]
        for k, t in enumerate((0.0, 18.0, 12.0)):
            np.testing.assert_array_equal(ds["u"].values[k], np.stack([field(t, m) for m in range(1, N + 1)]))
    empty = open_field_series(tmp_path / "e.nc", cfg, "u", {}, {})
    empty.record(0.0)
    empty.release(0.0)
    empty.close()
    with xr.open_dataset(tmp_path / "e.nc", decode_times=False) as ds:
        assert ds.sizes["time"] == 0


MODEL = """
import sys, numpy as np
sys.path.insert(0, {tests!r})
from test_output_series import add_time, config
from enkflow.output import Output
out = Output(config({d!r}, fields={{"u": {{"dims": ["y", "x"], "dtype": "float64"}}}}, writer_nice=0))
print(out._channels[0].writer.pid, flush=True)
try:
    for k in range(100000):
        for m in range(1, 5):
            out.add("u", __import__("test_output_series").field(float(k), m), time=float(k), member=m)
        if k % 10 == 9:
            out.sync()
            print(k + 1, flush=True)
except Exception:
    pass
"""


def test_kill_9_of_the_writer_mid_append_leaves_every_completed_time(tmp_path: Path) -> None:
    """A real writer process, killed at random moments while it appends: the file opens with xarray and holds
    the times 0..n-1 whole, n at least the times the model saw synced; a restarted writer appends after them."""
    rng = random.Random(24)
    mid_append = 0
    for trial in range(3):
        d = tmp_path / f"trial{trial}"
        model = subprocess.Popen([sys.executable, "-c", MODEL.format(tests=str(Path(__file__).parent), d=str(d))],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert model.stdout is not None
            wpid = int(model.stdout.readline())
            synced = int(model.stdout.readline())  # at least one sync before the kill: a lower bound to check
            time.sleep(rng.uniform(0.0, 0.3))
            os.kill(wpid, signal.SIGKILL)
            lines = model.stdout.read().split()
            synced = max([synced] + [int(x) for x in lines])
        finally:
            model.kill()
            model.wait()
        with xr.open_dataset(d / "u.nc", decode_times=False) as ds:
            n = ds.sizes["time"]
        assert n >= synced
        header, size = read_header(str(d / "u.nc"))
        records_start = min(v.begin for v in header.variables.values() if v.is_record)
        per_record = sum(math.prod(v.shape[1:]) * v.dtype.itemsize for v in header.variables.values() if v.is_record)
        mid_append += size > records_start + n * per_record  # values of the next time were in when it died
        cfg = config(d, fields={"u": {"dims": ["y", "x"], "dtype": "float64"}})
        with Output(cfg) as out:
            for t in (float(n), n + 1.0):
                for m in range(1, N + 1):
                    out.add("u", field(t, m), time=t, member=m)
        check_u(d / "u.nc", [float(k) for k in range(n + 2)])
    assert mid_append, "no kill fell inside an append"
