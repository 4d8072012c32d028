"""Writer failures with real processes: kill -9 mid-run (stop / continue), a writer that hangs without
dying (SIGSTOP: in back-pressure and in sync, stop / continue), a slow writer that keeps progressing
(not a hang), a full disk (a 1 MiB tmpfs). Whatever happens, a file under its final name is whole:
every one opens and holds exactly the data added."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest

from enkflow.errors import EnkflowError, StorageError
from enkflow.output import Output, OutputError
from enkflow.output.writer_process import WriterAddress

NY, NX, N = 64, 64, 4


def config(d: Path, **over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"directory": str(d), "members": N, "dims": {"y": {"size": NY}, "x": {"size": NX}},
                           "file": "{field}_{time:g}.nc",
                           "fields": {"u": {"dims": ["y", "x"], "dtype": "float64"}},
                           "compression": "zlib", "complevel": 9}
    cfg.update(over)
    return cfg


def field(k: int, m: int) -> np.ndarray:
    return np.random.default_rng(1000 * k + m).standard_normal((NY, NX))


def check_whole(d: Path) -> int:
    """Every file under a final name opens and holds exactly the members added; no temporary is left."""
    files = sorted(d.glob("u_*.nc"))
    for f in files:
        k = int(f.stem.split("_")[1])
        with netCDF4.Dataset(f) as ds:
            for m in range(1, N + 1):
                np.testing.assert_array_equal(ds["u"][0, m - 1], field(k, m))
    assert not [p.name for p in d.glob(".*tmp")], "a temporary file was left behind"
    return len(files)


def writer_pid(out: Output) -> int:
    return out._channels[0].writer.pid


@pytest.mark.parametrize("policy, transport", [("stop", "shm"), ("continue", "shm"), ("continue", "ipc")])
def test_kill_9_of_the_writer_mid_run(tmp_path: Path, policy: str, transport: str) -> None:
    d = tmp_path / "out"
    out = Output(config(d, on_writer_failure=policy, buffer_mb=1.0, transport=transport))
    pid = writer_pid(out)
    killed_at = None
    caught: EnkflowError | None = None
    t0 = time.monotonic()
    k = 0
    try:
        with pytest.warns(RuntimeWarning, match="OUTPUT LOST") if policy == "continue" else _nothing():
            while k < 400:
                for m in range(1, N + 1):
                    out.add("u", field(k, m), time=float(k), member=m)
                k += 1
                if killed_at is None and time.monotonic() - t0 > 1.0:
                    os.kill(pid, signal.SIGKILL)  # the writer is busy: compressing, or with a time half written
                    killed_at = k
            out.close()
    except OutputError as exc:
        caught = exc
    assert killed_at is not None
    if policy == "stop":
        assert caught is not None and f"pid {pid}" in str(caught) and "killed by signal 9" in str(caught)
        assert k < killed_at + 5, "the model should have been stopped at its next add"
        with pytest.raises(OutputError, match="killed by signal 9.*on_writer_failure = 'stop'"):
            out.add("u", field(0, 1), time=0.0, member=1)  # and at every later one: nothing is dropped silently
        with pytest.raises(OutputError, match="killed by signal 9"):
            out.close()
    else:
        assert caught is None and k == 400, "the model should have gone on"
        s = out.stats()
        assert s["lost_adds"] > 0 and s["failures"] and "killed by signal 9" in s["failures"][0]
        assert not s["writers"][0]["alive"]
    written = check_whole(d)
    assert 0 < written < k


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("policy, where, transport", [("stop", "add", "shm"), ("continue", "add", "shm"),
                                                      ("stop", "sync", "shm"), ("continue", "sync", "ipc")])
def test_sigstop_of_the_writer_is_a_writer_failure(tmp_path: Path, policy: str, where: str, transport: str) -> None:
    """A writer stopped (SIGSTOP) does not die: nothing but its silence tells. After writer_timeout
    seconds without progress, the waiting add (buffer full) or sync gives up on it: it is killed, its
    temporary files removed, and on_writer_failure applies."""
    d = tmp_path / "out"
    # 32 KiB pieces, 0.25 MiB of buffer: the 9th piece after the stop waits for room. writer_nice = 0: on a
    # crowded machine a niced writer could be starved long enough to look hung before the stop.
    out = Output(config(d, on_writer_failure=policy, writer_timeout=1.5, writer_nice=0, buffer_mb=0.25,
                        transport=transport, compression="none"))
    pid = writer_pid(out)
    for k in range(2):
        for m in range(1, N + 1):
            out.add("u", field(k, m), time=float(k), member=m)
    out.sync()
    os.kill(pid, signal.SIGSTOP)
    rescue = threading.Timer(60.0, lambda: os.kill(pid, signal.SIGCONT))  # a test that fails, not one that hangs
    rescue.start()
    caught: OutputError | None = None
    k = 2
    try:
        with pytest.warns(RuntimeWarning, match="OUTPUT LOST.*made no progress") if policy == "continue" else _nothing():
            try:
                if where == "add":
                    while k < 12:
                        for m in range(1, N + 1):
                            out.add("u", field(k, m), time=float(k), member=m)
                        k += 1
                else:
                    out.add("u", field(2, 1), time=2.0, member=1)  # time 2 half written, under a temporary name
                    out.sync()
            except OutputError as exc:
                caught = exc
    finally:
        rescue.cancel()
    assert gone(pid), "the hung writer must be killed (and reaped)"
    if policy == "stop":
        assert caught is not None, "the stopped writer was not detected"
        msg = str(caught)
        for part in (f"output writer 0 (pid {pid}", "made no progress for", "output.writer_timeout = 1.5 s",
                     "the oldest piece not written: field u time 2 member 1", "stopped", "killed"):
            assert part in msg, f"{part!r} not in {msg!r}"
        if where == "add":
            assert k == 4, "the adds that fit the buffer return at once, the next one waits and fails"
        with pytest.raises(OutputError, match=f"pid {pid}.*made no progress"):
            out.add("u", field(0, 1), time=0.0, member=1)
        with pytest.raises(OutputError, match="made no progress"):
            out.close()
    else:
        assert caught is None and (where == "sync" or k == 12), "the model should have gone on"
        s = out.stats()
        assert s["lost_adds"] > 0 and "made no progress" in s["failures"][0] and not s["writers"][0]["alive"]
        out.add("u", field(3, 1), time=3.0, member=1)  # dropped and counted, no error
        out.close()
        assert out.stats()["lost_adds"] > s["lost_adds"]
    assert check_whole(d) == 2  # the times synced before the stop, whole; nothing else under a final name


def test_a_slow_writer_that_keeps_progressing_is_not_a_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """writer_timeout bounds the silence, not the work: a user reduction that takes 0.45 s per time keeps
    the writer busy for more than twice the timeout (2 s), and an idle pause longer than the timeout comes first."""
    (tmp_path / "slow_reduction.py").write_text(
        "import time\nimport numpy as np\n\ndef total(a):\n    time.sleep(0.45)\n    return float(np.sum(a))\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    d = tmp_path / "out"
    times, timeout = 10, 2.0
    out = Output(config(d, writer_timeout=timeout, writer_nice=0, compression="none",
                        reductions={"total": "slow_reduction:total"}))
    time.sleep(timeout + 0.5)  # the model computes for a while: an idle writer is not a hung one, it goes on beating
    assert out._channels[0].writer.silence.seconds() < timeout
    t0 = time.monotonic()
    for k in range(times):
        for m in range(1, N + 1):
            out.add("u", field(k, m), time=float(k), member=m)
    out.sync()
    assert time.monotonic() - t0 > 2 * timeout  # the case at hand: the writer was busy for longer than the timeout
    out.close()
    assert check_whole(d) == times
    with netCDF4.Dataset(d / "u_9.nc") as ds:
        mean = np.mean([field(9, m) for m in range(1, N + 1)], axis=0)
        np.testing.assert_allclose(ds["u_total"][...], mean.sum(), rtol=1e-12)


def test_silence_counts_bytes_written_as_progress(tmp_path: Path) -> None:
    """The clock behind writer_timeout: a process that beats nothing but keeps writing (a long write to a
    slow disk) is not silent; one that neither beats nor writes is, and a beat ends the silence."""
    from enkflow.output.heartbeat import Heartbeat, Silence

    hb = Heartbeat.create()
    slow_disk = subprocess.Popen([sys.executable, "-c", "import os, time\n"
                                  f"fd = os.open({str(tmp_path / 'f')!r}, os.O_WRONLY | os.O_CREAT)\n"
                                  "while True:\n    os.write(fd, b'x' * 4096)\n    time.sleep(0.1)\n"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)  # both started
        writing, quiet = Silence(hb, slow_disk.pid), Silence(hb, idle.pid)
        writing.seconds(), quiet.seconds()
        worst = 0.0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.5:
            time.sleep(0.05)
            worst = max(worst, writing.seconds())
        assert worst < 1.0, "bytes written are progress"
        assert quiet.seconds() >= 1.5, "no beat and no byte: silent"
        hb.beat()
        assert quiet.seconds() == 0.0
    finally:
        for p in (slow_disk, idle):
            p.kill()
            p.wait()
        hb.unlink()
        hb.close()


def test_writer_exits_and_cleans_up_when_the_model_is_killed(tmp_path: Path) -> None:
    d = tmp_path / "out"
    script = (
        "import sys, time, numpy as np\n"
        "from enkflow.output import Output\n"
        f"out = Output({config(d)!r})\n"
        "out.add('u', np.zeros((%d, %d)), time=0.0, member=1)\n"
        "out.sync()\n"
        "print(out._channels[0].writer.pid, flush=True)\n"
        "time.sleep(60)\n" % (NY, NX))
    model = subprocess.Popen(["python", "-c", script], stdout=subprocess.PIPE, text=True)
    assert model.stdout is not None
    wpid = int(model.stdout.readline())
    model.stdout.close()
    assert list(d.glob(".u_0.nc.*.tmp"))  # the half-written time, under its temporary name only
    model.kill()
    model.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(wpid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(wpid, signal.SIGKILL)
        pytest.fail("the writer outlived its model")
    assert not list(d.iterdir()) or not list(d.glob("*.nc")) and not list(d.glob(".*tmp"))


def test_full_disk_is_a_clear_error_and_no_corrupted_file(small_tmpfs: Path) -> None:
    # Uncompressed float64: 4 members of 32 KiB per file, so the 1 MiB file system fills after a few times.
    out = Output(config(small_tmpfs, compression="none"))
    with pytest.raises(StorageError, match=r"cannot (write|create|finish) .*u_\d+\.nc.*(no space left|No space left|full\?)") as ei:
        for k in range(40):
            for m in range(1, N + 1):
                out.add("u", field(k, m), time=float(k), member=m)
        out.sync()
    assert str(small_tmpfs) in str(ei.value)
    try:
        out.close()
    except EnkflowError:
        pass
    assert check_whole(small_tmpfs) >= 1


def test_window_means_survive_a_kill_9_of_the_writer(tmp_path: Path) -> None:
    """Run 1 adds times 0..8 (hours) and its writer is killed before any sync; run 2 (a restarted
    study) adds the times whose files are missing, then the rest. The window means equal offline
    recomputation: every time whose file exists was counted (checkpointed before its rename), the
    others are counted once."""
    d = tmp_path / "out"
    cfg = config(d, windows=[{"name": "half", "length": 12.0}], write_members=False, compression="none",
                 on_writer_failure="continue")
    times = [float(k) for k in range(0, 24, 2)]
    means = {t: np.mean([field(int(t), m) for m in range(1, N + 1)], axis=0) for t in times}
    out = Output(cfg)
    for t in times[:5]:
        for m in range(1, N + 1):
            out.add("u", field(int(t), m), time=t, member=m)
    # Wait until the writer has finished 3 times (their files renamed), then kill it with no sync.
    deadline = time.monotonic() + 30
    while len(list(d.glob("u_*.nc"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(writer_pid(out), signal.SIGKILL)
    with pytest.warns(RuntimeWarning, match="OUTPUT LOST"):
        out.close()
    assert (d / ".checkpoint" / "u.h5").exists()
    written = {float(p.stem.split("_")[1]) for p in d.glob("u_*.nc")}
    assert len(written) >= 3
    out = Output(cfg)
    for t in [t for t in times if t not in written]:  # a restart from the files that exist
        for m in range(1, N + 1):
            out.add("u", field(int(t), m), time=t, member=m)
    out.close(finish_windows=True)  # the second window has seen no later time: written as it is
    assert not (d / ".checkpoint" / "u.h5").exists()
    for start in (0, 12):
        with netCDF4.Dataset(d / f"u_half_{start}.nc") as ds:
            ts = [t for t in times if start <= t < start + 12]
            assert ds.number_of_times == len(ts)
            np.testing.assert_allclose(ds["u_mean"][0], np.mean([means[t] for t in ts], axis=0), rtol=1e-12, atol=1e-12)
    assert not list(d.glob(".*tmp"))


def test_over_tcp_a_writer_on_another_node_that_stops_is_lost_by_zeromq_pings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sender on another node than its writer cannot see the process or its heartbeat page: it relies on
    ZeroMQ's pings (writer_timeout). A stopped writer answers none, so the sender's sync ends with a clear
    error instead of waiting for ever, and on_writer_failure = 'stop' holds for every later call."""
    start = Output._start_writers

    def on_another_node(self: Output, n: int) -> list[WriterAddress]:
        return [dataclasses.replace(address, host="writer-node") for address in start(self, n)]

    monkeypatch.setattr(Output, "_start_writers", on_another_node)
    d = tmp_path / "out"
    out = Output(config(d, transport="tcp", writer_timeout=1.5, writer_nice=0, compression="none"))
    w = out._channels[0].writer
    assert w.watch is not None and w.hb is None and w.proc is None  # nothing but the connection to go by
    (pid,) = [started.pid for started in out._launched]
    try:
        for m in range(1, N + 1):
            out.add("u", field(0, m), time=0.0, member=m)
        out.sync()
        os.kill(pid, signal.SIGSTOP)
        out.add("u", field(1, 1), time=1.0, member=1)
        t0 = time.monotonic()
        with pytest.raises(OutputError, match=r"output writer 0 \(at tcp://[^,]+, fields u\) unreachable: the "
                                              r"connection to it was closed \(no answer to ZeroMQ's pings within 1.5 s"):
            out.sync()
        assert time.monotonic() - t0 < 20
        with pytest.raises(OutputError, match="unreachable"):
            out.add("u", field(1, 2), time=1.0, member=2)
        with pytest.raises(OutputError, match="unreachable"):
            out.close()
    finally:
        if not gone(pid):  # the sender cannot kill what it cannot see; here it is the test's to end
            os.kill(pid, signal.SIGKILL)
    assert check_whole(d) == 1
