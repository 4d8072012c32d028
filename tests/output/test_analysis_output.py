"""The analysis's statistics through the asynchronous output server: forecast mean, analysis mean and spread,
increment; bitwise the values of the mean/spread files and of a recomputation, offline under mpiexec (2 ranks,
rows added as regions) and online (one writer for the study)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.experiment import Experiment, load_experiment
from enkflow.experiment.cycling import ArrayStore, ObservationSpace
from enkflow.experiment.step import AnalysisStep, analyse
from enkflow.io.meanspread import ensemble_mean_spread
from enkflow.jobs.events import iter_events
from enkflow_testing.experiments import STATE_VARIABLE, synth_problem, write_builtin_experiment

N = 4
STATS = ("forecast_mean", "forecast_spread", "analysis_mean", "analysis_spread", "analysis_increment")


def _var(path: Path, name: str) -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        return np.asarray(ds[name][:], dtype=np.float64)


class _Rows:
    def __init__(self) -> None:
        self.got: dict[str, np.ndarray] = {}

    def add(self, cycle: int, row_start: int, rows: dict[str, np.ndarray]) -> None:
        self.got = {k: np.array(v) for k, v in rows.items()}


def test_analyse_hands_on_the_forecast_and_analysis_statistics() -> None:
    from enkflow.analysis import ETKF
    from enkflow.obs import ObsSet

    rng = np.random.default_rng(3)
    X = np.asfortranarray(rng.standard_normal((50, 8)))
    prior = X.copy(order="F")  # the same memory order: the same summation order, the same bits

    class Obs(ObservationSpace):
        def observations(self, cycle):
            return ObsSet(np.zeros(10), np.ones(10), np.arange(10.0)[:, None])

        def apply(self, cycle, X, row_start, comm):
            return X[:10].copy()

        def apply_analysis(self, cycle, Xa, row_start, comm):
            return Xa[:10].copy()

    sink = _Rows()
    Xa, diag = analyse(AnalysisStep(ETKF(), stats=sink), ArrayStore(X), Obs(), 1)
    fm, fsp = ensemble_mean_spread(prior)
    am, asp = ensemble_mean_spread(Xa)
    assert np.array_equal(sink.got["forecast_mean"], fm) and np.array_equal(sink.got["forecast_spread"], fsp)
    assert np.array_equal(sink.got["analysis_mean"], am) and np.array_equal(sink.got["analysis_spread"], asp)
    assert np.array_equal(sink.got["analysis_increment"], am - fm)
    assert not np.array_equal(am, fm) and diag.stats_s is not None and diag.stats_s >= 0


@pytest.fixture(scope="module")
def problem(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_problem(tmp_path_factory.mktemp("synth"), N)


def test_offline_two_ranks_statistics_equal_the_mean_spread_files_and_the_forecasts(
        tmp_path: Path, problem: Path, mpiexec: str, subprocess_env: dict) -> None:
    toml = write_builtin_experiment(tmp_path, problem, members=N, cycles=1, analysis_launcher=f"{mpiexec} -n 2",
                                    extra="\n[analysis_output]\nstatistics = true\n")
    # The forecasts the analysis starts from: the model run by hand on copies of the members.
    fc = tmp_path / "forecasts"
    fc.mkdir()
    for m in range(1, N + 1):
        shutil.copyfile(tmp_path / "members" / f"member_{m:04d}.nc", fc / f"m{m}.nc")
        subprocess.run([sys.executable, "-m", "enkflow.cli.model", str(fc / f"m{m}.nc"), "--length", "6", "--cycle", "1"],
                       check=True, env=subprocess_env)
    fmean, fspread = ensemble_mean_spread(np.stack([_var(fc / f"m{m}.nc", STATE_VARIABLE) for m in range(1, N + 1)], axis=1))
    cfg = load_experiment(toml)
    Experiment(cfg).run()
    c = cfg.cycle_dir(1)
    got = {s: _var(c / f"{STATE_VARIABLE}_{s}.nc", f"{STATE_VARIABLE}_{s}")[0] for s in STATS}
    assert np.array_equal(got["analysis_mean"], _var(c / "analysis_mean.nc", STATE_VARIABLE))
    assert np.array_equal(got["analysis_spread"], _var(c / "analysis_spread.nc", STATE_VARIABLE))
    assert np.array_equal(got["forecast_mean"], fmean) and np.array_equal(got["forecast_spread"], fspread)
    assert np.array_equal(got["analysis_increment"], got["analysis_mean"] - got["forecast_mean"])
    timings = [e for e in iter_events(cfg.expdir / "events.jsonl") if e["event"] == "task_end" and e["task"] == N + 1]
    assert timings and {"stats_s", "stats_wait_s", "stats_start_s"} <= set(timings[0]["timings"])
    assert not [p for p in c.iterdir() if p.name.startswith(".")]  # no temporary left


def test_online_statistics_equal_the_mean_spread_files(tmp_path: Path) -> None:
    from enkflow.apps.demo import DemoSettings, run_demo

    run_demo(tmp_path / "d", DemoSettings(members=N, cycles=2, mode="online"), say=lambda m: None)
    for k in (1, 2):
        c = tmp_path / "d" / "run" / "cycles" / f"{k:04d}"
        got = {s: _var(c / f"{STATE_VARIABLE}_{s}.nc", f"{STATE_VARIABLE}_{s}")[0] for s in STATS}
        assert np.array_equal(got["analysis_mean"], _var(c / "analysis_mean.nc", STATE_VARIABLE))
        assert np.array_equal(got["analysis_spread"], _var(c / "analysis_spread.nc", STATE_VARIABLE))
        assert np.array_equal(got["analysis_increment"], got["analysis_mean"] - got["forecast_mean"])
        with netCDF4.Dataset(c / f"{STATE_VARIABLE}_analysis_spread.nc") as ds:
            assert ds.Conventions.startswith("CF-") and float(ds["time"][0]) == k


def test_statistics_files_keep_the_state_layout_masked_points_missing(tmp_path: Path) -> None:
    """A masked (time, y, x) variable: the files are (time, y, x) with the template's x/y coordinates, NaN where
    the mask leaves a point out; two adds of row ranges that split a grid row (as two ranks do) fill them."""
    from enkflow.output.analysis_output import AnalysisOutput
    from enkflow.output.mean_spread_files import _statistics
    from enkflow.state import StateConfig, StateLayout

    ny, nx = 5, 7
    mask = (np.add.outer(np.arange(ny), np.arange(nx)) % 3 != 0).astype(np.int8)
    with netCDF4.Dataset(tmp_path / "t.nc", "w") as ds:
        for d, n in (("time", 1), ("y", ny), ("x", nx)):
            ds.createDimension(d, n)
        for d, n in (("y", ny), ("x", nx)):
            c = ds.createVariable(d, "f8", (d,))
            c.units, c.axis = "km", d.upper()
            c[:] = 10.0 * np.arange(n)
        ds.createVariable("land", "i1", ("y", "x"))[:] = mask
        v = ds.createVariable("t", "f8", ("time", "y", "x"))
        v.units = "K"
        v[:] = 0.0
    layout = StateLayout.from_config(tmp_path / "t.nc", StateConfig(variables=["t"], mask={"variable": "land"}))
    x = np.arange(layout.n_rows, dtype=np.float64) + 0.5
    out = AnalysisOutput(layout, tmp_path / "cycles")
    split = layout.n_rows // 2 + 1
    for stat in ("analysis_mean", "analysis_spread"):
        out.add(3, 0, {stat: x[:split]})
        out.add(3, split, {stat: x[split:]})
    out.close()
    c = tmp_path / "cycles" / "0003"
    with netCDF4.Dataset(c / "t_analysis_mean.nc") as ds:
        assert ds["t_analysis_mean"].dimensions == ("time", "y", "x") and ds["x"].units == "km"
        np.testing.assert_array_equal(ds["y"][:], 10.0 * np.arange(ny))
        ds.set_auto_mask(False)
        got = np.asarray(ds["t_analysis_mean"][0])
    np.testing.assert_array_equal(got, layout.to_fields(x)["t"].reshape(ny, nx))
    assert np.isnan(got[mask == 0]).all() and np.isfinite(got[mask == 1]).all()
    np.testing.assert_array_equal(_statistics(c, layout, "analysis_spread"), x)  # the mean/spread writer's rows


def test_flat_ranges_as_regions() -> None:
    from enkflow.output.analysis_output import flat_blocks

    for shape in ((7,), (3, 4), (2, 3, 5)):
        n = int(np.prod(shape))
        for lo in range(n + 1):
            for hi in range(lo, n + 1):
                a = np.full(shape, -1)
                for region, off, size in flat_blocks(lo, hi, shape):
                    assert (a[region] == -1).all() and a[region].size == size
                    a[region] = np.arange(lo + off, lo + off + size).reshape(a[region].shape)
                ref = np.full(n, -1)
                ref[lo:hi] = np.arange(lo, hi)
                np.testing.assert_array_equal(a.reshape(-1), ref)


def _file(path: Path, root: Path) -> list:
    """A netCDF file's dimensions, attributes and variables (values and attributes), all but its history;
    paths relative to ``root``."""
    with netCDF4.Dataset(path) as ds:
        out: list = [dict((k, len(d)) for k, d in ds.dimensions.items()),
                     {k: str(ds.getncattr(k)).replace(str(root), "ROOT") for k in ds.ncattrs() if k != "history"}]
        for name, v in ds.variables.items():
            v.set_auto_maskandscale(False)
            out.append((name, str(v.dtype), v.dimensions, {k: str(v.getncattr(k)) for k in v.ncattrs()},
                        np.asarray(v[...]).tobytes()))
    return out


class _Stop(Exception):
    pass


def test_offline_mean_spread_files_are_written_off_the_analysis_path_bitwise_as_by_the_analysis(
        tmp_path: Path, problem: Path) -> None:
    """With the study's output service, the analysis tasks leave analysis_mean.nc and analysis_spread.nc to
    the driver, which writes them from the statistics the service wrote: the same files (bitwise, but for
    the history) as the analysis writes itself without a service. A driver that stops before writing them
    (a crash) has them written by the next run, from the statistics."""
    runs = {}
    for stats in ("true", "false"):
        d = tmp_path / stats
        d.mkdir()
        cfg = load_experiment(write_builtin_experiment(d, problem, members=N, cycles=2,
                                                       extra=f"\n[analysis_output]\nstatistics = {stats}\n"))
        Experiment(cfg).run()
        runs[stats] = cfg
        task_ends = [e for e in iter_events(cfg.expdir / "events.jsonl") if e["event"] == "task_end" and e["task"] == N + 1]
        assert len(task_ends) == 2 and all(e["timings"].get("stats_remote", 0.0) == (stats == "true") for e in task_ends)
    for k in (1, 2):
        for name in ("analysis_mean.nc", "analysis_spread.nc"):
            a, b = (_file(runs[s].cycle_dir(k) / name, tmp_path / s) for s in ("true", "false"))
            assert a == b, (k, name)

    # A crash after the last cycle counted as done, before its files were written (and those of cycle 1
    # lost too): the next run, with nothing left to run, writes them from the statistics.
    d = tmp_path / "crash"
    d.mkdir()
    cfg = load_experiment(write_builtin_experiment(d, problem, members=N, cycles=2,
                                                   extra="\n[analysis_output]\nstatistics = true\n"))

    def stop(k: int) -> None:
        if k == 2:
            raise _Stop

    with pytest.raises(_Stop):
        Experiment(cfg, on_cycle_end=stop).run()
    for k in (1, 2):
        for name in ("analysis_mean.nc", "analysis_spread.nc"):
            (cfg.cycle_dir(k) / name).unlink()
    assert Experiment(cfg).run() == []
    for k in (1, 2):
        for name in ("analysis_mean.nc", "analysis_spread.nc"):
            assert _file(cfg.cycle_dir(k) / name, d) == _file(runs["true"].cycle_dir(k) / name, tmp_path / "true"), (k, name)


def test_a_mean_spread_writer_failure_stops_every_server_rank(tmp_path: Path, problem: Path, mpiexec: str,
                                                              subprocess_env: dict) -> None:
    """Online, rank 0's writer of the mean and spread files fails: every rank raises its error (one rank
    leaving alone would leave the others in the next collective for ever)."""
    from enkflow.fsutil import write_json_atomic

    cfg = load_experiment(write_builtin_experiment(tmp_path, problem, members=N, cycles=2))
    cfg.expdir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(cfg.expdir / "config.json", cfg.to_json())
    script = tmp_path / "two_ranks.py"
    script.write_text(f"""
