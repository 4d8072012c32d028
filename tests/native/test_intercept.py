"""netCDF interception (docs/intercept.md): the plain-netCDF C and Fortran demo models, which know nothing
of enkflow, run a 3-cycle online study through ``python -m enkflow.online.intercept`` and give bitwise
the analyses of the same binary's offline run through restart files, in place (the model's netCDF calls
copy straight from and to the server's shared memory) and through TCP, also with a model killed mid-
interception, one killed half-way through writing its forecast in place, a runner killed with kill -9
and a model writing half its state, leaving no shared memory segment behind; a step count that does not
match is caught; bad netCDF calls on an intercepted variable get netCDF error codes and clear messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.errors import MemberError
from enkflow.online.fields import Field
from enkflow.online.intercept import Segment
from enkflow.shm_names import shm_dir

from intercept_helpers import ShimMemory, analyses, experiment, make_problem, run

DATA = Path(__file__).parent / "data"
MEMBERS, CYCLES = 4, 3


@pytest.fixture(scope="module")
def problem(tmp_path_factory) -> Path:
    return make_problem(tmp_path_factory.mktemp("intercept") / "problem", MEMBERS, CYCLES).parent


def _shim(native_build) -> Path:
    p = native_build.lib / "libenkflow_intercept.so"
    assert p.exists(), f"{p} was not built"
    return p


def _events(d: Path) -> list[dict]:
    return [json.loads(line) for line in (d / "run" / "events.jsonl").read_text().splitlines() if line.strip()]


def _segments_left(d: Path) -> list[Path]:
    """The shared memory segments the study's server made that are still there."""
    pid = next(e["pid"] for e in _events(d) if e["event"] == "online_start")
    return sorted(shm_dir().glob(f"enkflow-online-{pid}-*"))


