"""A cycle's analysis is applied once: reruns after a kill or a failure at any point after the
write-ahead log's commit find the completion record and assimilate nothing again."""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest

from enkflow.errors import RecoveryError, StorageError
from enkflow.experiment import analysis_step
from enkflow.experiment.analysis_step import AnalysisFiles, analyse_files
from enkflow.io import wal
from enkflow.io.config import IOConfig

from analysis.test_analysis_step import N, STATE, analysis, copy, synth


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return synth(tmp_path_factory.mktemp("synth"), "tiny", N)


class Killed(BaseException):
    """Stands for a kill: nothing after it runs in that process (BaseException: no handler catches it)."""


def states(paths) -> list[np.ndarray]:
    out = []
    for p in paths:
        with netCDF4.Dataset(p) as ds:
            out.append(np.array(ds["soil_moisture"][:]))
    return out


def run(tmp, paths, cycle=1, **kw):
    files = AnalysisFiles(applied=tmp / "applied.json", mean=tmp / "mean.nc", spread=tmp / "spread.nc")
    return analyse_files(paths, tmp / "d" / "obs.nc", STATE, analysis(), cycle=cycle, files=files, **kw)


@pytest.fixture
def reference(synth_dir, tmp_path_factory):
    t = tmp_path_factory.mktemp("ref")
    paths = copy(synth_dir, t / "d")
    res = run(t, paths)
    with netCDF4.Dataset(t / "mean.nc") as ds:
        mean = np.array(ds["soil_moisture"][:])
    return states(paths), res, mean


@pytest.mark.parametrize("where", ["clear", "write_completion", "mean_spread"])
def test_a_kill_after_the_commit_never_analyses_twice(synth_dir, tmp_path, monkeypatch, reference, where):
    ref_states, ref_res, ref_mean = reference
    paths = copy(synth_dir, tmp_path / "d")

    def boom(*a, **k):
        raise Killed(where)

    target = {"clear": (wal, "clear"), "write_completion": (wal, "write_completion"),
              "mean_spread": (analysis_step, "write_mean_spread")}[where]
    with monkeypatch.context() as mp:
        mp.setattr(*target, boom)
        with pytest.raises(Killed):
            run(tmp_path, paths)
    res = run(tmp_path, paths)  # the retry: recovery finishes the update, then nothing is assimilated again
    assert res["already_applied"] == 1.0
    # Before the fix the retry's background innovation equalled the first run's analysis residual.
    assert res["omb_rms"] == ref_res["omb_rms"] and res["oma_rms"] == ref_res["oma_rms"]
    for a, b in zip(states(paths), ref_states):
        assert np.array_equal(a, b)
    with netCDF4.Dataset(tmp_path / "mean.nc") as ds:
        assert np.array_equal(np.array(ds["soil_moisture"][:]), ref_mean)
    assert not wal.pending_markers([str(p) for p in paths])


def test_a_full_disk_while_writing_the_mean_then_a_rerun(synth_dir, tmp_path, monkeypatch, reference):
    ref_states, _, _ = reference
    paths = copy(synth_dir, tmp_path / "d")

    def full(*a, **k):
        raise StorageError("cannot write: no space left on the device", path=str(tmp_path / "mean.nc"))

    with monkeypatch.context() as mp:
        mp.setattr(analysis_step, "write_mean_spread", full)
        with pytest.raises(StorageError, match="mean.nc"):
            run(tmp_path, paths)
    assert run(tmp_path, paths)["already_applied"] == 1.0
    for a, b in zip(states(paths), ref_states):
        assert np.array_equal(a, b)


def test_a_record_of_another_cycle_is_refused(synth_dir, tmp_path):
    paths = copy(synth_dir, tmp_path / "d")
    run(tmp_path, paths, cycle=1)
    with pytest.raises(RecoveryError, match="cycle 1, not of cycle 2"):
        run(tmp_path, paths, cycle=2)


def test_an_interrupted_update_without_the_log_is_refused(synth_dir, tmp_path, monkeypatch):
    paths = copy(synth_dir, tmp_path / "d")
    io = IOConfig.model_validate({"safe_update": {"enabled": False}})
    with monkeypatch.context() as mp:
        mp.setattr(wal, "write_completion", lambda *a, **k: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            run(tmp_path, paths, io=io)
    with pytest.raises(RecoveryError, match="interrupted while the write-ahead log was off"):
        run(tmp_path, paths, io=io)