import numpy as np
from enkflow.errors import EnkflowError
from enkflow.experiment.config import experiment_from_json
from enkflow.experiment.output_setup import mean_spread_setup
from enkflow.fsutil import read_json
from enkflow.output.mean_spread_files import BackgroundMeanSpread
from enkflow.parallel import get_comm
from enkflow.state import StateLayout

comm = get_comm()
cfg = experiment_from_json(read_json({str(cfg.expdir / "config.json")!r}))
layout = StateLayout.from_config(cfg.restart_path(1), cfg.state)
files = BackgroundMeanSpread(mean_spread_setup(cfg), layout, comm, cfg.expdir / "online")
files.start()
lo, hi = comm.rank * layout.n_rows // 2, (comm.rank + 1) * layout.n_rows // 2
X = np.ones((hi - lo, {N}), order="F")
if comm.rank == 0:
    files._writer.proc.kill()  # the writer dies
try:
    for k in (1, 2):
        files.write(k, X, lo, {{}})
    print(f"rank {{comm.rank}}: no error")
except EnkflowError as exc:
    print(f"rank {{comm.rank}}: {{exc}}")
files.close()
""")
    p = subprocess.run([*mpiexec.split(), "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120, env=subprocess_env)
    lines = sorted(line for line in p.stdout.splitlines() if line.startswith("rank "))
    assert len(lines) == 2, (p.stdout, p.stderr)
    assert all("server rank 0: cycle 1: the writer of analysis_mean.nc and analysis_spread.nc" in line and "died" in line
               for line in lines), lines


def test_a_full_disk_under_the_mean_spread_files_is_an_error_naming_the_file(small_tmpfs: Path, problem: Path) -> None:
    """netCDF reports a full disk as an HDF error (a RuntimeError): it comes back as a StorageError that
    names the file, and no file is left under its final name."""
    from enkflow.errors import StorageError
    from enkflow.io.meanspread import MeanSpreadTemplate
    from enkflow.state import StateConfig, StateLayout

    d = small_tmpfs
    (d / "filler").write_bytes(b"\0" * (1018 * 1024))
    layout = StateLayout.from_config(problem / "member_0001.nc", StateConfig(variables=[STATE_VARIABLE]))
    x = np.arange(layout.n_rows, dtype=np.float64)
    with pytest.raises(StorageError, match=r"writing the ensemble mean failed") as ei:
        MeanSpreadTemplate.read(layout).write(d / "analysis_mean.nc", d / "analysis_spread.nc", x, x,
                                              title="t", n_ens=N)
    assert str(d / "analysis_mean.nc") in str(ei.value)
    assert sorted(p.name for p in d.iterdir()) == ["filler"]


def test_a_stopped_mean_spread_writer_is_killed_and_named(tmp_path: Path, problem: Path) -> None:
    """SIGSTOP of the writer of the mean and spread files: a request waits [analysis_output] writer_timeout
    for progress, then kills the writer and fails naming the cycle and the stopped process (the driver and
    the online server would otherwise wait for ever)."""
    import os
    import signal
    import time

    from enkflow.errors import EnkflowError
    from enkflow.fsutil import write_json_atomic
    from enkflow.experiment.output_setup import mean_spread_setup
    from enkflow.output.mean_spread_files import _Writer, copy_template

    cfg = load_experiment(write_builtin_experiment(tmp_path, problem, members=N, cycles=2,
                                                   extra="\n[analysis_output]\nwriter_timeout = 1.0\n"))
    cfg.expdir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(cfg.expdir / "config.json", cfg.to_json())
    setup = mean_spread_setup(cfg)
    w = _Writer(setup, copy_template(setup, tmp_path / "t"), tmp_path / "t" / "mean_spread.log")
    try:
        with pytest.raises(EnkflowError, match="cycle 1: .*not written: .*analysis statistics cannot be read"):
            w.request(1)  # a live writer answers (the statistics of cycle 1 do not exist)
        os.kill(w.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(EnkflowError, match=r"cycle 2: the writer of analysis_mean.nc and analysis_spread.nc "
                                               r"\(pid \d+\) made no progress for \d+ s \(\[analysis_output\] "
                                               r"writer_timeout = 1 s\); the process was stopped \(SIGSTOP\?\); killed"):
            w.request(2)
        assert 1.0 < time.monotonic() - t0 < 10.0
        assert w.proc.poll() is not None
    finally:
        w.close()
