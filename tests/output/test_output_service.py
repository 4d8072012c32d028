"""The study-wide output service (enkflow.output.service) and its client RemoteOutput, with real
processes: regions added from two client processes, kill -9 of a client and of the service, input
rejected before anything is sent, and an offline experiment whose analysis statistics go through it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest

from enkflow.errors import InputError
from enkflow.output import OutputError
from enkflow.output.remote import RemoteOutput, ServiceLost
from enkflow.output.service import OutputService

NX, NY = 6, 8


def config(d: Path) -> dict[str, Any]:
    return {"directory": str(d / "out"), "file": "{field}_{time:g}.nc", "members": 3,
            "dims": {"y": {"size": NY}, "x": {"size": NX}},
            "fields": {"u": {"dims": ["y", "x"], "ensemble": True, "dtype": "float64"},
                       "s": {"dims": ["y", "x"], "ensemble": False, "dtype": "float64"}},
            "diagnostics": True, "transport": "ipc"}


def value(name: str, t: int, m: int | None) -> np.ndarray:
    base = 100.0 * t + (10.0 * m if m is not None else 0.5) + (1.0 if name == "s" else 0.0)
    return base + np.arange(NY * NX, dtype=np.float64).reshape(NY, NX) / 7.0


# A client process: adds rows [lo, hi) of every field, member and time in TIMES, then syncs and says bye.
# With "forever": afterwards adds the rows of ever later times without completing them, until killed.
CLIENT = """
import sys, time, numpy as np
sys.path.insert(0, {tests!r})
from test_output_service import value
from enkflow.output.remote import RemoteOutput
r = RemoteOutput.from_dir({sdir!r})
lo, hi = {lo}, {hi}
for t in {times}:
    for m in (1, 2, 3):
        r.add("u", value("u", t, m)[lo:hi], t, member=m, region=(slice(lo, hi), slice(None)))
    r.add("s", value("s", t, None)[lo:hi], t, region={{"y": slice(lo, hi)}})
r.sync()
print("synced", flush=True)
if {forever}:
    t = 100
    while True:
        r.add("s", value("s", t, None)[lo:hi], t, region=(slice(lo, hi), slice(None)))
        t += 1
        time.sleep(0.005)
