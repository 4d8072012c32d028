"""The runner's request/reply connection: which replies count (stale ERRORs, a restarted server)."""

from __future__ import annotations

import time

import pytest
import zmq

from enkflow.online.connection import Connection, ServerError, ServerLost
from enkflow.online.wire import Header, Kind, credential, encode_json

CRED = credential("t")


@pytest.fixture()
def pair():
    ctx = zmq.Context.instance()
    server = ctx.socket(zmq.ROUTER)
    server.setsockopt(zmq.LINGER, 0)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    conn = Connection(ctx, f"tcp://127.0.0.1:{port}")
    conn.send([Header(Kind.READY, CRED, 7).pack()])
    identity = server.recv_multipart()[0]
    conn.server = server  # the far end, for a test that closes it
    yield conn, lambda hdr, *frames: server.send_multipart([identity, hdr.pack(), *frames])
    conn.close()
    server.close()


def test_an_error_about_an_earlier_task_is_stale_and_skipped(pair) -> None:
    conn, reply = pair
    reply(Header(Kind.ERROR, CRED, 7, task=1, epoch=5), encode_json({"error": "old refusal"}))
    reply(Header(Kind.ACK, CRED, 7, task=2, epoch=5))
    hdr, _ = conn.recv(5.0, lambda h: h.kind is Kind.ACK and h.task == 2, epoch=5, task=2)
    assert hdr.task == 2
    reply(Header(Kind.ERROR, CRED, 7, task=2, epoch=5), encode_json({"error": "this task's refusal"}))
    with pytest.raises(ServerError, match="this task's refusal"):
        conn.recv(5.0, lambda h: h.kind is Kind.ACK and h.task == 2, epoch=5, task=2)


def test_a_reply_from_another_server_incarnation_means_greet_again(pair) -> None:
    conn, reply = pair
    reply(Header(Kind.ERROR, CRED, 7, task=2, epoch=9), encode_json({"error": "stale PUT"}))
    with pytest.raises(ServerLost, match="restarted"):
        conn.recv(5.0, lambda h: h.kind is Kind.ACK, epoch=5, task=2)


def test_a_reply_queued_before_the_server_went_is_read_before_the_loss(pair) -> None:
    """The ERROR that stopped a study, sent just before the server closed: read first, then the loss."""
    conn, reply = pair
    reply(Header(Kind.ERROR, CRED, 7, task=2, epoch=5), encode_json({"error": "member 2: element 0 is nan"}))
    conn.server.close(linger=1000)
    deadline = time.monotonic() + 10
    while not conn.lost and time.monotonic() < deadline:
        time.sleep(0.01)
    assert conn.lost
    with pytest.raises(ServerError, match="element 0 is nan"):
        conn.recv(5.0, lambda h: h.kind is Kind.ACK, epoch=5, task=2)
    with pytest.raises(ServerLost, match="went away"):
        conn.recv(5.0, lambda h: h.kind is Kind.ACK, epoch=5, task=2)
