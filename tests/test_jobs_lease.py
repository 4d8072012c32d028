"""The launcher's lease (enkflow.jobs.lease): a watcher judges the counter's progress by its own clock,
so a lease lapses only when the launcher stops renewing it, whatever the nodes' clocks say; another
launcher's lease or an ended one lapses at once; a rerun finds the records of an earlier run's
processes and waits for them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from enkflow.jobs.lease import LEASE_FILE, LeaseHolder, LeaseWatch, Verdict, stop_earlier


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