r.close()
"""


def client(sdir: Path, lo: int, hi: int, times: list[int], forever: bool = False) -> subprocess.Popen:
    code = CLIENT.format(tests=str(Path(__file__).parent), sdir=str(sdir), lo=lo, hi=hi, times=times, forever=forever)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def read(path: Path, name: str) -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        return np.asarray(ds[name][:], dtype=np.float64)


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.rglob(".*") if p.is_file())


def test_remote_adds_from_two_processes_equal_the_recomputation(tmp_path: Path) -> None:
    svc = OutputService.start(config(tmp_path), tmp_path / "svc")
    assert (tmp_path / "svc" / "address").read_text().strip() == svc.address
    assert (tmp_path / "svc" / "token").stat().st_mode & 0o077 == 0
    times = [1, 2, 3]
    procs = [client(tmp_path / "svc", 0, 3, times), client(tmp_path / "svc", 3, NY, times)]
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
    res = svc.stop()
    assert res["stats"]["adds"] == 2 * len(times) * 4 and not res["notes"]
    assert not (tmp_path / "svc" / "address").exists()
    out = tmp_path / "out"
    for t in times:
        members = np.stack([value("u", t, m) for m in (1, 2, 3)])
        u = read(out / f"u_{t}.nc", "u")[0]
        assert np.array_equal(u, members)
        with netCDF4.Dataset(out / f"u_{t}.nc") as ds:  # the writer's diagnostics over the assembled regions
            assert np.allclose(ds["u_mean"][0], members.mean(axis=0))
            assert np.allclose(ds["u_spread"][0], members.std(axis=0, ddof=1))
        assert np.array_equal(read(out / f"s_{t}.nc", "s")[0], value("s", t, None))
    assert leftovers(out) == []


def test_kill_9_of_a_client_mid_stream_leaves_its_incomplete_times_reported_not_written(tmp_path: Path) -> None:
    svc = OutputService.start(config(tmp_path), tmp_path / "svc")
    try:
        whole = client(tmp_path / "svc", 0, NY, [1, 2])  # complete times 1 and 2
        assert whole.communicate(timeout=60)[0].decode().split() == ["synced"]
        p = client(tmp_path / "svc", 0, 3, [3], forever=True)  # half of time 3, then halves of 100, 101, ...
        assert p.stdout is not None and p.stdout.readline().decode().strip() == "synced"
        time.sleep(0.3)
        p.send_signal(signal.SIGKILL)
        p.wait()
        with RemoteOutput.from_dir(tmp_path / "svc") as r:  # the service goes on serving the others
            r.add("s", value("s", 4, None), 4)
            r.sync()
        time.sleep(0.7)  # the service notices the client is gone (it looks every 0.5 s)
        with pytest.raises(OutputError) as err:
            svc.stop()
    finally:
        svc.kill()
    msg = str(err.value)
    assert "incomplete output" in msg and "u_3.nc (field u, time 3): member(s) [1, 2, 3] missing" in msg
    assert "s_100.nc (field s, time 100): part of the field missing" in msg
    assert f"client pid {p.pid} ended without bye" in msg
    out = tmp_path / "out"
    names = sorted(p.name for p in out.iterdir())
    assert names == ["s_1.nc", "s_2.nc", "s_4.nc", "u_1.nc", "u_2.nc"]
    assert np.array_equal(read(out / "s_4.nc", "s")[0], value("s", 4, None))


def test_kill_9_of_the_service_is_a_clear_error_and_leaves_no_half_written_file(tmp_path: Path) -> None:
    svc = OutputService.start(config(tmp_path), tmp_path / "svc")
    r = RemoteOutput(svc.address, token_file=tmp_path / "svc" / "token")
    r.add("s", value("s", 1, None), 1)
    r.sync()
    r.add("s", value("s", 2, None)[:4], 2, region=(slice(0, 4), slice(None)))  # time 2 half added
    os.kill(svc.proc.pid, signal.SIGKILL)
    with pytest.raises(ServiceLost, match=rf"output service at .* \(pid {svc.proc.pid}\) is .*not be written"):
        for _ in range(1000):  # adds are queued until the high-water mark; the wait then notices
            r.add("s", value("s", 3, None), 3)
        r.sync()
    with pytest.raises(OutputError, match="after close"):
        r.add("s", value("s", 3, None), 3)
    svc.kill()
    out = tmp_path / "out"
    deadline = time.monotonic() + 20  # the writer notices its parent is gone and removes its temporary files
    while leftovers(out) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftovers(out) == []
    assert sorted(p.name for p in out.iterdir()) == ["s_1.nc"]
    assert np.array_equal(read(out / "s_1.nc", "s")[0], value("s", 1, None))


def test_the_service_closes_when_its_owner_dies(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom enkflow.output.service import OutputService\n"
        f"svc = OutputService.start({config(tmp_path)!r}, {str(tmp_path / 'svc')!r})\n"
        "print(svc.proc.pid, flush=True)\ntime.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    pid = int(owner.stdout.readline())
    r = RemoteOutput.from_dir(tmp_path / "svc")
    r.add("s", value("s", 1, None), 1)
    r.sync()
    page = r._hb.path if r._hb is not None else None
    assert page is not None and page.exists(), "a client on the owner's node watches the service's page"
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), "the service must end with its owner"
    assert not (tmp_path / "svc" / "address").exists()
    assert not page.exists(), "an orphaned service removes its progress page: nothing is left in /dev/shm"
    with pytest.raises(ServiceLost, match="is gone"):
        r.sync()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["s_1.nc"]


def test_bad_input_is_rejected_before_anything_is_sent(tmp_path: Path) -> None:
    svc = OutputService.start(config(tmp_path), tmp_path / "svc")
    try:
        with pytest.raises(OutputError, match="wrong token"):
            RemoteOutput(svc.address, token="not-the-token")
        r = RemoteOutput.from_dir(tmp_path / "svc")
        bad = [(dict(name="v", array=np.zeros((NY, NX)), time=1), "unknown output field 'v'"),
               (dict(name="u", array=np.zeros((NY, NX)), time=1), "needs member = 1..3"),
               (dict(name="u", array=np.zeros((NY, NX)), time=1, member=4), "needs member = 1..3"),
               (dict(name="s", array=np.zeros((NY, NX)), time=1, member=1), "member must be None"),
               (dict(name="s", array=np.zeros((NY, NX + 1)), time=1), "shape"),
               (dict(name="s", array=np.zeros((3, NX)), time=1, region=(slice(6, 9), slice(None))), "outside"),
               (dict(name="s", array=np.zeros((NY, NX)), time=float("nan")), "not finite"),
               (dict(name="s", array=np.array(["a"] * NX * NY).reshape(NY, NX), time=1), "not a real number")]
        for kw, match in bad:
            with pytest.raises(InputError, match=match):
                r.add(**kw)
        r.sync()
        assert r.stats()["adds"] == 0 and r.stats()["service"]["adds"] == 0
        r.close()
        svc.stop()
    finally:
        svc.kill()
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_a_writers_error_goes_to_the_client_whose_add_caused_it(tmp_path: Path) -> None:
    svc = OutputService.start(config(tmp_path), tmp_path / "svc")  # nan = "error"
    try:
        a, b = RemoteOutput.from_dir(tmp_path / "svc"), RemoteOutput.from_dir(tmp_path / "svc")
        bad = value("s", 5, None)
        bad[2, 3] = np.nan
        a.add("s", bad, 5)
        b.add("s", value("s", 6, None), 6)
        b.sync()  # b's adds are fine: a's error is not b's
        with pytest.raises(OutputError, match=r"field s time 5: 1 NaN value\(s\)"):
            a.sync()
        a.sync()  # reported once
        a.close()
        b.close()
        # ... but the study lost that time's file: its end says so (a run must not end well).
        with pytest.raises(OutputError, match=r"field s time 5: 1 NaN value\(s\)"):
            svc.stop()
    finally:
        svc.kill()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["s_6.nc"]


def test_a_failed_time_discarded_and_written_again_is_not_a_failure_of_the_study(tmp_path: Path) -> None:
    svc = OutputService.start(config(tmp_path), tmp_path / "svc")  # nan = "error"
    try:
        a = RemoteOutput.from_dir(tmp_path / "svc")
        bad = value("s", 1, None)
        bad[0, 0] = np.nan
        a.add("s", bad, 1)
        a.add("s", value("s", 10, None), 10)
        with pytest.raises(OutputError, match=r"field s time 1: 1 NaN value\(s\)"):
            a.sync()
        a.discard(1)  # a rerun of that time (not of time 10)
        a.add("s", value("s", 1, None), 1)
        a.close()
        svc.stop()
    finally:
        svc.kill()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["s_1.nc", "s_10.nc"]


def test_back_pressure_bounds_what_is_in_flight_and_is_measured(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    cfg["dims"]["z"] = {"size": 1 << 14}
    cfg["fields"]["big"] = {"dims": ["z"], "ensemble": False, "dtype": "float64"}
    cfg.update(buffer_mb=0.25, complevel=9)  # two pieces of 128 KiB in flight at most; slow compression
    svc = OutputService.start(cfg, tmp_path / "svc")
    rng = np.random.default_rng(1)
    pieces = [rng.standard_normal(1 << 14) for _ in range(60)]
    try:
        with RemoteOutput.from_dir(tmp_path / "svc") as r:
            for t, x in enumerate(pieces):
                r.add("big", x, t)
            r.sync()
            s = r.stats()
        svc.stop()
    finally:
        svc.kill()
    assert s["adds"] == 60 and s["blocked_s"] > 0  # the client waited for the service ...
    assert s["service"]["blocked_s"] > 0 and s["service"]["backlog_max_bytes"] <= 0.25 * 2**20  # ... and it for its writer
    assert np.array_equal(read(tmp_path / "out" / "big_59.nc", "big")[0], pieces[59])


def test_offline_experiment_writes_the_statistics_through_one_service_by_default(tmp_path: Path) -> None:
    from enkflow.experiment import Experiment, load_experiment
    from enkflow.jobs.events import iter_events
    from enkflow.output.analysis_output import STATS
    from enkflow_testing.experiments import STATE_VARIABLE, synth_problem, write_builtin_experiment

    problem = synth_problem(tmp_path / "synth", 4)
    toml = write_builtin_experiment(tmp_path, problem, members=4, cycles=2)
    cfg = load_experiment(toml)
    assert cfg.analysis_output.statistics is None  # the default
    Experiment(cfg).run()
    events = list(iter_events(cfg.expdir / "events.jsonl"))
    kinds = [e["event"] for e in events]
    assert kinds.count("output_service_start") == 1 and kinds.count("output_service_end") == 1
    end = next(e for e in events if e["event"] == "output_service_end")
    assert "error" not in end and end["stats"]["adds"] == 2 * len(STATS)  # every statistic of both cycles
    analyses = [e for e in events if e["event"] == "task_end" and e["task"] == 5]
    assert len(analyses) == 2 and all(e["timings"]["stats_remote"] == 1.0 for e in analyses)
    for k in (1, 2):
        c = cfg.cycle_dir(k)
        mean = read(c / f"{STATE_VARIABLE}_analysis_mean.nc", f"{STATE_VARIABLE}_analysis_mean")[0]
        spread = read(c / f"{STATE_VARIABLE}_analysis_spread.nc", f"{STATE_VARIABLE}_analysis_spread")[0]
        assert np.array_equal(mean, read(c / "analysis_mean.nc", STATE_VARIABLE))
        assert np.array_equal(spread, read(c / "analysis_spread.nc", STATE_VARIABLE))
        assert not [p for p in c.iterdir() if p.name.startswith(".")]
    assert not (cfg.expdir / "output_service" / "address").exists()


RUNNER = """
import sys
import numpy as np
from enkflow.output.remote import RemoteOutput
with RemoteOutput(sys.argv[1], token_file=sys.argv[2]) as r:
    k = int(sys.argv[3])
    r.add("h", np.array([3.0 * k, 3.0 * k + 1.0]), 1.0, region=(slice(2 * k, 2 * k + 2),))
