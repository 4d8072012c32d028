"""A server rank's slot pool makes a spare slot in steps while none is free (enkflow.online.slots)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from enkflow.online import segments
from enkflow.online.fields import Field
from enkflow.online.segments import SLOT_MAGIC, SegmentHeader
from enkflow.online.slots import SlotPool
from enkflow.shm_names import shm_dir

NONCE = bytes(range(16))


def _pool() -> SlotPool:
    fields = (Field("x", "float64", (3000,)), Field("n", "int32", (10,), assimilated=False))
    return SlotPool(fields, [(0, 3000), (0, 10)], NONCE, 7)


def _ours() -> list[Path]:
    return sorted(shm_dir().glob(f"enkflow-online-{os.getpid()}-*"))


@pytest.fixture
def pool():
    before = _ours()
    p = _pool()
    yield p
    p.close()
    assert _ours() == before, "the pool left segments behind"


def test_a_spare_is_made_in_steps_then_bound(pool: SlotPool) -> None:
    before = set(_ours())
    steps = 0
    while pool.wants_spare:
        pool.prepare(4096)
        steps += 1
    assert steps == 8  # a 4096-byte header page, then 24000 and 40 bytes, each region 4096-aligned
    (path,) = set(_ours()) - before
    header = SegmentHeader.unpack(path.read_bytes())
    assert (header.magic, header.nonce, header.epoch) == (SLOT_MAGIC, NONCE, 7)
    slot = pool.bind(11, 5)
    assert (slot.segment.path, slot.member) == (path, 5)
    assert pool.wants_spare  # the spare is bound: none is free
    slot.views[0][:] = 1.5
    on_file = np.frombuffer(path.read_bytes(), dtype=np.float64, count=3000, offset=slot.segment.regions[0])
    assert (on_file == 1.5).all()


def test_a_bind_finishes_the_spare_under_way(pool: SlotPool) -> None:
    before = set(_ours())
    pool.prepare(4096)
    (path,) = set(_ours()) - before
    assert pool.wants_spare  # under way, not free yet
    slot = pool.bind(3, 2)
    assert slot.segment.path == path
    assert path.stat().st_size == 32768
    pool.prepare(4096)  # the next spare, left under way: close removes it


def test_a_spare_that_cannot_be_made_ends_spares(pool: SlotPool, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    before = set(_ours())
    monkeypatch.setattr(segments.os, "posix_fallocate", full)
    pool.prepare(4096)
    assert not pool.wants_spare
    assert set(_ours()) == before
    with pytest.raises(OSError, match="No space"):
        pool.bind(1, 1)
    assert set(_ours()) == before
