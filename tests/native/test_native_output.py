"""The output service's native client (enkflow_output.h in libenkflow_runner, and its Fortran binding)
against a real OutputService: a C program and a Fortran program add fields with members, regions and
times; the NetCDF files they get written (data, inline ensemble mean and spread, coordinates,
attributes) are bitwise those of RemoteOutput adding the same arrays from Python. Bad input is refused
before anything is sent, a wrong token is refused by the service, a writer's failure comes back at the
next sync, and a service that is killed (kill -9) or goes silent while the client waits gives
ENKFLOW_ELOST, never a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest

from enkflow.output.client import OutputError
from enkflow.output.remote import RemoteOutput
from enkflow.output.service import OutputService

HERE = Path(__file__).resolve().parent
NY, NX, NZ = 4, 5, 3
EINVAL, EFIELD, ETYPE, ESIZE, EREFUSED, ELOST, ESTATE, EOUTPUT = 1, 4, 5, 6, 7, 8, 2, 13


def config(out: Path) -> dict[str, Any]:
    return {"directory": str(out), "file": "{field}_{time:g}.nc", "members": 3, "transport": "ipc",
            "dims": {"z": {"size": NZ}, "y": {"size": NY, "start": -30.0, "step": 20.0, "units": "degrees_north",
                                              "axis": "Y"},
                     "x": {"size": NX, "start": 0.0, "step": 72.0, "units": "degrees_east", "axis": "X"}},
            "fields": {"t": {"dims": ["y", "x"], "dtype": "float64", "units": "K"},
                       "q": {"dims": ["z", "y", "x"], "dtype": "float32", "units": "kg kg-1"},
                       "p": {"dims": ["x"], "ensemble": False, "dtype": "float64", "units": "Pa"}},
            "diagnostics": True, "nan": "error"}


def t_value(m: int, ti: int) -> np.ndarray:
    i, j = np.meshgrid(np.arange(NY), np.arange(NX), indexing="ij")
    return (1000 * m + 100 * ti + 10 * i + j).astype(np.float64) / 3.0


def q_value(m: int, ti: int) -> np.ndarray:
    k, i, j = np.meshgrid(np.arange(NZ), np.arange(NY), np.arange(NX), indexing="ij")
    return (m * 7 + k * 5 + i * 3 + j + ti).astype(np.float32) / np.float32(7.0)


def python_client(sdir: Path) -> None:
    """output_client.c's "fields" mode through RemoteOutput: the same arrays, pieces and order."""
    r = RemoteOutput.from_dir(sdir)
    for ti, time_ in enumerate((0.0, 6.0)):
        for m in (1, 2, 3):
            t = t_value(m, ti)
            r.add("t", t[2:], time_, member=m, region=(slice(2, 4), slice(0, NX)))
            r.add("t", t[:2], time_, member=m, region=(slice(0, 2), slice(0, NX)))
            r.add("q", q_value(m, ti), time_, member=m)
        if ti == 0:
            p: np.ndarray = np.arange(NX, dtype=np.float64) / 3.0
        else:
            p = (10 + np.arange(NX)).astype(np.int32)  # converted to float64, as the C client does
        r.add("p", p[:3], time_, region=(slice(0, 3),))
        r.add("p", p[3:], time_, region=(slice(3, 5),))
    r.close()


