"""When a server rank judges its peers lost: only after reading what they sent, never after its own
loop stalled, and it beats while it waits for its analysis checkpoint (times are given, not slept)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from enkflow.online.bus import Bus, BusMessage, BusOp, BusSettings
from enkflow.online.checkpoint import Checkpointer
from enkflow.online.fields import Field

CRED = b"c" * 32


@dataclass
class Ranks:
    rank: int
    size: int


def _bus(sock: zmq.Socket | None, timeout_s: float = 10.0) -> Bus:
    return Bus(sock, "inproc://bus", Ranks(0, 2), CRED, lambda *a, **k: None, BusSettings("127.0.0.1", 1.0, timeout_s))


def test_a_rank_whose_own_loop_stalled_restarts_its_peers_clocks_instead_of_judging_them() -> None:
    bus = _bus(None)
    bus.rearm(100.0)
    assert bus.silent(105.0) == []
    assert bus.silent(160.0) == []  # this rank looked 55 s ago (a long step): no verdict, clocks restart
    assert bus.silent(169.0) == []
    assert bus.silent(171.0) == [1]  # looked at regularly, rank 1 silent since 160 s


def test_every_queued_report_is_read_before_silence_is_judged() -> None:
    ctx = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        router.bind("inproc://bus-silence")
        dealer.setsockopt(zmq.IDENTITY, b"rank-1")
        dealer.connect("inproc://bus-silence")
        for task in (1, 2, 3):
            dealer.send_multipart([CRED, *BusMessage(BusOp.PART_DONE, task).frames(1)])
        dealer.send_multipart([CRED, *BusMessage(BusOp.BEAT).frames(1)])
        assert router.poll(10_000)
        bus = _bus(router)
        assert [m.task for m in bus.pending()] == [1, 2, 3]
        assert not router.poll(0)
    finally:
        dealer.close(0)
        router.close(0)


def test_waiting_for_the_analysis_checkpoint_beats(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, 0, (Field("x", "float64", (4,)),))
    release = threading.Event()
    try:
        ck._jobs.submit(release.wait)  # a slow file system: the checkpoint waits until the waiter beats
        ck.analysis(1, [np.zeros((4, 2))])
        ck.wait_analysis(release.set)  # returns: the wait beat, which let the checkpoint through
        ck.flush()
        assert (tmp_path / "analysis_0001.rank_0000.h5").exists()
    finally:
        release.set()
        ck.close()
