"""The runner's side of the shared-memory segments: it maps only enkflow online segments of this node
with the header it expects, a slot the server retired is a stale task (not an error), a malformed SLOT
reply is refused; a cancelled (SIGTERM) server removes its segments on the way out."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from enkflow.experiment.config import load_experiment
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.experiment.directory import ExperimentDir
from enkflow.fsutil import write_json_atomic
from enkflow.online.launch import copy_initial, make_secrets
from enkflow.online.segments import SLOT_MAGIC, STORE_MAGIC, MappedSegments, Segment, SlotGone, available
from enkflow.online.shm_exchange import ShmExchange
from enkflow.online.wire import Header, Kind, ProtocolError, encode_index, encode_json
from enkflow.shm_names import shm_dir

pytestmark = pytest.mark.skipif(available() is not None, reason=f"no shared memory: {available()}")

NONCE = secrets.token_bytes(16)
BYTE = np.dtype(np.uint8)


@pytest.fixture
def slot():
    seg = Segment.create(SLOT_MAGIC, [64], NONCE, 7)
    yield seg
    seg.close()


def test_a_slot_with_the_servers_header_is_mapped_and_written(slot: Segment) -> None:
    maps = MappedSegments()
    view = maps.view(str(slot.path), slot.regions[0], np.dtype(np.float64), 8, writable=True, nonce=NONCE)
    view[...] = 2.5
    assert (slot.array(0, "float64", (8, 1)) == 2.5).all()
    maps.clear()


@pytest.mark.parametrize("case", ["other-nonce", "store-as-slot", "outside", "not-online", "symlink"])
def test_the_runner_maps_nothing_but_the_segments_it_expects(slot: Segment, tmp_path: Path, case: str) -> None:
    path, nonce, magic_of = str(slot.path), NONCE, True
    link = shm_dir() / f"enkflow-online-{os.getpid()}-{secrets.token_hex(4)}"
    if case == "other-nonce":
        nonce = secrets.token_bytes(16)
    elif case == "store-as-slot":
        magic_of = False  # a slot asked for as the (read-only) store: its magic is a slot's
    elif case == "outside":
        path = str(tmp_path / slot.path.name)
        Path(path).write_bytes(slot.path.read_bytes())
    elif case == "not-online":
        path = str(shm_dir() / f"enkflow-output-{os.getpid()}-{secrets.token_hex(4)}")
        Path(path).write_bytes(b"\0" * 8192)
    else:
        link.symlink_to(slot.path)
        path = str(link)
    try:
        with pytest.raises(ProtocolError) as err:
            MappedSegments().view(path, 4096, BYTE, 1, writable=magic_of, nonce=nonce)
        assert path in str(err.value)
    finally:
        link.unlink(missing_ok=True)
        if case == "not-online":
            Path(path).unlink()
    assert STORE_MAGIC != SLOT_MAGIC


def test_a_retired_slot_is_a_stale_task_not_an_error() -> None:
    seg = Segment.create(SLOT_MAGIC, [64], NONCE, 7)
    path = str(seg.path)
    seg.close()  # the server retired it: the runner's task went stale while it was stopped
    with pytest.raises(SlotGone, match="retired by the server"):
        MappedSegments().view(path, 4096, BYTE, 1, writable=True, nonce=NONCE)


def _slot_reply(where: object, count: int = 1) -> tuple[Header, list[zmq.Frame]]:
    idx = np.array([[0, 0, 8]], dtype=np.int64)[:count]
    return Header(Kind.SLOT, count=count), [zmq.Frame(encode_index(idx)), zmq.Frame(encode_json(where))]


@pytest.mark.parametrize("at", [[[4096.5, 4096]], [["4096", 4096]], [[4096]], [[-1, 4096]], [[True, 4096]], []])
def test_a_malformed_slot_reply_is_refused_naming_the_rank(slot: Segment, at: list) -> None:
    ex = ShmExchange()
    ex.reset([NONCE])
    hdr, frames = _slot_reply({"read": str(slot.path), "write": str(slot.path), "at": at})
    with pytest.raises(ProtocolError, match="server rank 0"):
        ex.answer(0, [(0, 0, 8)], hdr, frames)
    ex.close()


def test_the_slot_is_mapped_when_the_state_is_fetched(slot: Segment) -> None:
    """Mapped at GET_SLOT: a slot retired later (the runner stopped meanwhile) takes its late write
    harmlessly, and the server refuses the late PUT_SLOT as stale."""
    ex = ShmExchange()
    ex.reset([NONCE])
    at = slot.regions[0]
    hdr, frames = _slot_reply({"read": str(slot.path), "write": str(slot.path), "at": [[at, at]]})
    extents = ex.answer(0, [(0, 0, 8)], hdr, frames)
    slot.close()
    ex.write(extents, [np.ones(8)], [0])  # into memory nobody reads any more
    ex.close()


def test_a_cancelled_server_removes_its_segments(tmp_path: Path) -> None:
    cfg = load_experiment(prepare(tmp_path, DemoSettings(members=3, cycles=1, mode="online"), lambda m: None))
    xdir = ExperimentDir(cfg.expdir)
    xdir.online.path.mkdir(parents=True, exist_ok=True)
    write_json_atomic(xdir.config, cfg.to_json())
    make_secrets(xdir.online.path, curve=False)
    copy_initial(cfg)
    proc = subprocess.Popen([sys.executable, "-m", "enkflow.online.experiment", str(cfg.expdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not xdir.online.address.exists():  # the segments exist before the address is written
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        mine = list(shm_dir().glob(f"enkflow-online-{proc.pid}-*"))
        assert mine, "the server made no segment"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert not [p for p in mine if p.exists()]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