"""


def test_online_runners_get_the_output_service_through_placeholders(tmp_path: Path) -> None:
    from enkflow.experiment import load_experiment
    from enkflow.experiment.demo_problem import DemoSettings, prepare
    from enkflow.online.launch import OnlineExperiment

    toml = prepare(tmp_path, DemoSettings(members=4, cycles=1, mode="online"), say=lambda m: None)
    (tmp_path / "runner.py").write_text(RUNNER)
    lines = [f'runner = "{sys.executable} {tmp_path / "runner.py"} {{output_address}} {{output_token_file}} {{runner}}"'
             if ln.startswith("runner = ") else ln for ln in toml.read_text().splitlines()]
    lines += ["", "[output]", 'directory = "model_output"', "dims = { x = { size = 4 } }",
              'fields = { h = { dims = ["x"], ensemble = false, dtype = "float64" } }']
    toml.write_text("\n".join(lines) + "\n")
    sup = OnlineExperiment(load_experiment(toml))
    sup.token_file = tmp_path / "unused-token"
    sup.output_service = svc = sup._start_output_service()
    try:
        for k in (0, 1):  # two runners, each its half of the field
            subprocess.run(sup._runner_argv(k, "tcp://127.0.0.1:1"), check=True, timeout=60)
        svc.stop()
    finally:
        svc.kill()
    h = read(tmp_path / "model_output" / "h.nc", "h")[0]
    assert np.array_equal(h, [0.0, 1.0, 3.0, 4.0])


def test_a_discarded_time_is_forgiven_only_for_the_fields_written_again(tmp_path: Path) -> None:
    """A rerun that discards a failed time but adds only some of its fields again: the failure of a field
    it did not add again still fails the study's stop."""
    svc = OutputService.start(config(tmp_path), tmp_path / "svc")  # nan = "error"
    try:
        a = RemoteOutput.from_dir(tmp_path / "svc")
        bad = value("u", 2, 1)
        bad[1, 1] = np.nan
        a.add("u", bad, 2, member=1)
        badder = value("s", 2, None)
        badder[0, 0] = np.nan
        a.add("s", badder, 2)
        with pytest.raises(OutputError, match=r"field (u|s) time 2"):
            a.sync()
        a.discard(2)
        a.add("s", value("s", 2, None), 2)  # "s" again, not "u"
        a.close()
        with pytest.raises(OutputError, match=r"field u time 2") as ei:
            svc.stop()
        assert "field s time 2" not in str(ei.value)
    finally:
        svc.kill()


