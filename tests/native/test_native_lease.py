"""A native runner that ``enkflow run`` started (the lease in its environment) stops by itself once the
launcher's lease lapses: at once when another launcher holds it, after the timeout when its counter
stops moving (native/src/lease.c, as enkflow.jobs.lease for Python processes)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

PROGRAM = r"""
#include <unistd.h>
#include <enkflow_runner.h>
int main(int argc, char **argv) {
    enkflow_runner *r = 0;
    enkflow_runner_create(&r, "tcp://127.0.0.1:9", "token");
    sleep(120);  /* a runner waiting for a server that is gone */
    return 0;
}
"""


@pytest.fixture(scope="module")
def waiting_runner(native_build, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("lease-runner")
    (d / "r.c").write_text(PROGRAM)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "enkflow_runner"], env=native_build.env(),
                           capture_output=True, text=True, check=True).stdout.split()
    cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", str(d / "r.c"), "-o", str(d / "r"), *flags,
                         f"-Wl,-rpath,{native_build.lib}"], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    return d / "r"


@pytest.mark.parametrize("holder, ended, says", [("another", False, "took the lease over"),
                                                 ("mine", True, "its launcher ended"),
                                                 ("mine", False, "did not renew")])
def test_a_native_runner_stops_once_the_lease_lapses(waiting_runner: Path, tmp_path: Path, holder: str, ended: bool,
                                                     says: str) -> None:
    (tmp_path / "lease.json").write_text(json.dumps({"holder": holder, "counter": 3, "ended": ended}))
    env = {"ENKFLOW_LEASE_DIR": str(tmp_path), "ENKFLOW_LEASE_ID": "mine", "ENKFLOW_LEASE_TIMEOUT": "1"}
    p = subprocess.run([str(waiting_runner)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGTERM, p.stderr
    assert says in p.stderr


def test_a_native_runner_registers_beats_and_a_rerun_drops_its_record_once_it_is_gone(waiting_runner: Path,
                                                                                      tmp_path: Path) -> None:
    from enkflow.jobs.files import hostname
    from enkflow.jobs.lease import LeaseHolder
    from enkflow.jobs.lease_procs import records, wait_gone

    lease = LeaseHolder(tmp_path, timeout_s=2.0)
    p = subprocess.Popen([str(waiting_runner)], env=lease.env, stderr=subprocess.PIPE, text=True)
    try:
        while not (recs := records(tmp_path)):
            assert p.poll() is None, p.stderr.read() if p.stderr else ""
            time.sleep(0.02)
        [r] = recs
        assert (r.host, r.pid, r.holder, r.role) == (hostname(), p.pid, lease.holder, "native runner")
        assert r.alive()  # its start time is the one psutil gives: a rerun tells it from a later pid
        while r.path.stat().st_mtime > 1e6:  # until its first beat: the time becomes a counter (1 s, 2 s, ...)
            time.sleep(0.02)
    finally:
        lease.close()  # ended: the runner gets SIGTERM, which kills it (no handler), record left
        assert p.wait(timeout=60) == -signal.SIGTERM
    assert [g.pid for g in wait_gone(tmp_path, "rerun", bound_s=600.0)] == [p.pid]
    assert records(tmp_path) == []