@pytest.fixture(scope="module")
def clients(native_build, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """output_client.c built with `pkg-config enkflow_runner`, output_client.f90 with `enkflow_runner_f`."""
    d = tmp_path_factory.mktemp("output_clients")
    env = native_build.env()
    exes = {}
    for name, lang, pc in (("c", "cc", "enkflow_runner"), ("fortran", "gfortran", "enkflow_runner_f")):
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", pc], env=env, capture_output=True, text=True)
        assert flags.returncode == 0, f"pkg-config does not find the installed {pc}.pc: {flags.stderr}"
        src = HERE / ("output_client.c" if name == "c" else "output_client.f90")
        exe = d / f"output_client_{name}"
        std = ["-std=c11"] if name == "c" else ["-std=f2018"]
        cc = subprocess.run([lang, *std, "-O2", "-ffp-contract=off", str(src), "-o", str(exe), *flags.stdout.split(),
                             "-lm", f"-Wl,-rpath,{native_build.lib}"], capture_output=True, text=True, cwd=d)
        assert cc.returncode == 0, cc.stderr
        exes[name] = exe
    return exes


def run(argv: list[Any], timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)


def lines(stdout: str) -> dict[str, tuple[int, str]]:
    """'NAME RC MESSAGE' lines by name."""
    out = {}
    for line in stdout.splitlines():
        name, rc, *msg = line.split(" ", 2) + [""]
        if rc.lstrip("-").isdigit():
            out[name] = (int(rc), msg[0] if msg else "")
    return out


def contents(path: Path) -> dict[str, Any]:
    """Every variable (raw bytes, dtype, dims, attributes) and global attribute of a file, but its history
    (a time stamp and the writer's pid)."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        out: dict[str, Any] = {"global": {k: ds.getncattr(k) for k in ds.ncattrs() if k != "history"}}
        for name, v in ds.variables.items():
            a = np.asarray(v[:])
            out[name] = (a.dtype.str, a.shape, v.dimensions, a.tobytes(), {k: str(v.getncattr(k)) for k in v.ncattrs()})
        out["global"] = {k: str(x) for k, x in out["global"].items()}
        return out


def serve(tmp: Path, name: str, client) -> tuple[Path, dict[str, Any]]:
    out = tmp / f"out_{name}"
    svc = OutputService.start(config(out), tmp / f"svc_{name}")
    try:
        client(tmp / f"svc_{name}")
        res = svc.stop()
    finally:
        svc.kill()
    return out, res


def test_c_and_fortran_clients_write_bitwise_what_python_writes(clients, tmp_path: Path) -> None:
    outputs = {}
    fortran_stdout = []

    def native(exe: Path, *args: str):
        def go(sdir: Path) -> None:
            p = run([exe, *args, sdir])
            assert p.returncode == 0, p.stdout + p.stderr
            fortran_stdout[:] = [p.stdout]
            stats = p.stdout.split("stats ", 1)[1].split()
            assert int(stats[0]) == 22 and int(stats[1]) == 2 * (3 * (NY * NX * 8 + NZ * NY * NX * 4) + NX * 8)
        return go

    outputs["python"], res = serve(tmp_path, "python", python_client)
    outputs["c"], res_c = serve(tmp_path, "c", native(clients["c"], "fields"))
    outputs["fortran"], res_f = serve(tmp_path, "fortran", native(clients["fortran"]))
    refused = lines(fortran_stdout[0])
    assert refused["start_size"][0] == ESIZE and "start has another number of entries" in refused["start_size"][1]
    # Fortran t(:, 1:2) with start [1, 4] is rows [3, 5) of the (y, x) field: outside y's 4 points.
    assert refused["start_outside"] == (ESIZE, "output field t member 1 time 0: region [3, 5) along y is outside [0, 4)")
    assert refused["unknown_field"][0] == EFIELD and "'salinity'" in refused["unknown_field"][1]
    for r in (res, res_c, res_f):
        assert r["stats"]["adds"] == 22 and not r["notes"] and not r.get("error")

    files = sorted(p.name for p in outputs["python"].iterdir())
    assert files == ["p_0.nc", "p_6.nc", "q_0.nc", "q_6.nc", "t_0.nc", "t_6.nc"]
    want = {f: contents(outputs["python"] / f) for f in files}
    # What Python wrote is the data set (so that equality below is not two empty files agreeing).
    for ti, tm in enumerate((0, 6)):
        members = np.stack([t_value(m, ti) for m in (1, 2, 3)])
        with netCDF4.Dataset(outputs["python"] / f"t_{tm}.nc") as ds:
            assert np.array_equal(ds["t"][0], members)
            assert np.allclose(ds["t_mean"][0], members.mean(axis=0), rtol=0, atol=1e-12)
            assert np.allclose(ds["t_spread"][0], members.std(axis=0, ddof=1), rtol=0, atol=1e-12)
        with netCDF4.Dataset(outputs["python"] / f"q_{tm}.nc") as ds:
            assert np.array_equal(ds["q"][0], np.stack([q_value(m, ti) for m in (1, 2, 3)]))
    for lang in ("c", "fortran"):
        assert sorted(p.name for p in outputs[lang].iterdir()) == files, lang
        for f in files:
            got = contents(outputs[lang] / f)
            assert got.keys() == want[f].keys(), (lang, f)
            for var in want[f]:
                assert got[var] == want[f][var], f"{lang} {f} {var}: differs from Python's"


def test_bad_input_is_refused_before_sending(clients, tmp_path: Path) -> None:
    out = tmp_path / "out"
    svc = OutputService.start(config(out), tmp_path / "svc")
    try:
        p = run([clients["c"], "bad", tmp_path / "svc"])
        got = lines(p.stdout)
        assert p.returncode == 0, p.stdout + p.stderr
        want = {
            "unknown_field": (EFIELD, "unknown output field 'salinity'; [output.fields] declares p, q, t"),
            "wrong_shape": (ESIZE, "output field t member 1 time 0: the array has shape (2, 5), the field (4, 5) "
                                   "(dims [y, x]); pass a region for a part"),
            "wrong_ndim": (ESIZE, "output field t member 1 time 0: the array has shape (20,), the field (4, 5)"),
            "region_outside": (ESIZE, "output field t member 1 time 0: region [3, 5) along y is outside [0, 4)"),
            "region_negative": (ESIZE, "region [-1, 1) along y is outside [0, 4)"),
            "region_mismatch": (ESIZE, "output field t member 2 time 6: the array has 2 points along y, the region "
                                       "[0, 3) 3"),
            "member_high": (EINVAL, "output field t member 4 time 6: an ensemble field needs member = 1..3, got 4"),
            "member_none": (EINVAL, "output field t time 6: an ensemble field needs member = 1..3, got 0 (none)"),
            "member_not_ensemble": (EINVAL, "output field p member 2 time 6: not an ensemble field"),
            "time_nan": (EINVAL, "time is not finite"),
            "dtype": (ETYPE, "element type 9"),
            "sync": (0, ""), "close": (0, ""),
            "add_after_close": (ESTATE, "enkflow_output_add after close"),
            "sync_after_close": (ESTATE, "enkflow_output_sync after close"),
            "close_again": (0, ""),
        }
        for name, (rc, text) in want.items():
            assert name in got, (name, p.stdout)
            assert got[name][0] == rc and text in got[name][1], (name, got[name])
        assert "adds 0" in p.stdout

        # A wrong token: refused by the service, with its text.
        wrong = tmp_path / "wrong_token"
        wrong.write_text("0" * 64 + "\n")
        p = run([clients["c"], "token", tmp_path / "svc", wrong])
        rc, msg = lines(p.stdout)["token"]
        assert p.returncode == rc == EREFUSED and "wrong token" in msg, p.stdout
        p = run([clients["c"], "token", tmp_path / "svc", tmp_path / "no_such_token"])
        assert lines(p.stdout)["token"][0] == 11 and "no_such_token" in p.stdout  # ENKFLOW_EIO

        res = svc.stop()
    finally:
        svc.kill()
    assert res["stats"]["adds"] == 0 and not res["notes"]  # nothing bad reached the service
    assert not out.exists() or not any(out.iterdir())

    # No service there: no address file.
    p = run([clients["c"], "fields", tmp_path / "svc"])
    rc, msg = lines(p.stdout)["open"]
    assert p.returncode == rc == ELOST and "no output service is running there" in msg, p.stdout


def test_a_writer_failure_comes_back_at_the_next_sync(clients, tmp_path: Path) -> None:
    """nan = "error": the writer refuses the time with NaN; the client's sync returns ENKFLOW_EOUTPUT naming it."""
    svc = OutputService.start(config(tmp_path / "out"), tmp_path / "svc")
    try:
        p = run([clients["c"], "nan", tmp_path / "svc"])
        got = lines(p.stdout)
        assert got["add"][0] == 0, p.stdout
        rc, msg = got["sync"]
        assert p.returncode == rc == EOUTPUT, p.stdout + p.stderr
        assert msg.startswith("output service: ") and "t" in msg and "12" in msg and "nan" in msg.lower(), msg
        assert got["close"][0] == 0, p.stdout  # reported once, like Python's OutputError
        # The study lost that time's file: its end says so too.
        with pytest.raises(OutputError, match=r"field t time 12"):
            svc.stop()
    finally:
        svc.kill()
    assert not (tmp_path / "out" / "t_12.nc").exists()


def test_a_rerun_s_identical_piece_is_dropped_another_is_refused(clients, tmp_path: Path) -> None:
    """An online member run twice (the stateless check, a lost runner's rerun) adds the same piece again: the
    service drops an identical one (the file is written once, as the first add gave it); one with other
    values still fails that piece, at the next sync. After discard(time) the time is added anew."""
    svc = OutputService.start(config(tmp_path / "out"), tmp_path / "svc")
    try:
        p = run([clients["c"], "twice", tmp_path / "svc"])
        got = lines(p.stdout)
        assert got["same"] == (0, ""), p.stdout + p.stderr
        rc, msg = got["other"]
        assert p.returncode == rc == EOUTPUT and "field t time 24 member 2" in msg, p.stdout
        assert "written already" in msg or "overlaps" in msg, msg
        # discard(24) then every member again: the file is written anew with the rerun's values.
        assert got["discard"][0] == 0 and got["rerun"] == (0, ""), p.stdout
        assert got["close"] == (0, ""), p.stdout
        with netCDF4.Dataset(tmp_path / "out" / "t_24.nc") as ds:
            first = np.asarray(ds["t"][0])
        res = svc.stop()
    finally:
        svc.kill()
    assert res["stats"]["duplicates_dropped"] == 1 and res["stats"]["adds"] == 7, res["stats"]
    assert np.array_equal(first, np.stack([t_value(m, 5) for m in (1, 2, 3)]))


@pytest.mark.parametrize("then", ["cont", "kill9"])
def test_back_pressure_waits_for_a_stopped_service_and_loses_nothing(clients, tmp_path: Path, then: str) -> None:
    """20 pieces of 1 MiB while the service is stopped (SIGSTOP) for 1.5 s: add waits once ZeroMQ's queue
    (8 messages) is full, the wait is counted in blocked_s, and after SIGCONT every piece is written.
    Killed (kill -9) instead of continued: the waiting add returns ENKFLOW_ELOST."""
    n = 20
    cfg = {"directory": str(tmp_path / "out"), "transport": "ipc", "compression": "none", "diagnostics": False,
           "dims": {"by": {"size": 512}, "bx": {"size": 256}},
           "fields": {"big": {"dims": ["by", "bx"], "ensemble": False, "dtype": "float64"}}}
    svc = OutputService.start(cfg, tmp_path / "svc")
    try:
        proc = subprocess.Popen([str(clients["c"]), "flood", str(tmp_path / "svc"), str(n)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "OPEN"
        os.kill(svc.proc.pid, signal.SIGSTOP)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        time.sleep(1.5)
        blocked = proc.poll() is None
        os.kill(svc.proc.pid, signal.SIGCONT if then == "cont" else signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        assert blocked, "add did not wait for the stopped service: " + out
        if then == "kill9":
            rc, msg = lines(out)["add"]
            assert proc.returncode == rc == ELOST and f"(pid {svc.proc.pid}) is" in msg, out + err
            assert lines(out)["close"][0] == ELOST
            return
        assert proc.returncode == 0, out + err
        adds, nbytes, blocked_s = out.split("stats ", 1)[1].split()[:3]
        assert int(adds) == n and int(nbytes) == n * 512 * 256 * 8
        assert float(blocked_s) >= 1.0, out
        res = svc.stop()
    finally:
        if svc.proc.poll() is None:
            os.kill(svc.proc.pid, signal.SIGCONT)
        svc.kill()
    assert res["stats"]["adds"] == n and not res.get("error")
    with netCDF4.Dataset(tmp_path / "out" / "big.nc") as ds:  # one file growing along time
        times = [float(t) for t in ds["time"][:]]
        assert sorted(times) == list(range(n))
        for k in (0, n - 1):
            assert np.array_equal(ds["big"][times.index(k)], k + np.arange(512 * 256).reshape(512, 256) / 8.0)


@pytest.mark.parametrize("how", ["kill9", "silent"])
def test_a_lost_service_ends_the_wait_with_elost(clients, tmp_path: Path, how: str) -> None:
    """The service is stopped (SIGSTOP) before the client's sync; then killed with kill -9 (the client sees
    its pid go: ENKFLOW_ELOST naming it), or left stopped with a 1 s timeout (ENKFLOW_ELOST: no answer)."""
    svc = OutputService.start(config(tmp_path / "out"), tmp_path / "svc")
    try:
        argv = [clients["c"], "wait", tmp_path / "svc"] + (["1.0"] if how == "silent" else [])
        proc = subprocess.Popen([str(a) for a in argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdin is not None
        seen = ""
        while "OPEN" not in seen:
            line = proc.stdout.readline()
            assert line, f"the client ended early: {seen} {proc.stderr.read() if proc.stderr else ''}"
            seen += line
        os.kill(svc.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        if how == "kill9":
            time.sleep(0.5)  # the client is waiting for its sync's reply
            assert proc.poll() is None, "the client did not wait for the stopped service"
            os.kill(svc.proc.pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("the client hangs on a lost service")
        waited = time.monotonic() - t0
        got = lines(seen + out)
        rc, msg = got["sync"]
        assert proc.returncode == rc == ELOST, seen + out + err
        pid = str(svc.proc.pid)
        if how == "kill9":
            assert f"(pid {pid}) is" in msg and ("gone" in msg or "zombie" in msg), msg
            assert "may not be written (1 add(s) in all)" in msg, msg
        else:
            assert "no answer from the output service" in msg and "within 1 s" in msg, msg
            assert waited >= 1.0
        assert got["close"][0] == ELOST  # and it stays lost
    finally:
        if svc.proc.poll() is None:
            os.kill(svc.proc.pid, signal.SIGCONT)
        svc.kill()


def test_the_c_demo_runner_writes_its_forecasts_through_the_service(native_build, tmp_path: Path) -> None:
    """enkflow_demo_c with --output-address={output_address} in an online study with [output]: `enkflow run`
    starts the service, every forecast is written (one file per cycle, every member), and the service's
    inline ensemble mean of the forecasts is the analysis's own forecast mean (cycles/NNNN/*_forecast_mean.nc).
    With the stateless check (on by default), which runs member 1 of the first cycle twice: the service drops
    the rerun's identical pieces."""
    from demo_study import CYCLES, MEMBERS, make_forcing, online_study, run_study

    exe = native_build.exe("enkflow_demo_c")
    forcing = tmp_path / "forcing.nc"
    study = online_study(tmp_path / "study", f"{exe} --address {{address}} --token-file {{token_file}} --grid {{restart}} "
                                             f"--forcing {forcing} --length {{length}} --curve-key={{curve_key}} "
                                             "--output-address={output_address} --output-token-file={output_token_file} "
                                             "--output-field forecast")
    restart = study.directory / "members" / "member_0001.nc"
    make_forcing(restart, forcing)
    with netCDF4.Dataset(restart) as ds:
        ny, nx = len(ds.dimensions["lat"]), len(ds.dimensions["lon"])
        li, lj = np.asarray(ds["land_i"][:]), np.asarray(ds["land_j"][:])
    study.toml.write_text(study.toml.read_text() + f"""
[output]
directory = "model_output"
members = {MEMBERS}
transport = "ipc"
[output.dims.lat]
size = {ny}
[output.dims.lon]
size = {nx}
[output.fields.forecast]
dims = ["lat", "lon"]
dtype = "float64"
""")
    run_study(study)
    assert study.rc == 0, f"enkflow run failed ({study.rc}):\n{study.log}\n{study.runner_logs()}"
    out = study.directory / "model_output"
    assert sorted(p.name for p in out.iterdir()) == ["forecast.nc"]  # one file growing along time
    sea = np.ones((ny, nx), dtype=bool)
    sea[lj, li] = False
    with netCDF4.Dataset(out / "forecast.nc") as ds:
        times = [float(t) for t in ds["time"][:]]
        forecasts, means = np.asarray(ds["forecast"][:]), np.asarray(ds["forecast_mean"][:])
    assert sorted(times) == [6.0 * k for k in range(1, CYCLES + 1)]
    for k in range(1, CYCLES + 1):
        members, mean = forecasts[times.index(6.0 * k)], means[times.index(6.0 * k)]
        assert members.shape == (MEMBERS, ny, nx) and np.all(members[:, sea] == 0.0)
        assert np.all(np.std(members[:, ~sea], axis=0) > 0)  # eight different forecasts
        with netCDF4.Dataset(study.run_dir / "cycles" / f"{k:04d}" / "soil_moisture_forecast_mean.nc") as ds:
            analysis_fmean = np.asarray(ds["soil_moisture_forecast_mean"][0])
        assert np.allclose(mean[lj, li], analysis_fmean, rtol=0, atol=1e-12), k
    assert [e["ok"] for e in study.events() if e.get("event") == "stateless_check"] == [True]
    for log in (study.run_dir / "online" / "logs").glob("runner-*.log"):
        assert "output" not in log.read_text(), log.read_text()