def test_a_stopped_service_is_a_clear_error_for_its_clients_and_its_owner_kills_it(tmp_path: Path) -> None:
    """SIGSTOP of the service: a stop shorter than hang_limit (writer_timeout + 5 s) only delays; a longer
    one makes a waiting client raise ServiceLost naming the stopped process, and the owner's stop kill it
    (no study waits for ever on a service that cannot answer)."""
    import threading

    from enkflow.output.service import hang_limit
    from enkflow.output.config import OutputConfig

    cfg = dict(config(tmp_path), writer_timeout=0.5)
    limit = hang_limit(OutputConfig.model_validate(cfg))
    assert limit == 5.5
    svc = OutputService.start(cfg, tmp_path / "svc")
    try:
        r = RemoteOutput.from_dir(tmp_path / "svc")
        r.add("s", value("s", 1, None), 1)
        os.kill(svc.proc.pid, signal.SIGSTOP)
        threading.Timer(2.0, os.kill, (svc.proc.pid, signal.SIGCONT)).start()
        r.sync()  # waited out the short stop
        os.kill(svc.proc.pid, signal.SIGSTOP)
        r.add("s", value("s", 2, None), 2)  # queued by ZeroMQ: the stopped service never reads it
        lost: list[BaseException] = []

        def sync() -> None:
            try:
                r.sync()
            except BaseException as exc:  # noqa: BLE001 - checked below
                lost.append(exc)

        t0 = time.monotonic()
        client_thread = threading.Thread(target=sync)
        client_thread.start()
        with pytest.raises(OutputError, match=r"hung: made no progress for \d+ s \(limit 5.5 s: output.writer_timeout, "
                                              r"and 5 s\).*stopped \(SIGSTOP\?\); killed"):
            svc.stop()
        client_thread.join(timeout=30)
        assert limit < time.monotonic() - t0 < limit + 10
        assert svc.proc.poll() is not None, "the owner kills a hung service"
        assert len(lost) == 1 and isinstance(lost[0], ServiceLost), lost
        assert re.search(r"is hung: made no progress for \d+ s \(limit 5.5 s.*the process is stopped \(SIGSTOP\?\)",
                         str(lost[0])), lost[0]
    finally:
        svc.kill()
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["s_1.nc"] and leftovers(out) == []


