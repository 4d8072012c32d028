"""Writers listening on TCP reach other nodes' senders, so they are CURVE servers: a process that was
not told the writer's public key (rank 0 tells only the senders) cannot even complete the handshake."""

from __future__ import annotations

from pathlib import Path

import zmq
from zmq.utils.monitor import recv_monitor_message

from enkflow.output import Output

_HANDSHAKE = {zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
              zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_AUTH}


def _handshake(endpoint: str) -> int:
    """The handshake's outcome for a plain (unauthenticated) DEALER connecting to ``endpoint``."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    monitor = sock.get_monitor_socket()
    try:
        sock.connect(endpoint)
        while True:
            assert monitor.poll(30_000), "no handshake event"
            event = recv_monitor_message(monitor)["event"]
            if event in _HANDSHAKE:
                return event
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)


def test_a_tcp_writer_refuses_a_sender_without_its_key(tmp_path: Path) -> None:
    cfg = {"directory": str(tmp_path / "out"), "dims": {"x": {"size": 4}},
           "fields": {"a": {"dims": ["x"], "dtype": "float64", "ensemble": False}}, "diagnostics": False, "transport": "tcp"}
    with Output(cfg) as out:
        endpoint = out._channels[0].sock.getsockopt_string(zmq.LAST_ENDPOINT)
        assert _handshake(endpoint) != zmq.EVENT_HANDSHAKE_SUCCEEDED
