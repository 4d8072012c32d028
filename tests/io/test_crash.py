"""Fault injection: SIGKILL the updating process at random moments, rerun, compare every byte; for
each method of the crash-safe update (shadow files, the write-ahead log).

Each trial copies pristine files, starts a real process that runs a crash-safe update, kills it
with SIGKILL after a random delay drawn over the update's duration, then reruns it. The rerun
first finishes any committed update (and must then see all files either untouched or fully
updated, never a mix), then updates again; every file must end byte-identical to the
fault-free result.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from io_helpers import netcdf4_X

from enkflow.io.generate import land_mask_config, make_ensemble
from enkflow.state import StateLayout

CHILD = Path(__file__).with_name("crash_child.py")
TRIALS = 12  # per method: each of the four kinds of kill three times (benchmarks/fault_trials.py runs more)


def _start(d: Path, log_dir: Path, method: str, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(CHILD), str(d), str(log_dir), method, *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(p: subprocess.Popen[str], word: str) -> str:
    while True:
        line = p.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise AssertionError(f"child ended before '{word}': {p.stderr.read()}")  # type: ignore[union-attr]
        if line.startswith(word):
            return line


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["shadow", "log"])
def test_sigkill_at_random_moments(tmp_path, subprocess_env, method):
    rng = random.Random(20200716)
    pristine = {}
    for kind, fmt in (("plain", "nc4"), ("masked", "cdf5")):
        d = tmp_path / f"pristine_{kind}"
        paths, _ = make_ensemble(d, 6, 3.0, fmt=fmt, dtypes=("f8", "f4"))
        lay = StateLayout.from_file(paths[0], ["var0", "var1"], mask=land_mask_config() if kind == "masked" else None)
        np.save(d / "old.npy", netcdf4_X(paths, lay))
        pristine[kind] = d

    # fault-free results and the update's duration
    expected, duration = {}, {}
    for kind, d in pristine.items():
        ok = tmp_path / f"ok_{kind}"
        shutil.copytree(d, ok)
        p = _start(ok, tmp_path / "wal", method, subprocess_env)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        secs, log_secs = (float(x) for x in out.split("done")[1].split()[:2])
        duration[kind] = (log_secs, secs)
        expected[kind] = {f.name: f.read_bytes() for f in ok.glob("member_*.nc")}

    phases = {"before-commit": 0, "after-commit": 0}
    for trial in range(TRIALS):
        kind = ("plain", "masked")[trial % 2]
        d = tmp_path / f"t{trial}_{kind}"
        shutil.copytree(pristine[kind], d)
        wal_dir = tmp_path / f"wal{trial}"
        # Every fourth kill lands right after the commit marker (the child pauses there): random
        # delays alone can all miss that window on a loaded machine.
        pause = trial % 4 == 3
        p = _start(d, wal_dir, method, subprocess_env, *(["pause"] if pause else []))
        _wait_for(p, "go")
        t_log, t_all = duration[kind]
        if pause:
            _wait_for(p, "committed")
        else:
            # the other kills aim at the log phase and at the in-place writes after the commit
            time.sleep(rng.uniform(0.0, t_log) if trial % 4 < 2 else rng.uniform(t_log, 1.1 * t_all))
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        committed = bool(list(d.glob(".enkflow-update-*.json")))
        phases["after-commit" if committed else "before-commit"] += 1

        q = _start(d, wal_dir, method, subprocess_env)
        out, err = q.communicate(timeout=60)
        assert q.returncode == 0, err
        state = out.split("state")[1].split()[0]
        assert state in ("old", "new"), f"trial {trial}: files hold a mix after recovery"
        if committed:
            assert state == "new", f"trial {trial}: a committed update was not finished"
        got = {f.name: f.read_bytes() for f in d.glob("member_*.nc")}
        diffs = [n for n in expected[kind] if got[n] != expected[kind][n]]
        assert diffs == [], f"trial {trial} ({kind}): {diffs} differ from the fault-free run"
        assert not list(d.glob(".enkflow-*")) and not list(d.glob(".member_*")), "marker, shadow or spare left behind"
        assert not list(wal_dir.glob("*.log")), "log files left behind"
        shutil.rmtree(d)
    print(f"kills: {phases}")
    assert phases["before-commit"] > 0 and phases["after-commit"] > 0, phases