def test_a_service_waiting_for_a_slow_writer_is_not_hung(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service beats while it waits for its writers (they have their own watch): a sync that takes longer
    than hang_limit because the writer is slow but progressing (a user reduction of 0.4 s per time) succeeds."""
    (tmp_path / "slow_reduction.py").write_text(
        "import time\nimport numpy as np\n\ndef total(a):\n    time.sleep(0.4)\n    return float(np.sum(a))\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    cfg = dict(config(tmp_path), writer_timeout=1.0, writer_nice=0, reductions={"total": "slow_reduction:total"})
    svc = OutputService.start(cfg, tmp_path / "svc")
    try:
        r = RemoteOutput.from_dir(tmp_path / "svc")
        times = range(1, 18)
        t0 = time.monotonic()
        for t in times:
            r.add("s", value("s", t, None), t)
        r.sync()
        assert time.monotonic() - t0 > 6.0 + 0.5  # longer than hang_limit (6 s)
        r.close()
        svc.stop()
    finally:
        svc.kill()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(f"s_{t}.nc" for t in times)


def test_over_tcp_a_client_on_another_node_notices_a_stopped_service_by_zeromq_pings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that cannot see the service's process (it says it runs on another node) relies on
    ZeroMQ's pings: a service whose main thread waits for a stopped writer still answers them (its
    I/O thread does), a stopped service does not, and the client's wait ends with ServiceLost."""
    import socket
    import threading

    cfg = dict(config(tmp_path), writer_timeout=30.0)
    svc = OutputService.start(cfg, tmp_path / "svc", transport="tcp")
    try:
        with monkeypatch.context() as m:
            m.setattr(socket, "gethostname", lambda: "another-node")
            r = RemoteOutput.from_dir(tmp_path / "svc", heartbeat_timeout=1.5)
        assert not r._same_host and r._hb is None
        writer = int(subprocess.run(["pgrep", "-P", str(svc.proc.pid)], capture_output=True, text=True).stdout.split()[0])
        os.kill(writer, signal.SIGSTOP)  # the service's sync now waits for it, longer than the ping timeout
        threading.Timer(3.0, os.kill, (writer, signal.SIGCONT)).start()
        r.add("s", value("s", 1, None), 1)
        r.sync()
        os.kill(svc.proc.pid, signal.SIGSTOP)
        r.add("s", value("s", 2, None), 2)
        t0 = time.monotonic()
        with pytest.raises(ServiceLost, match=r"is unreachable: the connection to it was closed \(no answer to "
                                              r"ZeroMQ's pings within 1.5 s"):
            r.sync()
        assert time.monotonic() - t0 < 15
    finally:
        svc.kill()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["s_1.nc"]
