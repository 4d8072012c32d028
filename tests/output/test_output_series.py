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
from enkflow.io.netcdf3 import Header, read_header
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
    inode = (d / "u.nc").stat().st_ino
    with Output(cfg) as out:  # a restarted run: time 12 again (the same values: nothing to replace), then on
        for t in (12.0, 18.0, 24.0, 30.0):
            add_time(out, t)
    assert (d / "u.nc").stat().st_ino == inode  # appended in place, not copied
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
    out = Output(config(d))  # a rerun of time 12 with other values that fails: the file keeps the old ones
    out.add("u", np.full((NY, NX), 99.0), time=12.0, member=1)
    out.add("u", np.full((NY, NX), np.nan), time=12.0, member=2)
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


def test_a_kill_at_any_moment_of_a_rewrite_leaves_each_record_old_or_new(tmp_path: Path) -> None:
    """RecordFile alone, times 6 and 12 of a file of 0, 6, 12 written again with other values by a
    forked writer that kills itself (SIGKILL) at its k-th write, sync or rename, for every k: the file
    opens after each kill with its three times, each record entirely old or entirely new."""
    from enkflow.output.config import OutputConfig
    from enkflow.output.series import open_field_series

    cfg = OutputConfig.model_validate(config(tmp_path))
    path = tmp_path / "u.nc"
    old = {t: np.stack([field(t, m) for m in range(1, N + 1)]) for t in (0.0, 6.0, 12.0)}
    new = {t: x + 1.0 for t, x in old.items()}
    rf = open_field_series(path, cfg, "u", {}, {})
    for t, x in old.items():
        rf.write(rf.record(t), "u", (), x)
        rf.commit(t)
    rf.close()
    for k in range(1000):
        pid = os.fork()
        if pid == 0:
            _rewrite_and_die(path, cfg, new, k)
        status = os.waitpid(pid, 0)[1]
        with xr.open_dataset(path, decode_times=False) as ds:
            assert list(ds["time"].values) == [0.0, 6.0, 12.0]
            seen = [any(np.array_equal(ds["u"].values[i], v[t]) for v in (old, new)) for i, t in enumerate(old)]
        assert all(seen), (k, seen)
        if os.WIFEXITED(status):  # no k-th call: the rewrite went through
            break
        assert os.WTERMSIG(status) == signal.SIGKILL
    assert k > 10
    with xr.open_dataset(path, decode_times=False) as ds:
        np.testing.assert_array_equal(ds["u"].values, np.stack([old[0.0], new[6.0], new[12.0]]))


def _rewrite_and_die(path: Path, cfg: Any, values: dict[float, np.ndarray], k: int) -> None:
    """In a forked child: times 6 and 12 of ``values`` written again, member by member, killed at the
    ``k``-th call to a function that writes, syncs or renames; exits 0 if there are fewer calls."""
    from enkflow.output.series import open_field_series

    try:
        calls = iter(range(k, -1, -1))
        for name in ("pwrite", "fsync", "fdatasync", "replace"):
            def dying(*args: Any, _real: Any = getattr(os, name)) -> Any:
                if next(calls) == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                return _real(*args)
            setattr(os, name, dying)
        rf = open_field_series(path, cfg, "u", {}, {})
        for t in (6.0, 12.0):
            r = rf.record(t)
            for m in range(N):
                rf.write(r, "u", (m,), values[t][m])
            rf.commit(t)
        rf.sync()
        rf.close()
    finally:
        os._exit(0)


MODEL = """
import os, sys, netCDF4
sys.path.insert(0, {tests!r})
from test_output_series import N, config, field
from enkflow.output import Output, OutputError
path = os.path.join({d!r}, "u.nc")
while True:  # each writer killed by the test: a new Output continues the file after its last whole time
    n = len(netCDF4.Dataset(path).dimensions["time"]) if os.path.exists(path) else 0
    out = Output(config({d!r}, fields={{"u": {{"dims": ["y", "x"], "dtype": "float64"}}}}, writer_nice=0))
    print("start", n, out._channels[0].writer.pid, flush=True)
    try:
        for k in range(n, n + 100000):
            for m in range(1, N + 1):
                out.add("u", field(float(k), m), time=float(k), member=m)
            if k % 10 == 9:
                out.sync()
                print("synced", k + 1, flush=True)
    except OutputError:
        try:
            out.close()
        except OutputError:
            pass
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _records_end(header: Header) -> int:
    """The byte after the counted records (all of u.nc's record variables are float64: no padding)."""
    recs = [v for v in header.variables.values() if v.is_record]
    per_record = sum(math.prod(v.shape[1:]) * v.dtype.itemsize for v in recs)
    return min(v.begin for v in recs) + header.numrecs * per_record


def test_kill_9_of_the_writer_mid_append_leaves_every_completed_time(tmp_path: Path) -> None:
    """A real writer process, killed with SIGKILL at a random moment while it appends, four times over: each
    new writer finds every time the model saw synced before the kill and continues the file; in the end it
    holds the times 0..n-1, each whole."""
    rng = random.Random(24)
    d = tmp_path / "out"
    model = subprocess.Popen([sys.executable, "-c", MODEL.format(tests=str(Path(__file__).parent), d=str(d))],
                             stdout=subprocess.PIPE, text=True)
    kills = mid_append = synced = pid = 0
    armed = False
    try:
        assert model.stdout is not None
        for line in model.stdout:
            word, *rest = line.split()
            if word == "start":
                assert int(rest[0]) >= synced, "a time synced before the kill is missing"
                pid, armed = int(rest[1]), True
                if kills == 4:
                    break
            elif word == "synced" and armed:  # this writer is appending: kill it a moment later
                synced, armed = int(rest[0]), False
                time.sleep(rng.uniform(0.0, 0.2))
                os.kill(pid, signal.SIGKILL)
                kills += 1
                header, size = read_header(str(d / "u.nc"))
                mid_append += size > _records_end(header)  # values of a time not yet counted were in
            elif word == "synced":
                synced = int(rest[0])
        time.sleep(rng.uniform(0.0, 0.2))
        os.kill(pid, signal.SIGKILL)  # the fifth writer too, wherever it is
    finally:
        model.kill()
        model.wait()
    assert kills == 4 and mid_append, (kills, mid_append)
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with xr.open_dataset(d / "u.nc", decode_times=False) as ds:
        n = ds.sizes["time"]
    assert n >= synced
    check_u(d / "u.nc", [float(k) for k in range(n)])
