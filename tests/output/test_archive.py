"""The archive itself, on real files and a real archiver process: stage, compress, checksums, retention,
restore, a corrupted archive, and a kill -9 of the archiver mid-copy."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from enkflow.output import archive as A


def _files(d: Path, n: int = 3, size: int = 200_000, seed: int = 0) -> list[tuple[Path, str, str]]:
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = []
    for m in range(1, n + 1):
        p = d / f"member_{m:04d}.nc"
        # Half smooth (compressible), half noise: like a restart of float fields.
        p.write_bytes(np.cumsum(rng.standard_normal(size // 16)).tobytes() + rng.bytes(size // 2))
        out.append((p, p.name, f"member:{m}"))
    return out


def test_round_trip_checksums_and_retention(tmp_path: Path) -> None:
    src = _files(tmp_path / "restarts")
    staging, root = tmp_path / "staging", tmp_path / "archive"
    original = {t: p.read_bytes() for p, _, t in src}
    for cycle in range(1, 8):
        A.stage(staging, cycle, src, {"mode": "test"})
    assert A.staged_cycles(staging) == list(range(1, 8))
    done = A.archive_staged(staging, root, A.Policy(keep_last=2, keep_every=3))
    assert [d["cycle"] for d in done] == list(range(1, 8))
    assert all(d["bytes"] < d["bytes_raw"] for d in done)  # gzip did compress
    assert A.staged_cycles(staging) == []
    # keep_last 2 -> 6, 7; keep_every 3 -> 3, 6
    assert A.listed_cycles(root) == [3, 6, 7]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
    man = A.verify(root, 6)
    for f in man["files"]:
        assert hashlib.sha256((A.cycle_dir(root, 6) / f["name"]).read_bytes()).hexdigest() == f["sha256"]
    # Restore into fresh paths: the same bytes.
    for p, _, _ in src:
        p.write_bytes(b"changed")
    A.restore(root, 6, {t: p for p, _, t in src})
    for p, _, t in src:
        assert p.read_bytes() == original[t]
    with pytest.raises(A.ArchiveError, match=r"no complete archive of cycle 5 \(archived cycles: 3, 6, 7\)"):
        A.verify(root, 5)


def test_a_corrupted_file_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    src = _files(tmp_path / "restarts")
    staging, root = tmp_path / "staging", tmp_path / "archive"
    A.stage(staging, 4, src, {})
    A.archive_staged(staging, root, A.Policy())
    bad = A.cycle_dir(root, 4) / "member_0002.nc.gz"
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x01
    bad.write_bytes(bytes(data))
    for p, _, _ in src:
        p.write_bytes(b"current")
    called = []
    with pytest.raises(A.ArchiveError, match="SHA-256 checksum mismatch") as ei:
        A.restore(root, 4, {t: p for p, _, t in src}, before_write=lambda: called.append(1))
    assert ei.value.path == str(bad)
    assert called == []
    assert all(p.read_bytes() == b"current" for p, _, _ in src)
    assert not [p for p in (tmp_path / "restarts").iterdir() if p.name.startswith(".")]
    # A missing file is named too.
    bad.unlink()
    with pytest.raises(A.ArchiveError, match="missing") as ei:
        A.verify(root, 4)
    assert ei.value.path == str(bad)


def test_kill_9_of_the_archiver_mid_copy_leaves_nothing_under_a_final_name(tmp_path: Path) -> None:
    # Large enough (3 x 16 MB, compressed at the slowest level) that the archiver is caught mid-copy.
    src = _files(tmp_path / "restarts", n=3, size=16 << 20)
    staging, root = tmp_path / "staging", tmp_path / "archive"
    A.stage(staging, 1, src, {})
    proc = subprocess.Popen([sys.executable, "-m", "enkflow.output.archive", str(staging), str(root), "--level", "9"])
    tmpdir = root / f".cycle_0001.tmp.{proc.pid}"
    deadline = time.time() + 60
    while time.time() < deadline:
        parts = list(tmpdir.glob("*.gz")) if tmpdir.exists() else []
        if parts and parts[0].stat().st_size > 0:
            break
        assert proc.poll() is None, "the archiver finished before it could be killed"
        time.sleep(0.005)
    else:
        pytest.fail("the archiver never started writing")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not A.cycle_dir(root, 1).exists()
    assert A.listed_cycles(root) == []
    assert tmpdir.exists()  # the half-written copy is left, under a temporary name only
    assert A.staged_cycles(staging) == [1]  # still staged: the next archiver does it again
    # The next cycle's archiver removes the dead one's leftovers and archives both cycles.
    A.stage(staging, 2, src[:1], {})
    rc = subprocess.run([sys.executable, "-m", "enkflow.output.archive", str(staging), str(root), "--keep-last", "0"])
    assert rc.returncode == 0
    assert not tmpdir.exists()
    assert A.listed_cycles(root) == [1, 2]
    assert len(A.verify(root, 1)["files"]) == 3 and len(A.verify(root, 2)["files"]) == 1


def test_the_archiver_process_reports_an_unwritable_archive(tmp_path: Path) -> None:
    src = _files(tmp_path / "restarts", n=1)
    staging = tmp_path / "staging"
    A.stage(staging, 1, src, {})
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    r = subprocess.run([sys.executable, "-m", "enkflow.output.archive", str(staging), str(blocker / "archive")],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "enkflow archiver: error" in r.stderr and str(blocker) in r.stderr
    assert A.staged_cycles(staging) == [1]


def test_uncompressed_archive_round_trip(tmp_path: Path) -> None:
    src = _files(tmp_path / "restarts", n=2)
    original = {t: p.read_bytes() for p, _, t in src}
    A.stage(tmp_path / "staging", 5, src, {}, link=True)  # hard links: the sources are not rewritten here
    A.archive_staged(tmp_path / "staging", tmp_path / "archive", A.Policy(compression="none"))
    man = A.verify(tmp_path / "archive", 5)
    assert [f["name"] for f in man["files"]] == ["member_0001.nc", "member_0002.nc"]
    assert all(f["bytes"] == f["bytes_raw"] and f["sha256"] == f["sha256_raw"] for f in man["files"])
    out = {t: tmp_path / "out" / f"{t}.nc".replace(":", "_") for t in original}
    A.restore(tmp_path / "archive", 5, out)
    assert {t: p.read_bytes() for t, p in out.items()} == original


def test_a_stopped_archiver_is_killed_and_reported_not_waited_for(tmp_path: Path) -> None:
    """SIGSTOP of the background archiver: the run's final wait gives up after [archive] timeout seconds
    without progress, kills it and reports the failure (here on_failure = "stop"); the cycle stays staged
    for the next run and nothing is under a final name."""
    from enkflow.jobs.events import EventLog, iter_events
    from enkflow.output.archive_background import ArchiveFailure, ArchiveSetup, BackgroundArchiver

    staging, root = tmp_path / "staging", tmp_path / "archive"
    setup = ArchiveSetup(root=root, staging=staging, log=tmp_path / "archiver.log", keep_last=3, keep_every=0,
                         compression="gzip", level=1, on_failure="stop", timeout=1.0)
    arch = BackgroundArchiver(setup, EventLog(tmp_path / "events.jsonl"))
    arch.stage(1, _files(tmp_path / "restarts", n=1), {})
    assert arch._proc is not None
    os.kill(arch._proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    with pytest.warns(RuntimeWarning, match="made no progress"), pytest.raises(ArchiveFailure, match=r"archiving of cycle\(s\) 1 .* failed \(made no progress for \d+ s; "
                                             r"the process was stopped \(SIGSTOP\?\); killed \(\[archive\] timeout = 1 s\)\)"):
        arch.finish(retries=0)
    assert time.monotonic() - t0 < 10
    assert A.staged_cycles(staging) == [1] and A.listed_cycles(root) == []
    assert [e["event"] for e in iter_events(tmp_path / "events.jsonl")].count("archive_fail") == 1
