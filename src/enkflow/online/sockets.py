"""The server's ZeroMQ sockets: binding, the ERROR reply, the incarnation (the address runners are told:
:func:`enkflow.netaddr.advertised`).

Every server socket is a ROUTER: a reply names the peer by its identity frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from enkflow.errors import BindError
from enkflow.online.wire import Header, Kind, encode_json


@dataclass(frozen=True)
class Incarnation:
    """What messages to this server carry: ``cred`` the token's credential, ``epoch`` this incarnation
    of the server (a restarted one has another; replies carry it, and a runner's data messages the
    one it was welcomed with)."""

    cred: bytes
    epoch: int


def bind(ctx: zmq.Context, kind: int, host: str, *, port: int = 0, max_message: int = -1,
         curve_secret_key: str | None = None) -> zmq.Socket:
    """A socket of ``kind`` bound to ``host`` (``port`` 0: any free port); ``max_message`` in bytes
    (-1: no limit); ``curve_secret_key`` (Z85) makes it a CURVE server. Raises
    :class:`~enkflow.errors.BindError` naming the address when it cannot listen there."""
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.MAXMSGSIZE, max_message)
    s.setsockopt(zmq.ROUTER_MANDATORY, 0)
    if curve_secret_key:
        s.curve_server = True
        s.curve_secretkey = curve_secret_key.encode()
    address = f"tcp://{host}:{port or '*'}"
    try:
        if port:
            s.bind(address)
        else:
            s.bind_to_random_port(f"tcp://{host}")
    except zmq.ZMQError as exc:
        s.close(0)
        raise BindError.from_errno(exc.errno, exc.strerror, address=address, key="[online] bind and port") from None
    return s


def send_error(sock: zmq.Socket, identity: bytes, hdr: Header | None, message: str, me: Incarnation) -> None:
    """ERROR with ``message`` to the peer ``identity``, about the message ``hdr`` (None: unreadable)."""
    h = (hdr or Header(Kind.ERROR)).reply(Kind.ERROR, epoch=me.epoch)
    sock.send_multipart([identity, h.pack(), encode_json({"error": message})])
