"""`enkflow bench io`: the promised JSON line (tiny sizes), and its references' correctness."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from enkflow.bench.io_refs import references
from enkflow.io.ensemble import EnsembleFiles
from enkflow.io.generate import make_ensemble
from enkflow.state import StateLayout

GBPS = {"read_gbps", "update_gbps", "safe_update_gbps", "pread_gbps", "pwrite_gbps", "pread_threads_gbps",
        "pwrite_threads_gbps", "netcdf4_read_gbps", "xarray_read_gbps", "peak_rss_mb"}
RATIOS = {"read_over_pread", "read_over_pread_threads", "read_over_netcdf4", "update_over_pwrite",
          "update_over_pwrite_threads", "safe_time_over_unsafe"}


@pytest.mark.parametrize("method", ["auto", "log"])
def test_bench_io_json(tmp_path, subprocess_env, method):
    r = subprocess.run(
        [sys.executable, "-m", "enkflow", "bench", "io", "--members", "3", "--mb-per-file", "0.5", "--repeat", "1",
         "--no-cold", "--format", "cdf5", "--threads", "2", "--dir", str(tmp_path), "--safe-method", method, "--json"],
        capture_output=True, text=True, env=subprocess_env, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert GBPS <= res.keys()
    assert all(isinstance(res[k], float) and res[k] > 0 for k in GBPS)
    assert res["threads"] == 2
    assert res["safe_update_method"] == {"auto": "shadow", "log": "log"}[method]
    assert f"({res['safe_update_method']}: {'shadows' if method == 'auto' else 'log'}+commit" in r.stdout
    assert RATIOS <= res["ratios"].keys()
    assert all(isinstance(v, float) and v > 0 for v in res["ratios"].values())
    assert res["ratios"]["read_over_pread_threads"] == pytest.approx(res["read_gbps"] / res["pread_threads_gbps"])
    assert "pread, 2 thread(s)" in r.stdout  # the text table shows the threaded reference beside the others
    assert res["verified_against_netcdf4"] is True
    assert res["files_unchanged"] is True
    assert list(tmp_path.iterdir()) == []  # generated files removed


def _file_hashes(paths: list[str]) -> list[str]:
    return [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]


@pytest.mark.parametrize("fmt", ["cdf2", "cdf5", "nc4"])
def test_write_references_leave_the_files_byte_identical(tmp_path, fmt):
    """The pwrite references write back the values there in the file's byte order (big-endian
    for NetCDF-3), so a kill right after them leaves valid files, not native-endian bytes."""
    paths, scfg = make_ensemble(tmp_path, 3, 0.2, fmt=fmt)
    layout = StateLayout.from_config(paths[0], scfg)
    with EnsembleFiles(paths, layout, mode="r") as ef:
        X = ef.read()
        structures = ef.structures
    before = _file_hashes(paths)
    # A small request size so that the NetCDF-3 conversion runs in several pieces.
    refs = references(paths, layout, structures, threads=2, chunk_bytes=4096)
    for name in ("pwrite", "pwrite_threads"):
        refs[name](X)
        assert _file_hashes(paths) == before, name


def test_threaded_pread_reads_what_pread_reads(tmp_path):
    paths, scfg = make_ensemble(tmp_path, 3, 0.2, fmt="cdf5")
    layout = StateLayout.from_config(paths[0], scfg)
    with EnsembleFiles(paths, layout, mode="r") as ef:
        refs = references(paths, layout, ef.structures, threads=2)
        A = np.zeros((layout.n_rows, 3), order="F")
        B = np.ones((layout.n_rows, 3), order="F")
    refs["pread"](A)
    refs["pread_threads"](B)
    assert np.array_equal(A.view(np.uint64), B.view(np.uint64))