@pytest.fixture(scope="module")
def fortran_offline(native_build, problem, tmp_path_factory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("fortran") / "offline"
    run(experiment(problem, d, native_build.exe("fortran_netcdf_model"), "offline"))
    return analyses(d, MEMBERS, CYCLES)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_fortran_model_through_interception_is_bitwise_its_offline_run(native_build, problem, fortran_offline,
                                                                        tmp_path, transport):
    model = native_build.exe("fortran_netcdf_model")
    # Both runners take part (the second must not find the study over: a member each is quick to forecast).
    status = run(experiment(problem, tmp_path / "online", model, "online", _shim(native_build), transport=transport,
                            min_runners=2))
    assert status["state"] == "done"
    off, on = fortran_offline, analyses(tmp_path / "online", MEMBERS, CYCLES)
    assert off.keys() == on.keys()
    for key in off:
        assert off[key] == on[key], key
    # The study changed the members (one that did nothing would compare equal too).
    initial = analyses(problem, MEMBERS, 0)
    assert all(initial[k] != on[k] for k in initial)
    done = [e for e in _events(tmp_path / "online") if e["event"] == "task_done"]
    assert len(done) == MEMBERS * CYCLES
    assert [e["ok"] for e in _events(tmp_path / "online") if e["event"] == "stateless_check"] == [True]
    logs = "".join(p.read_text() for p in (tmp_path / "online" / "run" / "online" / "logs").glob("runner-*.log"))
    assert logs.count("in place: the model reads and writes" if transport == "shm" else "through TCP: the model") == 2
    assert _segments_left(tmp_path / "online") == []


def test_c_model_through_interception_is_bitwise_its_offline_run_despite_faults(native_build, problem, tmp_path):
    """A model SIGKILLed while it reads through the shim, the runner process SIGKILLed while its model is
    inside the interception, a model that writes half its state and exits 0, one SIGKILLed half-way through
    writing a wrong forecast into its slot (in place), and a hung model killed at the wrapper's --timeout:
    each task is failed or lost and given again, as for the Python runner, the analyses are still bitwise
    the offline run's, and the server's shared memory segments are gone."""
    model = native_build.exe("c_netcdf_model")
    run(experiment(problem, tmp_path / "offline", model, "offline"))
    markers = tmp_path / "markers"
    markers.mkdir()
    faulty = f"{sys.executable} {DATA / 'intercept_fault_model.py'} {model} {markers}"
    # The runner's model command is the fault injector, which execs the C model when no fault is due.
    toml = experiment(problem, tmp_path / "online", model, "online", _shim(native_build), heartbeat_timeout=2.0,
                      online_model=faulty, wrapper_args="--timeout 8", transport="shm")
    os.environ["FAULTS"] = "1:2:kill-model,2:3:kill-runner,3:1:half-write,2:1:hang,3:4:kill-mid-write"
    try:
        status = run(toml)
    finally:
        del os.environ["FAULTS"]
    assert _segments_left(tmp_path / "online") == []
    assert status["state"] == "done"
    off, on = analyses(tmp_path / "offline", MEMBERS, CYCLES), analyses(tmp_path / "online", MEMBERS, CYCLES)
    for key in off:
        assert off[key] == on[key], key
    events = [e for e in _events(tmp_path / "online") if e["event"] == "task_requeue"]
    requeues = {(e["cycle"], e["member"]): e for e in events}
    faults = {(1, 2), (2, 3), (3, 1), (2, 1), (3, 4)}
    assert faults <= set(requeues), events
    # Nothing else, unless the shared machine delayed a healthy runner's heartbeats past 2 s.
    assert all(e["reason"] in ("lost", "late") for k, e in requeues.items() if k not in faults), events
    assert requeues[(1, 2)]["reason"] == "failed" and "signal 9" in requeues[(1, 2)]["error"]
    assert requeues[(2, 3)]["reason"] == "lost"
    assert requeues[(3, 1)]["reason"] == "failed" and "must tile the variable" in requeues[(3, 1)]["error"]
    assert requeues[(2, 1)]["reason"] == "failed" and "ran longer than 8 s (--timeout)" in requeues[(2, 1)]["error"]
    assert requeues[(3, 4)]["reason"] == "failed" and "signal 9" in requeues[(3, 4)]["error"]
    # The model whose runner was killed died with it (the shim's death signal), not after its 30 s sleep.
    wrapper, victim = (int(v) for v in (markers / "victim").read_text().split())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{victim}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{victim}").exists() or "zombie" in Path(f"/proc/{victim}/status").read_text()
    assert not Path(f"/proc/{wrapper}").exists() or "zombie" in Path(f"/proc/{wrapper}/status").read_text()


def test_a_step_count_other_than_the_servers_stops_the_study_naming_both(native_build, problem, tmp_path):
    model = native_build.exe("c_netcdf_model")
    toml = experiment(problem, tmp_path / "online", model, "online", _shim(native_build), steps=12, model_steps=6,
                      max_failures=1)
    with pytest.raises(MemberError) as err:
        run(toml)
    assert "asks for 12 steps" in str(err.value) and "runs 6 (--steps)" in str(err.value)


# -- bad netCDF calls, without a server: the shim against a segment made here -----------------------------

def _restart(path: Path) -> Path:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("y", 4)
        ds.createDimension("x", 6)
        ds.createDimension("k", 3)
        ds.createVariable("x", "f8", ("y", "x"))[:] = np.arange(24.0).reshape(4, 6)
        ds.createVariable("other", "f8", ("k",))[:] = 7.0
    return path


def _bad_calls(tmp_path: Path) -> Path:
    exe = tmp_path / "bad_calls"
    cflags = subprocess.run(["pkg-config", "--cflags", "--libs", "netcdf"], capture_output=True, text=True, check=True).stdout.split()
    subprocess.run(["cc", "-O1", "-o", str(exe), str(DATA / "intercept_bad_calls.c"), *cflags], check=True)
    return exe


def _under_shim(native_build, argv: list[str], seg: Segment, path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, LD_PRELOAD=str(_shim(native_build)), ENKFLOW_INTERCEPT_FD=str(seg.fd),
               ENKFLOW_INTERCEPT_PATH=str(path.resolve()))
    return subprocess.run(argv, env=env, pass_fds=(seg.fd,), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("how", ["memfd", "in_place"])
def test_bad_calls_on_an_intercepted_variable_get_netcdf_codes_and_clear_messages(native_build, tmp_path, how):
    restart = _restart(tmp_path / "restart.nc")
    exe = _bad_calls(tmp_path)
    memory = ShimMemory([Field("x", "float64", (4, 6))], how, tmp_path)
    memory.set_state("x", 1000.0 + np.arange(24))
    seg = memory.seg
    seg.reset(1, 1, 6, 1)
    r = _under_shim(native_build, [str(exe), str(restart)], seg, restart)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: int(line.split()[1]) for line in r.stdout.splitlines()
            if line.split()[0] not in ("value", "other", "mixed")}
    NC_EINVAL, NC_EBADTYPE, NC_EEDGE = -36, -45, -57
    assert rows == {"open": 0, "get_whole": 0, "get_wrong_type": NC_EBADTYPE, "get_strided": NC_EINVAL,
                    "get_out_of_bounds": NC_EEDGE, "get_var1": 0, "get_other_variable": 0, "put_other_variable": 0,
                    "put_rows_0_2": 0, "get_after_half_write": 0, "put_rows_1_3_overlap": NC_EINVAL, "put_wrong_type": NC_EBADTYPE,
                    "close_after_half_write": NC_EINVAL}, r.stdout
    assert "value 1000 1023" in r.stdout  # the state from the segment, not the file's 0 .. 23
    assert "other 7" in r.stdout  # another variable from the real file
    assert "mixed 100 111 1012 1023" in r.stdout  # what the model wrote, and the state where it wrote nothing yet
    err = r.stderr
    assert f"nc_get_var_float on variable x of {restart.resolve()}: the variable is double" in err
    assert "strided access" in err and "is written twice" in err and "written only in part (12 of 24 elements)" in err
    assert "which is not an online field: the write is discarded" in err
    # The shim records its first error for the wrapper, which fails the task with it.
    assert seg.verdict(str(restart)).startswith("nc_get_var_float on variable x")
    assert np.array_equal(memory.forecast("x")[:12], 100.0 + np.arange(12))  # the rows written
    assert np.array_equal(netCDF4.Dataset(restart)["x"][:].ravel(), np.arange(24.0))  # the file untouched
    memory.close()


@pytest.mark.parametrize("how", ["memfd", "in_place"])
def test_a_restart_created_anew_is_diskless_and_its_fields_go_to_the_segment(native_build, tmp_path, how):
    restart = _restart(tmp_path / "restart.nc")
    before = restart.read_bytes()
    exe = _bad_calls(tmp_path)
    memory = ShimMemory([Field("x", "float64", (4, 6))], how, tmp_path)
    seg = memory.seg
    seg.reset(1, 1, 6, 1)
    r = _under_shim(native_build, [str(exe), str(restart), "create"], seg, restart)
    assert r.stdout.split("\n")[:4] == ["create 0 No error", "create_put_other 0 No error", "create_put_x 0 No error",
                                        "create_close 0 No error"], r.stdout + r.stderr
    assert np.array_equal(memory.forecast("x"), -1.0 - np.arange(24)) and seg.records[0]["complete"] == 1
    assert restart.read_bytes() == before  # NC_CLOBBER did not reach the file
    memory.close()


@pytest.mark.parametrize("fields, code, message", [
    ([Field("x", "float64", (4, 6)), Field("snow", "float32", (3,), assimilated=False)], -49,  # NC_ENOTVAR
     "the online field snow is not a variable of {path}"),
    ([Field("x", "float64", (4, 5))], -36, "variable x of {path}: dimension 1 has 6 elements, the online field 5"),
    ([Field("x", "float32", (4, 6))], -45, "variable x of {path} is double in the file, the online field is float"),
])
def test_a_restart_that_does_not_hold_the_fields_fails_the_open_naming_them(native_build, tmp_path, fields, code, message):
    restart = _restart(tmp_path / "restart.nc")
    exe = _bad_calls(tmp_path)
    seg = Segment(fields)
    seg.reset(1, 1, 6, 1)
    r = _under_shim(native_build, [str(exe), str(restart), "missing"], seg, restart)
    assert f"open_missing_field {code} " in r.stdout, r.stdout
    assert message.format(path=restart.resolve()) in r.stderr
    assert seg.verdict(str(restart)).startswith(message.format(path=restart.resolve()))
    seg.close()


def test_without_a_segment_the_shim_passes_everything_through(native_build, tmp_path):
    restart = _restart(tmp_path / "restart.nc")
    exe = _bad_calls(tmp_path)
    env = dict(os.environ, LD_PRELOAD=str(_shim(native_build)))
    r = subprocess.run([str(exe), str(restart)], env=env, capture_output=True, text=True, timeout=60)
    assert "value 0 23" in r.stdout and "get_wrong_type 0 " in r.stdout and "enkflow intercept" not in r.stderr


def test_a_model_that_never_opens_its_restart_or_skips_a_state_variable_is_no_forecast(tmp_path):
    seg = Segment([Field("x", "float64", (4, 6)), Field("age", "int32", (4,), assimilated=False)])
    seg.reset(2, 1, 6, 9)
    assert "never opened /r.nc" in seg.verdict("/r.nc")
    seg.header["opens"] = 1
    assert seg.verdict("/r.nc") == "the model did not write the state variable 'x' of /r.nc"
    seg.records[0]["generations"] = 1
    assert "without reading it" in seg.verdict("/r.nc")
    seg.records[0]["elements_read"] = 24
    assert seg.verdict("/r.nc") is None  # a carried field left unwritten keeps its values, as in a file
    seg.close()


def test_in_place_a_field_the_model_did_not_write_keeps_its_values_in_the_forecast(tmp_path):
    """As a file would: the wrapper copies a carried field the model left alone from the store into the slot
    (the slot may hold another task's forecast); what the model wrote stays as it is."""
    memory = ShimMemory([Field("x", "float64", (4, 6)), Field("age", "int32", (5,), assimilated=False)], "in_place",
                        tmp_path)
    memory.set_state("age", np.arange(5, dtype=np.int32))
    for part in memory.forecast_at["age"]:
        part[:] = -7  # an earlier task's forecast in the slot
    memory.seg.reset(2, 1, 6, 9)
    memory.seg.records[0]["generations"] = 1  # x written by the model
    memory.seg.keep_unwritten()
    assert np.array_equal(memory.forecast("age"), np.arange(5)) and not memory.forecast("x").any()
    memory.close()


def test_the_wrapper_refuses_bad_arguments_before_it_connects(native_build, tmp_path, capsys):
    from enkflow.online.intercept import main

    token = tmp_path / "token"
    token.write_text("t\n")
    base = ["--address", "tcp://127.0.0.1:9", "--token-file", str(token), "--shim", str(_shim(native_build)),
            "--path", str(tmp_path / "r_{member}.nc")]
    cases = {("--field", "x:float64:4", "--", "model", "{foo}"): "unknown placeholder(s) ['foo']",
             ("--field", "x:complex128:4", "--", "model"): "dtype 'complex128' is not one of",
             ("--field", "x:float64:4x", "--", "model"): "the shape must be extents joined by x",
             ("--", "model"): "give either --expdir",
             ("--field", "x:float64:4", "--steps", "0", "--", "model"): "--steps must be >= 1"}
    for args, message in cases.items():
        try:
            rc = main([*base, *args])
        except SystemExit as exc:  # argparse's usage errors
            rc = exc.code
        assert rc != 0 and message in capsys.readouterr().err, args


# 19.2 MB of float64 and 9.6 MB of float32, each read whole and written in two hyperslabs: large enough for
# the streaming copy and for the copies the shim splits with a helper thread (and, with helpers off, not split)
@pytest.mark.parametrize("how", ["memfd", "in_place"])
@pytest.mark.parametrize("var, bad, value, rewrite, finite, helpers", [
    ("x", -1, "nan", 0, True, "1"),
    ("x", -1, "nan", 0, True, "0"),
    ("x", 0, "nan", 0, False, "1"),
    ("x", 1200 * 1000 + 3, "inf", 0, False, "1"),  # the second hyperslab
    ("x", 2400 * 1000 - 1, "-inf", 0, False, "1"),  # the very last element
    ("x", 2400 * 1000 - 1, "-inf", 0, False, "0"),
    ("x", 7, "nan", 1, True, "1"),  # a NaN in the first write, then the whole variable written again, finite
    ("y", -1, "nan", 0, True, "1"),
    ("y", 1200 * 1000 - 1, "-inf", 0, False, "1"),  # the last element of the first hyperslab
])
def test_the_shim_tells_whether_the_model_wrote_any_nan_or_inf(native_build, tmp_path, how, var, bad, value, rewrite,
                                                                finite, helpers, monkeypatch):
    """What the wrapper tells the server (PUT_SLOT's finite frame): a field the model wrote whole, every
    value finite as the shim copied it, is not read again by the server; one with a NaN or an Inf anywhere is.
    The model's state and forecast are exact, whether the shim splits its copies with a helper or not."""
    monkeypatch.setenv("ENKFLOW_COPY_HELPERS", helpers)
    shape = (2400, 1000)
    restart = tmp_path / "restart.nc"
    with netCDF4.Dataset(restart, "w") as ds:
        ds.createDimension("i", shape[0])
        ds.createDimension("j", shape[1])
        ds.createVariable("x", "f8", ("i", "j"))
        ds.createVariable("y", "f4", ("i", "j"))
    exe = tmp_path / "intercept_writes"
    cflags = subprocess.run(["pkg-config", "--cflags", "--libs", "netcdf"], capture_output=True, text=True, check=True).stdout.split()
    subprocess.run(["cc", "-O1", "-o", str(exe), str(DATA / "intercept_writes.c"), *cflags, "-lm"], check=True)
    fields = [Field("x", "float64", shape), Field("y", "float32", shape)]
    memory = ShimMemory(fields, how, tmp_path)
    dtype = np.float32 if var == "y" else np.float64
    state = (np.arange(shape[0] * shape[1]) % 1000003).astype(dtype)
    memory.set_state(var, state)
    memory.seg.reset(1, 1, 6, 1)
    r = _under_shim(native_build, [str(exe), str(restart), var, str(bad), value, str(rewrite)], memory.seg, restart)
    assert r.returncode == 0, r.stderr
    k = 0 if var == "x" else 1
    rec = memory.seg.records[k]
    assert rec["complete"] == 1 and rec["generations"] == 1 + rewrite
    assert memory.seg.finite_fields() == ({k} if finite else set())
    want = state + dtype(1)
    if bad >= 0:
        want[bad] = 0.0 if rewrite else float(value)
    np.testing.assert_array_equal(memory.forecast(var), want)
    memory.close()
