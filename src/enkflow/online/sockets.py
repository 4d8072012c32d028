"""The server's ZeroMQ sockets: binding, the ERROR reply, the incarnation (the address runners are told:
:func:`enkflow.netaddr.advertised`).

Every server socket is a ROUTER: a reply names the peer by its identity frame.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import zmq

from enkflow.errors import BindError, ConfigError
from enkflow.netaddr import WILDCARDS, is_loopback, node_address
from enkflow.online.wire import Header, Kind, encode_json
from enkflow.parallel import Comm


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


def bus_host(bind_setting: str, nodes: list[str]) -> str:
    """Where rank 0's bus listens, given ``[online] bind`` and the node of every rank: loopback when
    they all run on one node, else an address of rank 0's node that the others reach. Raises
    :class:`~enkflow.errors.ConfigError` (on every rank alike) for a ``bind`` that cannot serve ranks
    on several nodes: loopback, or one node's own address, which the other nodes' ranks cannot bind."""
    several = sorted(set(nodes))
    if len(several) == 1:
        return "127.0.0.1"
    if is_loopback(bind_setting):
        raise ConfigError(f"the server's ranks run on nodes {several} but listen on loopback ({bind_setting}), which "
                          'runners on other nodes cannot reach: set [online] bind = "*" (every interface) or the name '
                          "of the interface the nodes share", key="online.bind")
    if bind_setting in WILDCARDS:
        return node_address()
    try:
        ipaddress.ip_address(bind_setting)
    except ValueError:  # an interface name: each node binds its own interface of that name
        return bind_setting
    raise ConfigError(f"the server's ranks run on nodes {several} and every rank listens on [online] bind = "
                      f"{bind_setting!r}, one node's address, which the ranks on the other nodes cannot listen on: set "
                      'bind = "*" (every interface) or the name of the interface the nodes share', key="online.bind")


def bind_collective(ctx: zmq.Context, comm: Comm, nodes: list[str], host: str, *,
                    curve_secret_key: str | None = None) -> zmq.Socket:
    """Collective: every rank's ROUTER bound to ``host`` (:func:`bind`); ``nodes``: every rank's node.
    A rank that cannot listen makes every rank raise the same :class:`~enkflow.errors.BindError`,
    naming each failing rank, its node and why, instead of leaving the others waiting for it."""
    try:
        sock: zmq.Socket | None = bind(ctx, zmq.ROUTER, host, curve_secret_key=curve_secret_key)
        error = None
    except BindError as exc:
        sock, error = None, f"server rank {comm.rank} on node {nodes[comm.rank]}: {exc.reason}"
    errors = [e for e in comm.allgather_obj(error) if e is not None]
    if not errors:
        assert sock is not None  # bound, as no rank reported an error
        return sock
    if sock is not None:
        sock.close(0)
    raise BindError("; ".join(errors), address=f"tcp://{host}:*",
                    remedy="set [online] bind to an interface every server node has (\"*\": every interface)")


def send_error(sock: zmq.Socket, identity: bytes, hdr: Header | None, message: str, me: Incarnation) -> None:
    """ERROR with ``message`` to the peer ``identity``, about the message ``hdr`` (None: unreadable)."""
    h = (hdr or Header(Kind.ERROR)).reply(Kind.ERROR, epoch=me.epoch)
    sock.send_multipart([identity, h.pack(), encode_json({"error": message})])
