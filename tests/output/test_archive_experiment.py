"""Background archiving in a real offline experiment (local launcher, built-in LETKF, real model processes):
every cycle archived, `enkflow run --from-archive CYCLE` gives the same following cycle bitwise, a corrupted
archive is refused before anything is written, and a failing archive is reported (or stops the study)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from enkflow.experiment import Experiment, load_experiment
from enkflow.jobs.events import iter_events
from enkflow.output import archive as A
from enkflow.output.archive_background import ArchiveFailure
from enkflow.report import load_report, render_report
from enkflow_testing.experiments import restart_bytes, synth_problem, write_builtin_experiment

N = 4


@pytest.fixture(scope="module")
def problem(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_problem(tmp_path_factory.mktemp("synth"), N)


@pytest.fixture(scope="module")
def archived(tmp_path_factory: pytest.TempPathFactory, problem: Path) -> tuple[Path, list[bytes], list[bytes]]:
    """A 3-cycle experiment archiving every cycle; the restarts after cycles 2 and 3."""
    root = tmp_path_factory.mktemp("archived")
    toml = write_builtin_experiment(root, problem, members=N, cycles=2,
                                    extra='\n[archive]\ndir = "backup"\nkeep_last = 0\n')
    Experiment(load_experiment(toml)).run()
    after2 = restart_bytes(root, N)
    toml.write_text(toml.read_text().replace("cycles = 2", "cycles = 3"))
    shutil.copyfile(problem / "obs.nc", root / "obs" / "obs_003.nc")
    Experiment(load_experiment(toml)).run()
    return root, after2, restart_bytes(root, N)


def test_every_cycle_is_archived_with_the_restarts_after_its_analysis(archived) -> None:
    root, after2, _ = archived
    backup = root / "backup"
    assert A.listed_cycles(backup) == [1, 2, 3]
    man = A.verify(backup, 2)
    assert sorted(f["target"] for f in man["files"]) == [f"member:{m}" for m in range(1, N + 1)]
    out = root / "check"
    A.restore(backup, 2, {f"member:{m}": out / f"m{m}.nc" for m in range(1, N + 1)})
    assert [(out / f"m{m}.nc").read_bytes() for m in range(1, N + 1)] == after2
    ends = [e for e in iter_events(root / "exp" / "events.jsonl") if e["event"] == "archive_end"]
    assert sorted(e["cycle"] for e in ends) == [1, 2, 3]
    assert not list((root / "exp" / "archive" / "staging").glob("cycle_*"))


def test_from_archive_gives_the_same_next_cycle_bitwise(archived, problem: Path, tmp_path: Path) -> None:
    root, _, after3 = archived
    run = tmp_path / "copy"
    shutil.copytree(root, run, symlinks=True)
    # Paths in the experiment are relative to the TOML: the copy is an experiment of its own. Its restarts
    # are put back to the initial ensemble, so only a restore can give cycle 3's result.
    for m in range(1, N + 1):
        shutil.copyfile(problem / f"member_{m:04d}.nc", run / "members" / f"member_{m:04d}.nc")
    r = subprocess.run([sys.executable, "-m", "enkflow", "run", str(run / "exp.toml"), "--from-archive", "2", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert restart_bytes(run, N) == after3
    ev = list(iter_events(run / "exp" / "events.jsonl"))
    restore = [e for e in ev if e["event"] == "archive_restore"]
    assert len(restore) == 1 and restore[0]["cycle"] == 2
    after_restore = ev[ev.index(restore[0]):]
    # Only cycle 3 ran again; it was archived again.
    assert {e["cycle"] for e in after_restore if e["event"] == "task_end"} == {3}
    assert A.listed_cycles(run / "backup") == [1, 2, 3]
    assert A.verify(run / "backup", 3)


def test_a_corrupted_archive_is_refused_before_anything_is_written(archived, tmp_path: Path) -> None:
    root, _, after3 = archived
    run = tmp_path / "copy"
    shutil.copytree(root, run, symlinks=True)
    bad = A.cycle_dir(run / "backup", 1) / "member_0003.member_0003.nc.gz"
    data = bytearray(bad.read_bytes())
    data[100] ^= 0xFF
    bad.write_bytes(bytes(data))
    state = (run / "exp" / "state.json").read_bytes()
    listing = sorted(p.name for p in (run / "members").iterdir())
    r = subprocess.run([sys.executable, "-m", "enkflow", "run", str(run / "exp.toml"), "--from-archive", "1", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "SHA-256 checksum mismatch" in r.stderr and str(bad) in r.stderr
    assert restart_bytes(run, N) == after3
    assert (run / "exp" / "state.json").read_bytes() == state
    assert sorted(p.name for p in (run / "members").iterdir()) == listing
    assert (run / "exp" / "cycles" / "0003").is_dir()


@pytest.mark.parametrize("on_failure", ["warn", "stop"])
def test_a_failing_archive_is_reported_loudly_or_stops(tmp_path: Path, problem: Path, on_failure: str) -> None:
    (tmp_path / "blocker").write_text("a file where the archive directory should be")
    toml = write_builtin_experiment(tmp_path, problem, members=N, cycles=2,
                                    extra=f'\n[archive]\ndir = "blocker/backup"\non_failure = "{on_failure}"\n')
    cfg = load_experiment(toml)
    lines: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if on_failure == "stop":
            with pytest.raises(ArchiveFailure, match="archiving of cycle"):
                Experiment(cfg, progress=lines.append).run()
        else:
            Experiment(cfg, progress=lines.append).run()
    assert any("archiving of cycle" in str(w.message) for w in caught)
    assert any(line.startswith("WARNING: archiving of cycle") for line in lines)
    fails = [e for e in iter_events(cfg.expdir / "events.jsonl") if e["event"] == "archive_fail"]
    assert fails and str(tmp_path / "blocker") in fails[0]["error"]
    if on_failure == "warn":
        assert "archiving of cycle" in render_report(load_report(cfg.expdir))
        # The study itself went on.
        assert [e["cycle"] for e in iter_events(cfg.expdir / "events.jsonl") if e["event"] == "cycle_end"] == [1, 2]


def test_from_archive_refuses_a_missing_cycle_or_archive_before_writing(archived, tmp_path: Path) -> None:
    from enkflow.errors import ConfigError

    root, _, after3 = archived
    run = tmp_path / "copy"
    shutil.copytree(root, run, symlinks=True)
    shutil.rmtree(A.cycle_dir(run / "backup", 1))
    cfg = load_experiment(run / "exp.toml")
    with pytest.raises(A.ArchiveError, match=r"no complete archive of cycle 1 \(archived cycles: 2, 3\)"):
        Experiment(cfg).run(from_archive=1)
    with pytest.raises(ConfigError, match="cycle 9 is not a cycle of this experiment"):
        Experiment(cfg).run(from_archive=9)
    toml = run / "exp.toml"
    toml.write_text(toml.read_text().replace('dir = "backup"', ""))
    with pytest.raises(ConfigError, match=r"set \[archive\] dir"):
        Experiment(load_experiment(toml)).run(from_archive=2)
    assert restart_bytes(run, N) == after3
