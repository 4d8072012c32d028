"""The crash-safe update through shadow files (``[io.safe_update] method = "shadow"``): the same bytes as
the log, recovery of a committed update from any point, damage caught, leftovers removed, and the
cases where ``auto`` keeps the log."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from io_helpers import netcdf4_X

from enkflow.errors import FileFormatError, RecoveryError, StorageError
from enkflow.io import EnsembleFiles, IOConfig, SafeUpdateConfig, UpdateMethod, shadow, shadow_plan
from enkflow.io import read_structure
from enkflow.io.generate import land_mask_config
from enkflow.state import StateLayout


class Killed(BaseException):
    """Stands for a kill right after the commit: nothing after it runs."""


def _layout(paths: list[str], masked: bool = True) -> StateLayout:
    return StateLayout.from_file(paths[0], ["var0", "var1"], mask=land_mask_config() if masked else None)


def _cfg(method: UpdateMethod) -> IOConfig:
    return IOConfig(chunk_kb=16, safe_update=SafeUpdateConfig(method=method))


def _update(paths: list[str], method: UpdateMethod, masked: bool = True) -> np.ndarray:
    lay = _layout(paths, masked)
    with EnsembleFiles(paths, lay, mode="r+", config=_cfg(method)) as ef:
        Xn = np.asfortranarray(np.sin(ef.read()) * 3.0 + np.arange(len(paths)))
        ef.update(Xn)
    return Xn


def _files(paths: list[str]) -> list[bytes]:
    return [Path(p).read_bytes() for p in paths]


def _committed_then_killed(paths: list[str], monkeypatch: pytest.MonkeyPatch, renamed: int = 0) -> Path:
    """Run a shadow update that stops after its commit and ``renamed`` renames; returns its marker."""
    real_rename = os.rename
    done = [0]

    def rename(a: str, b: str) -> None:
        if shadow_plan.INFIX in os.path.basename(a):
            if done[0] == renamed:
                raise Killed
            done[0] += 1
        real_rename(a, b)

    monkeypatch.setattr(shadow_plan.os, "rename", rename)
    with pytest.raises(Killed):
        _update(paths, UpdateMethod.SHADOW)
    monkeypatch.setattr(shadow_plan.os, "rename", real_rename)
    markers = list(Path(paths[0]).parent.glob(".enkflow-update-*.json"))
    assert len(markers) == 1
    return markers[0]


@pytest.mark.parametrize("fmt,dts,masked", [("nc4", ("f8", "f4"), True), ("cdf5", ("f4", "f8"), True),
                                            ("cdf2", ("f8", "f8"), False)])
def test_shadow_files_hold_the_bytes_the_log_writes(ensemble, fmt, dts, masked):
    pa, _ = ensemble(fmt, dts, n=4)
    pb, _ = ensemble(fmt, dts, n=4)
    _update(pa, UpdateMethod.SHADOW, masked)
    _update(pb, UpdateMethod.LOG, masked)
    assert _files(pa) == _files(pb)
    assert not [f for f in os.listdir(Path(pa[0]).parent) if f.startswith(".")]  # no shadow, no marker left


@pytest.mark.parametrize("renamed", [0, 2, 3])
def test_a_committed_update_is_finished_by_the_next_open(ensemble, monkeypatch, renamed):
    """Killed after its commit, with none, some or all of the shadows renamed: the next open finishes it."""
    pa, _ = ensemble("cdf5", ("f8", "f4"), n=4)
    pb, _ = ensemble("cdf5", ("f8", "f4"), n=4)
    _update(pb, UpdateMethod.SHADOW)
    marker = _committed_then_killed(pa, monkeypatch, renamed)
    assert len(json.loads(marker.read_text())["shadows"]) == 4
    with EnsembleFiles(pa, _layout(pa), mode="r") as ef:
        assert ef.recovered_bytes == sum(os.path.getsize(p) for p in pa[renamed:])
    assert _files(pa) == _files(pb)
    assert not [f for f in os.listdir(Path(pa[0]).parent) if f.startswith(".")]


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x10]))


@pytest.mark.parametrize("where", ["written", "unwritten", "size", "missing"])
def test_a_damaged_shadow_is_refused_and_nothing_is_renamed(ensemble, monkeypatch, where):
    pa, _ = ensemble("cdf5", ("f8", "f4"), n=3)
    before = _files(pa)
    marker = _committed_then_killed(pa, monkeypatch)
    body = json.loads(marker.read_text())
    victim = body["shadows"][1]["path"]
    state = [w for w in body["written"] if w[0] == 1]
    if where == "written":  # a byte the update wrote
        _flip(victim, state[len(state) // 2][1] + 3)
    elif where == "unwritten":  # a byte of the file's header, copied from the file
        _flip(victim, 5)
    elif where == "size":
        os.truncate(victim, os.path.getsize(victim) - 8)
    else:
        os.unlink(victim)
    with pytest.raises(RecoveryError) as ei:
        EnsembleFiles(pa, _layout(pa), mode="r")
    assert ei.value.path == victim
    assert _files(pa) == before  # refused before any rename
    assert marker.exists()


def test_leftovers_of_an_update_killed_before_its_commit_go_at_the_next_update_open(ensemble):
    pa, _ = ensemble("nc4", ("f8", "f8"), n=2)
    left = Path(shadow.shadow_path(os.path.realpath(pa[0]), "dead-update"))
    left.write_bytes(b"half a file")
    EnsembleFiles(pa, _layout(pa), mode="r").close()
    assert left.exists()  # a reader never removes what an updater may be writing
    EnsembleFiles(pa, _layout(pa), mode="r+").close()
    assert not left.exists()


def test_a_leftover_that_cannot_be_removed_stays_and_the_update_opens(ensemble, monkeypatch):
    """Leftovers cost only space: an error removing one must not stop the open (nor, under MPI, leave the
    other ranks waiting for rank 0's verdict)."""
    pa, _ = ensemble("nc4", ("f8", "f8"), n=2)
    left = Path(shadow.shadow_path(os.path.realpath(pa[0]), "dead-update"))
    left.write_bytes(b"half a file")

    unlink = os.unlink

    def refused(path: str, *a: object, **k: object) -> None:
        if os.path.basename(path) == left.name:
            raise PermissionError(1, "Operation not permitted", path)
        unlink(path, *a, **k)

    monkeypatch.setattr(os, "unlink", refused)
    EnsembleFiles(pa, _layout(pa), mode="r+").close()
    assert left.exists()


def test_a_failure_before_the_commit_removes_the_shadows_and_leaves_the_files(ensemble, monkeypatch):
    pa, _ = ensemble("cdf5", ("f8", "f4"), n=3)
    before = _files(pa)

    def full(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shadow, "copy_range", full)
    with pytest.raises(Exception, match="no space left"):
        _update(pa, UpdateMethod.SHADOW)
    assert _files(pa) == before
    assert not [f for f in os.listdir(Path(pa[0]).parent) if f.startswith(".")]


def test_a_symlinked_member_keeps_its_link_and_the_file_it_names_is_replaced(ensemble, tmp_path):
    pa, _ = ensemble("cdf2", ("f8", "f8"), n=2)
    pb, _ = ensemble("cdf2", ("f8", "f8"), n=2)
    link = tmp_path / "link_0001.nc"
    link.symlink_to(pa[0])
    _update([str(link), pa[1]], UpdateMethod.SHADOW)
    _update(pb, UpdateMethod.SHADOW)
    assert link.is_symlink() and os.readlink(link) == pa[0]
    assert _files(pa) == _files(pb)


def test_auto_keeps_the_log_for_a_hard_linked_file_and_shadow_refuses_it(ensemble, tmp_path):
    pa, _ = ensemble("nc4", ("f8", "f8"), n=2)
    os.link(pa[1], tmp_path / "other_name.nc")
    lay = _layout(pa)
    with EnsembleFiles(pa, lay, mode="r+", config=_cfg(UpdateMethod.AUTO)) as ef:
        assert ef.update_method is UpdateMethod.LOG
    with pytest.raises(FileFormatError, match="2 hard links") as ei:
        EnsembleFiles(pa, lay, mode="r+", config=_cfg(UpdateMethod.SHADOW))
    assert ei.value.path == pa[1]


def test_gaps_are_what_no_written_range_covers():
    assert shadow_plan.gaps([(10, 5), (0, 4), (12, 8)], 30) == [(4, 6), (20, 10)]
    assert shadow_plan.gaps([], 7) == [(0, 7)]
    assert shadow_plan.gaps([(0, 7)], 7) == []


def _area_offset(path: str) -> int:
    return read_structure(path).variables["area"].offset


@pytest.mark.parametrize("meddle", ["another-writer", "spare-deleted", "unsafe-between", "none"])
def test_successive_updates_of_one_object_write_what_one_update_writes(ensemble, meddle):
    """An object keeps the files its shadow updates replaced as its next shadows (their unwritten bytes
    already there): whatever happens between two updates, the files end as a fresh update leaves them."""
    pa, _ = ensemble("nc4", ("f8", "f4"), n=3)
    pb, _ = ensemble("nc4", ("f8", "f4"), n=3)
    lay = _layout(pa)
    at = _area_offset(pa[1])
    with EnsembleFiles(pa, lay, mode="r+", config=_cfg(UpdateMethod.SHADOW)) as ef:
        X = ef.read()
        assert ef.prepare_update() >= 0.0
        spares = sorted(Path(pa[0]).parent.glob(f".member_*{shadow_plan.SPARE_INFIX}*"))
        assert len(spares) == 3  # copies of the files, made before the first update
        ef.update(np.asfortranarray(X + 1.0))
        if meddle == "another-writer":  # a byte the update does not write: the next one keeps it
            with open(pa[1], "r+b") as fh:
                fh.seek(at)
                fh.write(b"\x01\x02\x03\x04")
        elif meddle == "spare-deleted":
            for p in Path(pa[0]).parent.glob(f".member_*{shadow_plan.SPARE_INFIX}*"):
                p.unlink()
        elif meddle == "unsafe-between":
            ef.update(np.asfortranarray(X * 3.0), safe=False)
        ef.update(np.asfortranarray(X + 2.0))
        assert np.array_equal(ef.read(), netcdf4_X(pa, lay))
    if meddle == "another-writer":
        with open(pb[1], "r+b") as fh:
            fh.seek(at)
            fh.write(b"\x01\x02\x03\x04")
    with EnsembleFiles(pb, lay, mode="r+", config=_cfg(UpdateMethod.LOG)) as ef:
        ef.update(np.asfortranarray(ef.read() + 2.0))
    assert _files(pa) == _files(pb)
    assert not [f for f in os.listdir(Path(pa[0]).parent) if f.startswith(".")]  # the spares went at close


def test_shadows_that_do_not_fit_are_refused_before_any_is_written(ensemble, monkeypatch):
    pa, _ = ensemble("cdf5", ("f8", "f4"), n=3)
    before = _files(pa)
    real = os.statvfs

    class Full:
        def __init__(self, path: str):
            st = real(path)
            self.f_frsize, self.f_bavail = st.f_frsize, 1

    monkeypatch.setattr(shadow.os, "statvfs", Full)
    with pytest.raises(StorageError, match="shadow files need .* GB beside the member files") as ei:
        _update(pa, UpdateMethod.SHADOW)
    assert ei.value.path == str(Path(pa[0]).parent.resolve())
    assert _files(pa) == before
    assert not [f for f in os.listdir(Path(pa[0]).parent) if f.startswith(".")]


def test_two_paths_of_one_file_keep_the_log(ensemble, tmp_path):
    pa, _ = ensemble("nc4", ("f8", "f8"), n=2)
    (tmp_path / "again.nc").symlink_to(pa[1])
    paths = [pa[0], pa[1], str(tmp_path / "again.nc")]
    with EnsembleFiles(paths, _layout(paths), mode="r+", config=_cfg(UpdateMethod.AUTO)) as ef:
        assert ef.update_method is UpdateMethod.LOG


def test_a_byte_changed_in_the_commit_marker_is_caught(ensemble, monkeypatch):
    pa, _ = ensemble("cdf5", ("f8", "f4"), n=2)
    before = _files(pa)
    marker = _committed_then_killed(pa, monkeypatch)
    raw = bytearray(marker.read_bytes())
    at = raw.index(b'"written"') + 14  # inside the table of written ranges and their checksums
    raw[at] = ord("7") if raw[at] != ord("7") else ord("8")
    marker.write_bytes(bytes(raw))
    with pytest.raises(RecoveryError, match="fails its checksum") as ei:
        EnsembleFiles(pa, _layout(pa), mode="r")
    assert ei.value.path == str(marker)
    assert _files(pa) == before
