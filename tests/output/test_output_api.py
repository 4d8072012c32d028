"""enkflow.output through real writer processes: files, diagnostics against offline recomputation,
regions, transports, back-pressure, bad input, checkpointed windows."""

from __future__ import annotations

import itertools
import math
import os
import time
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest

from enkflow.errors import ConfigError, InputError
from enkflow.output import Output, OutputConfig, OutputError

NY, NX, N = 12, 16, 5


def config(tmp_path: Path, **over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {  # one file per time here; the growing files: test_output_series.py
        "directory": str(tmp_path / "out"), "members": N, "file": "{field}_{time:g}.nc",
        "dims": {"lat": {"size": NY, "start": -82.5, "step": 15.0, "units": "degrees_north",
                         "standard_name": "latitude", "axis": "Y"},
                 "lon": {"size": NX, "start": 0.0, "step": 22.5, "units": "degrees_east",
                         "standard_name": "longitude", "axis": "X"}},
        "fields": {"t2m": {"dims": ["lat", "lon"], "units": "K", "standard_name": "air_temperature",
                           "dtype": "float64"}},
    }
    cfg.update(over)
    return cfg


def ensemble(seed: int, times: int) -> np.ndarray:
    """(times, N, NY, NX): large offset, small spread, the case naive sums of squares get wrong."""
    rng = np.random.default_rng(seed)
    return 280.0 + 1e-3 * rng.standard_normal((times, N, NY, NX)) + rng.standard_normal((times, 1, NY, NX))


@pytest.mark.parametrize("transport", ["shm", "ipc", "tcp"])
def test_diagnostics_equal_offline_recomputation(tmp_path: Path, transport: str) -> None:
    X = ensemble(1, 3)
    rng = np.random.default_rng(7)
    buf = np.empty((NY, NX))
    with Output(config(tmp_path, transport=transport)) as out:
        for k in range(3):
            for m in rng.permutation(N) + 1:
                # Member 2 arrives in two regions; the caller's buffer is overwritten right after add.
                if m == 2:
                    buf[...] = X[k, 1]
                    out.add("t2m", buf[:5], time=6.0 * k, member=2, region=(slice(0, 5), slice(None)))
                    out.add("t2m", buf[5:], time=6.0 * k, member=2, region={"lat": 5})
                    buf[...] = -1.0
                else:
                    buf[...] = X[k, m - 1]
                    out.add("t2m", buf, time=6.0 * k, member=int(m))
                    buf[...] = np.nan
        out.sync()
        assert out.stats()["writers"][0]["files"] == 3
    for k in range(3):
        with netCDF4.Dataset(tmp_path / "out" / f"t2m_{6 * k}.nc") as ds:
            np.testing.assert_array_equal(ds["t2m"][0], X[k])
            np.testing.assert_allclose(ds["t2m_mean"][0], np.mean(X[k], axis=0), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(ds["t2m_spread"][0], np.std(X[k], axis=0, ddof=1), rtol=1e-12, atol=1e-12)
            assert float(ds["time"][0]) == 6.0 * k


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_float32_field_reduced_by_nothing_travels_as_float32_with_the_same_file(tmp_path: Path,
                                                                                  transport: str) -> None:
    """Stored as float32 with no diagnostics: the sender casts (half the bytes); the file holds what the
    writer's own cast of the float64 array gives, NaN and values beyond float32's range included."""
    X = ensemble(3, 2)
    X[0, 1, 2, 3] = np.nan
    X[1, 4, 0, 0] = 1e39
    cfg = config(tmp_path, transport=transport, diagnostics=False, nan="allow")
    cfg["fields"]["t2m"]["dtype"] = "float32"
    assert OutputConfig.model_validate(cfg).narrowed("t2m")
    with Output(cfg) as out:
        for k in range(2):
            for m in range(1, N + 1):
                out.add("t2m", X[k, m - 1], time=float(k), member=m)
        out.sync()
        assert out.stats()["bytes"] == X.size * 4
    with pytest.warns(RuntimeWarning, match="overflow"):
        expect = X.astype(np.float32)
    for k in range(2):
        with netCDF4.Dataset(tmp_path / "out" / f"t2m_{k}.nc") as ds:
            ds.set_auto_mask(False)
            np.testing.assert_array_equal(ds["t2m"][0], expect[k])
    for over in ({"diagnostics": True}, {"windows": [{"name": "day", "length": 24.0}]},
                 {"reductions": {"r": "numpy:sum"}}):
        c = {**cfg, "diagnostics": False, **over}
        assert not OutputConfig.model_validate(c).narrowed("t2m"), over  # reduced in float64: sent as given
    single = {**cfg, "diagnostics": True}
    single["fields"] = {"t2m": {**cfg["fields"]["t2m"], "ensemble": False}}
    assert OutputConfig.model_validate(single).narrowed("t2m")  # one array per time: no mean, no spread


def test_xarray_opens_the_files_and_cf_attributes(tmp_path: Path) -> None:
    xr = pytest.importorskip("xarray")
    X = ensemble(2, 1)
    with Output(config(tmp_path, compression="zstd")) as out:
        for m in range(1, N + 1):
            out.add("t2m", X[0, m - 1], time=3.0, member=m)
    path = tmp_path / "out" / "t2m_3.nc"
    with xr.open_dataset(path) as ds:
        assert ds["t2m"].dims == ("time", "member", "lat", "lon")
        assert str(ds["time"].values[0]).startswith("2000-01-01T03:00")  # decoded from "hours since 2000-01-01"
        np.testing.assert_allclose(ds["lat"].values, -82.5 + 15.0 * np.arange(NY))
        assert ds["t2m_mean"].attrs["cell_methods"] == "realization: mean"
        assert ds["t2m_spread"].attrs["cell_methods"] == "realization: standard_deviation"
        assert ds["t2m"].attrs["standard_name"] == "air_temperature" and ds["t2m"].attrs["units"] == "K"
        assert ds.attrs["Conventions"] == "CF-1.8" and "enkflow.output" in ds.attrs["history"]
        assert ds["member"].attrs["standard_name"] == "realization" and "realization" not in ds.variables
    with netCDF4.Dataset(path) as nc:
        assert nc["t2m"].filters().get("zstd")


def test_int16_packing_within_the_error_bound(tmp_path: Path) -> None:
    cfg = config(tmp_path, members=2)
    cfg["fields"]["t2m"].update(dtype="int16", pack_range=[270.0, 290.0])
    X = ensemble(3, 1)
    with Output(cfg) as out:
        for m in (1, 2):
            out.add("t2m", X[0, m - 1], time=0.0, member=m)
    with netCDF4.Dataset(tmp_path / "out" / "t2m_0.nc") as ds:
        v = ds["t2m"]
        assert v.dtype == np.int16
        bound = float(v.packing_error_bound)
        assert bound == pytest.approx(20.0 / 65534 / 2)
        err = np.abs(v[0, :2] - X[0, :2])
        assert err.max() <= bound * (1 + 1e-9)
        # The diagnostics stay float64: computed from the values added, not from the packed codes.
        np.testing.assert_allclose(ds["t2m_mean"][0], X[0, :2].mean(0), rtol=1e-12, atol=1e-12)


def test_value_outside_pack_range_is_an_error_and_no_file(tmp_path: Path) -> None:
    cfg = config(tmp_path, members=1)
    cfg["fields"]["t2m"].update(dtype="int16", pack_range=[0.0, 1.0])
    out = Output(cfg)
    out.add("t2m", np.full((NY, NX), 2.0), time=0.0, member=1)
    with pytest.raises(OutputError, match=r"outside pack_range \[0.0, 1.0\]"):
        out.sync()
    out.close()
    assert not list((tmp_path / "out").glob("*.nc")) and not list((tmp_path / "out").glob(".*tmp"))


def test_bad_input_is_refused_at_add(tmp_path: Path) -> None:
    with Output(config(tmp_path)) as out:
        with pytest.raises(InputError, match="unknown output field 'tmp2'.*declares t2m"):
            out.add("tmp2", np.zeros((NY, NX)), time=0.0, member=1)
        with pytest.raises(InputError, match=r"shape \(12, 15\), the field \(12, 16\)"):
            out.add("t2m", np.zeros((NY, NX - 1)), time=0.0, member=1)
        with pytest.raises(InputError, match=r"member = 1..5"):
            out.add("t2m", np.zeros((NY, NX)), time=0.0, member=6)
        with pytest.raises(InputError, match=r"member = 1..5"):
            out.add("t2m", np.zeros((NY, NX)), time=0.0)
        with pytest.raises(InputError, match="outside"):
            out.add("t2m", np.zeros((4, NX)), time=0.0, member=1, region=(slice(10, 14), slice(None)))
        with pytest.raises(InputError, match="not finite"):
            out.add("t2m", np.zeros((NY, NX)), time=math.nan, member=1)
        with pytest.raises(InputError, match="not a real number"):
            out.add("t2m", np.zeros((NY, NX), dtype=complex), time=0.0, member=1)
        assert out.stats()["adds"] == 0
    with pytest.raises(ConfigError, match="dimension 'lev' is not declared"):
        Output(config(tmp_path, fields={"q": {"dims": ["lev"]}}))


@pytest.mark.parametrize("policy", ["error", "warn", "allow"])
def test_nan_is_flagged_and_counted(tmp_path: Path, policy: str) -> None:
    X = ensemble(4, 1)
    X[0, 2, 3, 4] = np.nan
    out = Output(config(tmp_path, nan=policy))
    for m in range(1, N + 1):
        out.add("t2m", X[0, m - 1], time=0.0, member=m)
    if policy == "error":
        with pytest.raises(OutputError, match="field t2m time 0 member 3: 1 NaN value"):
            out.sync()
        out.close()
        assert not (tmp_path / "out" / "t2m_0.nc").exists()
    elif policy == "warn":
        with pytest.warns(RuntimeWarning, match="member 3: 1 NaN"):
            out.sync()
        out.close()
        assert (tmp_path / "out" / "t2m_0.nc").exists()
    else:
        out.close()
        with netCDF4.Dataset(tmp_path / "out" / "t2m_0.nc") as ds:
            assert np.isnan(ds["t2m"][0, 2, 3, 4]) and np.isnan(ds["t2m_mean"][0, 3, 4])
    assert out.stats()["nan"] == {"t2m": 1}
    assert not list((tmp_path / "out").glob(".*tmp"))


def test_back_pressure_blocks_and_loses_nothing(tmp_path: Path) -> None:
    # A buffer of 3 fields: add has to wait for the writer, and says how long.
    nbytes = NY * NX * 8
    with Output(config(tmp_path, buffer_mb=3 * nbytes / 2**20, compression="zlib", complevel=9)) as out:
        X = ensemble(5, 8)
        for k in range(8):
            for m in range(1, N + 1):
                out.add("t2m", X[k, m - 1], time=float(k), member=m)
        s = out.stats()
        assert s["backlog_max_bytes"] <= 3 * nbytes and s["backlog_max_messages"] <= 3
        assert s["blocked_s"] > 0
    assert len(list((tmp_path / "out").glob("t2m_*.nc"))) == 8
    with netCDF4.Dataset(tmp_path / "out" / "t2m_7.nc") as ds:
        np.testing.assert_array_equal(ds["t2m"][0], X[7])


def test_overlapping_regions_and_duplicates_are_errors(tmp_path: Path) -> None:
    out = Output(config(tmp_path, members=1))
    out.add("t2m", np.zeros((6, NX)), time=0.0, member=1, region=(0, 0))
    out.add("t2m", np.zeros((6, NX)), time=0.0, member=1, region=(3, 0))
    with pytest.raises(OutputError, match="overlaps values added before"):
        out.sync()
    out.close()
    assert not list((tmp_path / "out").iterdir()) or not list((tmp_path / "out").glob("*.nc"))


def test_incomplete_output_at_close_is_reported_not_written(tmp_path: Path) -> None:
    out = Output(config(tmp_path))
    out.add("t2m", np.zeros((NY, NX)), time=0.0, member=1)
    with pytest.raises(OutputError, match=r"t2m_0.nc \(field t2m, time 0\): member\(s\) \[2, 3, 4, 5\] missing"):
        out.close()
    assert not list((tmp_path / "out").glob("*.nc")) and not list((tmp_path / "out").glob(".*tmp"))


def reduce_total(x: np.ndarray) -> float:
    return float(np.sum(x))


def reduce_zonal(x: np.ndarray) -> np.ndarray:
    return x.mean(axis=1)


def test_windows_user_reductions_several_writers_and_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                                   os.environ.get("PYTHONPATH")])))
    cfg = config(tmp_path, writers=2, windows=[{"name": "day", "length": 24.0}],
                 reductions={"total": "test_output_api:reduce_total", "zonal": "test_output_api:reduce_zonal"})
    cfg["fields"]["sst"] = {"dims": ["lat", "lon"], "ensemble": False, "units": "K"}
    X = ensemble(6, 8)  # times 0, 6, ..., 42: day 0 holds 0..18, day 1 holds 24..42
    S = X[:, 0] + 1.0
    times = [6.0 * k for k in range(8)]
    # First run: days 0 and the first half of day 1, then the writer stops (its window is checkpointed).
    with Output(cfg) as out:
        for k in range(6):
            for m in range(1, N + 1):
                out.add("t2m", X[k, m - 1], time=times[k], member=m)
            out.add("sst", S[k], time=times[k])
    d = tmp_path / "out"
    assert (d / ".checkpoint" / "t2m.h5").exists() and (d / ".checkpoint" / "sst.h5").exists()
    assert not (d / "t2m_day_24.nc").exists()
    # A restarted study adds time 30 again (not counted twice) and the rest of day 1, then one time of day 2.
    with Output(cfg) as out:
        for k in range(5, 8):
            for m in range(1, N + 1):
                out.add("t2m", X[k, m - 1], time=times[k], member=m)
            out.add("sst", S[k], time=times[k])
        for m in range(1, N + 1):
            out.add("t2m", X[0, m - 1], time=48.0, member=m)
        out.add("sst", S[0], time=48.0)
    means = X.mean(axis=1)
    for day, ks in ((0, range(4)), (1, range(4, 8))):
        with netCDF4.Dataset(d / f"t2m_day_{24 * day}.nc") as ds:
            assert ds.number_of_times == 4 and ds.window_complete == 1
            np.testing.assert_allclose(ds["t2m_mean"][0], np.mean(means[list(ks)], axis=0), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(ds["t2m_min"][0], np.min(means[list(ks)], axis=0), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(ds["t2m_max"][0], np.max(means[list(ks)], axis=0), rtol=1e-12, atol=1e-12)
            assert ds["t2m_mean"].cell_methods == "realization: mean time: mean"
            assert list(ds["time_bnds"][0]) == [24.0 * day, 24.0 * day + 24]
        with netCDF4.Dataset(d / f"sst_day_{24 * day}.nc") as ds:
            np.testing.assert_allclose(ds["sst_mean"][0], np.mean(S[list(ks)], axis=0), rtol=1e-12, atol=1e-12)
            assert ds["sst_mean"].cell_methods == "time: mean"
    with netCDF4.Dataset(d / "t2m_6.nc") as ds:
        assert float(ds["t2m_total"][0]) == pytest.approx(float(np.sum(means[1])), rel=1e-12)
        np.testing.assert_allclose(ds["t2m_zonal"][0], means[1].mean(axis=1), rtol=1e-12)
    with netCDF4.Dataset(d / "sst_6.nc") as ds:
        assert "member" not in ds.dimensions
        np.testing.assert_array_equal(ds["sst"][0], S[1].astype(np.float32))


def test_a_reduction_that_cannot_be_loaded_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="cannot load 'no_such_module_x:f'"):
        Output(config(tmp_path, reductions={"r": "no_such_module_x:f"}))


def test_experiment_file_takes_an_output_table(tmp_path: Path) -> None:
    from enkflow.experiment.config import load_experiment

    toml = tmp_path / "exp.toml"
    toml.write_text('[experiment]\ncycles = 1\nmembers = 2\nrestart = "m{member}.nc"\nforecast_length = 1\n'
                    '[model]\ncommand = "m {restart}"\n[observations]\nfile = "o{cycle}.nc"\n'
                    '[analysis]\nmethod = "etkf"\n'
                    '[output]\nmembers = 2\ndims = { x = { size = 3 } }\nfields = { u = { dims = ["x"] } }\n')
    cfg = load_experiment(toml)
    assert isinstance(cfg.output, OutputConfig) and cfg.output.shape("u") == (3,)
    toml.write_text(toml.read_text().replace("members = 2\ndims", "membres = 2\ndims"))
    with pytest.raises(ConfigError, match="unknown key output.membres, did you mean members"):
        load_experiment(toml)


def test_two_times_in_one_file_name_is_an_error(tmp_path: Path) -> None:
    cfg = config(tmp_path, members=1, file="{field}_{time:.0f}.nc")
    out = Output(cfg)
    out.add("t2m", np.zeros((NY, NX)), time=0.2, member=1)
    out.add("t2m", np.ones((NY, NX)), time=0.4, member=1)
    with pytest.raises(OutputError, match=r"times 0.2 and 0.4 give the same file name t2m_0.nc"):
        out.close()
    with netCDF4.Dataset(tmp_path / "out" / "t2m_0.nc") as ds:
        assert float(ds["time"][0]) == 0.2 and not ds["t2m"][0].any()


def test_add_needs_no_writer_until_the_buffer_is_full_then_waits(tmp_path: Path) -> None:
    import os
    import signal
    import threading

    nbytes = NY * NX * 8
    out = Output(config(tmp_path, members=1, buffer_mb=3 * nbytes / 2**20))
    pid = out._channels[0].writer.pid
    X = ensemble(8, 4)[:, 0]
    done = threading.Event()
    os.kill(pid, signal.SIGSTOP)
    try:
        for k in range(3):  # they fit the buffer: add returns with the writer stopped
            out.add("t2m", X[k], time=float(k), member=1)
        assert out.backlog() == (3, 3 * nbytes)
        th = threading.Thread(target=lambda: (out.add("t2m", X[3], time=3.0, member=1), done.set()))
        th.start()
        assert not done.wait(1.0), "the fourth add should wait for room (back-pressure), not drop or overflow"
    finally:
        os.kill(pid, signal.SIGCONT)
    th.join(60)
    assert done.is_set()
    out.close()
    s = out.stats()
    assert s["blocked_s"] > 0.5 and s["lost_adds"] == 0 and s["backlog_max_messages"] == 3
    for k in range(4):
        with netCDF4.Dataset(tmp_path / "out" / f"t2m_{k}.nc") as ds:
            np.testing.assert_array_equal(ds["t2m"][0, 0], X[k])


def test_writers_run_at_lower_priority_and_where_pinned(tmp_path: Path) -> None:
    """writer_nice is added to the model's niceness (the writer yields the CPU to the model);
    writer_cpus pins it; an impossible pinning stops the start with the key named."""
    import os

    base = os.getpriority(os.PRIO_PROCESS, 0)
    cpu = sorted(os.sched_getaffinity(0))[-1]
    with Output(config(tmp_path, writer_nice=7, writer_cpus=[cpu])) as out:
        pid = out._channels[0].writer.pid
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(base + 7, 19)
        assert os.sched_getaffinity(pid) == {cpu}
    with Output(config(tmp_path, writer_nice=0)) as out:
        assert os.getpriority(os.PRIO_PROCESS, out._channels[0].writer.pid) == base
    with pytest.raises(OutputError, match="writer_cpus"):
        Output(config(tmp_path, writer_cpus=[4096]))
    with pytest.raises(ConfigError, match="writer_nice"):
        Output(config(tmp_path, writer_nice=-1))


def test_a_field_whose_notice_cannot_fit_the_ring_is_refused_at_the_start(tmp_path: Path) -> None:
    name = "t" * 1100
    cfg = config(tmp_path)
    cfg["fields"] = {name: cfg["fields"]["t2m"]}
    with pytest.raises(ConfigError, match=f"output.fields.{name}: the metadata of a piece") as err:
        Output(cfg)
    assert "transport = 'ipc'" in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("transport", ["shm", "ipc"])
def test_a_writers_error_reaches_the_next_add_not_only_sync(tmp_path: Path, transport: str) -> None:
    """With a ring, an add looks at its socket only when the writer has told (in the ring) of a message
    not yet received: the writer's error still reaches the adds that follow, without a sync."""
    X = ensemble(6, 1)
    X[0, 0, 0, 0] = np.nan
    out = Output(config(tmp_path, nan="error", transport=transport))
    # Time 1 first: the error may arrive before any add in the loop sends, and close must still find
    # an incomplete time (time 0's file is abandoned with its NaN, not reported as incomplete).
    out.add("t2m", X[0, 1], time=1.0, member=1)
    out.add("t2m", X[0, 0], time=0.0, member=1)
    deadline = time.monotonic() + 30
    with pytest.raises(OutputError, match="member 1: 1 NaN value"):
        for t in itertools.count(2):  # a new time each add: a piece added twice would abandon its time
            assert time.monotonic() < deadline, "the writer's error never reached an add"
            out.add("t2m", X[0, 1], time=float(t), member=1)  # never complete: no sync needed
            time.sleep(0.05)
    assert out._channels[0].heard >= 2  # the welcome and the error
    with pytest.raises(OutputError, match="incomplete output"):
        out.close()  # times 1, 2, ... lack members


def test_a_ring_notice_is_the_json_of_the_put_message() -> None:
    from enkflow.output import protocol as P

    for t in (0.0, -0.0, 0.1, 6.0, 1e16, -2.2250738585072014e-308, 1.7976931348623157e308, np.float64(0.3)):
        for member in (None, 3, np.int64(2)):
            for region in (None, [[0, 5], [2, 16]]):
                fast = P.put_notice(10, 20, t, member, region, P.put_fixed(field="t2m", dtype="<f4", shape=[5, 14]))
                slow = P.encode(P.PUT, slot=[10, 20], field="t2m", time=float(t),
                                member=None if member is None else int(member), region=region, dtype="<f4",
                                shape=[5, 14])
                assert P.decode(fast) == P.decode(slow) and len(fast) == len(slow)
