"""The address other nodes reach a socket by: an IPv4 address of this node's own interface.

A socket bound on every interface (``tcp://*:PORT``) is advertised with an address of the node's
first non-loopback interface that is up, not with the node's name: a name may not resolve on the
other nodes (emulated nodes, and some clusters, have no ``/etc/hosts`` entries for each other).
Linux only (the interface ioctls); elsewhere, and on a machine without a network, loopback.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

_SIOCGIFFLAGS, _SIOCGIFADDR, _IFF_UP = 0x8913, 0x8915, 0x1
WILDCARDS = frozenset({"*", "0.0.0.0"})  # "every interface" in [online] bind (ZeroMQ and socket spellings)


def interface_address(name: str) -> str | None:
    """The IPv4 address of network interface ``name`` (None: it has none, is down, or does not exist)."""
    request = struct.pack("256s", name.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            flags = struct.unpack("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request)[16:18])[0]
            if not flags & _IFF_UP:
                return None
            return socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, request)[20:24])
        except OSError:
            return None


def node_address() -> str:
    """An IPv4 address of this node's first non-loopback interface that is up (loopback when none is)."""
    for _, name in socket.if_nameindex():
        addr = interface_address(name)
        if addr is not None and not ipaddress.ip_address(addr).is_loopback:
            return addr
    return "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, an interface name or a wildcard) is reachable from this node only."""
    if host in ("localhost", "lo"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def advertised(endpoint: str) -> str:
    """``endpoint`` (``tcp://HOST:PORT``, as bound) as other nodes reach it: a wildcard bind gets this
    node's address (:func:`node_address`)."""
    host, _, port = endpoint.rpartition(":")
    if host.removeprefix("tcp://") in WILDCARDS or host == "tcp://[::]":
        return f"tcp://{node_address()}:{port}"
    return endpoint


def probe_host(bind: str) -> str:
    """The host to try a port on before ZeroMQ binds ``bind`` there (an address as itself; an
    interface name or a wildcard: every interface, "")."""
    try:
        return str(ipaddress.ip_address(bind))
    except ValueError:
        return ""
