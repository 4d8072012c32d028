"""`enkflow bench io` runs end to end and ends with the promised JSON line (tiny sizes)."""

from __future__ import annotations

import json
import subprocess
import sys

KEYS = {"read_gbps", "update_gbps", "safe_update_gbps", "pread_gbps", "pwrite_gbps", "netcdf4_read_gbps", "xarray_read_gbps", "peak_rss_mb"}


def test_bench_io_json(tmp_path, subprocess_env):
    r = subprocess.run(
        [sys.executable, "-m", "enkflow", "bench", "io", "--members", "3", "--mb-per-file", "0.5", "--repeat", "1",
         "--no-cold", "--format", "cdf5", "--dir", str(tmp_path), "--json"],
        capture_output=True, text=True, env=subprocess_env, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert KEYS <= res.keys()
    assert all(isinstance(res[k], float) and res[k] > 0 for k in KEYS)
    assert res["verified_against_netcdf4"] is True
    assert list(tmp_path.iterdir()) == []  # generated files removed
