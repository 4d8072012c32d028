"""The launcher's lease (enkflow.jobs.lease): a watcher judges the counter's progress by its own clock,
so a lease lapses only when the launcher stops renewing it, whatever the nodes' clocks say; another
launcher's lease or an ended one lapses at once; a rerun finds the records of an earlier run's
processes and waits for them, judging those on other nodes by their records' beats."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

from enkflow.jobs.files import hostname
from enkflow.jobs.lease import LEASE_FILE, LeaseHolder, LeaseWatch, Verdict, stop_earlier
from enkflow.jobs.lease_procs import PROCS_DIR, LeasedProcess, _Beats, forget_ended, records, wait_gone


def _write(d, holder, counter, ended=False):
    (d / LEASE_FILE).write_text(json.dumps({"holder": holder, "counter": counter, "ended": ended}))


def test_the_lease_lapses_only_when_its_counter_stops_moving_by_the_watchers_clock(tmp_path):
    w = LeaseWatch(tmp_path, "me", timeout_s=10.0, now=1000.0)
    for k, now in enumerate([1001.0, 1009.0, 1017.0, 1025.0]):  # renewed every 8 s: held
        _write(tmp_path, "me", k)
        assert w.look(now) is Verdict.HELD
    assert w.look(1034.0) is Verdict.HELD  # 9 s without a renewal
    assert w.look(1036.0) is Verdict.SILENT  # 11 s


def test_an_unreadable_lease_is_no_renewal(tmp_path):
    w = LeaseWatch(tmp_path, "me", timeout_s=5.0, now=0.0)
    assert w.look(4.0) is Verdict.HELD
    assert w.look(6.0) is Verdict.SILENT


def test_another_launchers_lease_or_an_ended_one_lapses_at_once(tmp_path):
    _write(tmp_path, "someone-else", 1)
    assert LeaseWatch(tmp_path, "me", 30.0, now=0.0).look(0.1) is Verdict.TAKEN
    _write(tmp_path, "me", 1, ended=True)
    assert LeaseWatch(tmp_path, "me", 30.0, now=0.0).look(0.1) is Verdict.ENDED


def test_a_watched_process_stops_when_a_new_launcher_takes_the_lease_and_the_rerun_waits_for_it(tmp_path):
    old = LeaseHolder(tmp_path, timeout_s=2.0)
    code = "from enkflow.jobs.lease import watch_from_environment as w; import time; w('test'); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], env=os.environ | old.env, stderr=subprocess.PIPE, text=True)
    try:
        while not list((tmp_path / "procs").glob("*.json")):
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        old.close()  # no more renewals, as after a kill -9 of the launcher
        new = LeaseHolder(tmp_path, timeout_s=2.0)
        earlier = stop_earlier(new)
        new.close()
        assert [r.pid for r in earlier] == [proc.pid]
        assert proc.wait(timeout=30) == -signal.SIGTERM
        assert "stopping" in proc.stderr.read()
        assert not list((tmp_path / "procs").glob("*.json"))
    finally:
        proc.kill()
        proc.wait()


def _record(d, name, host, pid, holder, period_s=1.0, ctime=None):
    (d / PROCS_DIR).mkdir(exist_ok=True)
    ctime = psutil.Process(pid).create_time() if ctime is None else ctime
    (d / PROCS_DIR / name).write_text(json.dumps({"host": host, "pid": pid, "ctime": ctime, "holder": holder,
                                                  "role": "test", "period_s": period_s}))
    return d / PROCS_DIR / name


def test_an_emptied_record_names_nothing_and_the_rerun_goes_on(tmp_path):
    (tmp_path / PROCS_DIR).mkdir()
    (tmp_path / PROCS_DIR / "node-1.json").write_text("")  # a node crash with writes that were not durable
    (tmp_path / PROCS_DIR / "node-2.json").write_text('{"host": "no')
    assert wait_gone(tmp_path, "new", bound_s=600.0) == []
    assert not list((tmp_path / PROCS_DIR).iterdir())


def test_a_record_on_another_node_is_gone_once_its_beat_stops_by_the_reruns_clock(tmp_path):
    path = _record(tmp_path, "far-7.json", "far", 7, "old", period_s=2.0, ctime=0.0)
    [r] = records(tmp_path)
    beats = _Beats()
    assert not beats.silent(r, 100.0)
    os.utime(path, (1, 1))  # a beat
    assert not beats.silent(r, 107.0) and not beats.silent(r, 114.0)  # 7 s without a beat: 3.5 periods
    assert beats.silent(r, 116.0)  # 9 s: more than 4 periods
    path.unlink()
    assert beats.silent(r, 116.5)  # ended normally


def test_a_rerun_does_not_wait_for_a_silent_record_nor_a_dead_process_here(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _record(tmp_path, "here.json", hostname(), int(done.stdout), "old", ctime=0.0)
    _record(tmp_path, "far-7.json", "far", 7, "old", period_s=0.02, ctime=0.0)
    gone = wait_gone(tmp_path, "new", bound_s=600.0)
    assert sorted(r.host for r in gone) == ["far", hostname()]
    assert not list((tmp_path / PROCS_DIR).iterdir())


def test_at_a_clean_end_the_launcher_drops_its_records_but_those_of_live_processes_here(tmp_path):
    mine = _record(tmp_path, "me.json", hostname(), os.getpid(), "launcher")
    _record(tmp_path, "far-7.json", "far", 7, "launcher", ctime=0.0)  # killed by mpiexec: no exit handler ran
    other = _record(tmp_path, "far-8.json", "far", 8, "another", ctime=0.0)
    forget_ended(tmp_path, "launcher")
    assert sorted((tmp_path / PROCS_DIR).iterdir()) == sorted([mine, other])
    assert isinstance(records(tmp_path)[0], LeasedProcess)


def test_a_runner_built_on_the_documented_api_watches_the_lease(tmp_path):
    lease = LeaseHolder(tmp_path, timeout_s=60.0)
    code = ("import glob, sys; from enkflow.online.runner import Runner; r = Runner('tcp://127.0.0.1:9', 'token'); "
            "print(len(glob.glob(sys.argv[1] + '/procs/*.json')))")
    try:
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=os.environ | lease.env,
                             capture_output=True, text=True, check=True).stdout
    finally:
        lease.close()
    assert out.strip() == "1"
    assert not list((tmp_path / PROCS_DIR).iterdir())  # removed at its exit
