"""The address other nodes reach a socket by: an IPv4 address of this node's own interface.

A socket bound on every interface (``tcp://*:PORT``) is advertised with an address of this node,
not with the node's name: a name may not resolve on the other nodes (emulated nodes, and some
clusters, have no ``/etc/hosts`` entries for each other). The address is chosen so:

1. an explicit setting wins: a bind on an address or an interface name (``[online] bind``) is
   advertised as bound, never through this choice;
2. when a peer the process must be reached by is known (``peer``), the source address of this
   node's route toward it (a UDP socket connected to it: no packet is sent);
3. otherwise the first interface, in index order, that is up and running (has a carrier) and is
   neither loopback, nor link-local (169.254/16), nor a virtual bridge or container link
   (:data:`VIRTUAL`): a ``docker0`` at 172.17.0.1 exists on every node and names none;
4. loopback when there is none (a machine without a network).

Linux only (the interface ioctls); elsewhere, loopback.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

_SIOCGIFFLAGS, _SIOCGIFADDR, _IFF_UP, _IFF_RUNNING = 0x8913, 0x8915, 0x1, 0x40
WILDCARDS = frozenset({"*", "0.0.0.0"})  # "every interface" in [online] bind (ZeroMQ and socket spellings)
# Interfaces whose address every node may have, or that only reach this node's containers or VMs.
VIRTUAL = ("docker", "virbr", "veth", "br-", "cni", "flannel", "cali", "vxlan", "tun", "tap", "lxc", "lxd", "podman",
           "kube", "weave", "zt")


@dataclass(frozen=True)
class Interface:
    """A network interface: its ``name``, IPv4 ``address`` (None: none), whether it is up and running."""

    name: str
    address: str | None
    running: bool

    @classmethod
    def read(cls, name: str) -> Interface:
        request = struct.pack("256s", name.encode()[:15])
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                flags = struct.unpack("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request)[16:18])[0]
                running = flags & (_IFF_UP | _IFF_RUNNING) == _IFF_UP | _IFF_RUNNING
                return cls(name, socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, request)[20:24]), running)
            except OSError:
                return cls(name, None, False)

    def reaches_other_nodes(self) -> bool:
        if self.address is None or not self.running or self.name.startswith(VIRTUAL):
            return False
        addr = ipaddress.ip_address(self.address)
        return not (addr.is_loopback or addr.is_link_local)


def interface_address(name: str) -> str | None:
    """The IPv4 address of network interface ``name`` (None: it has none, is not running, or does not exist)."""
    iface = Interface.read(name)
    return iface.address if iface.running else None


def choose(interfaces: Iterable[Interface]) -> str | None:
    """The address of the first of ``interfaces`` that can reach other nodes (rule 3 above)."""
    return next((i.address for i in interfaces if i.reaches_other_nodes()), None)


def route_source(peer: str) -> str | None:
    """This node's source address toward ``peer`` (an IPv4 address or name), None without a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((peer, 9))  # a UDP connect only picks the route
            return str(s.getsockname()[0])
        except OSError:
            return None


def node_address(peer: str | None = None) -> str:
    """This node's address as others reach it (rules 2-4 above; ``peer``: one that must reach it)."""
    if peer is not None and not is_loopback(peer):
        source = route_source(peer)
        if source is not None and not ipaddress.ip_address(source).is_loopback:
            return source
    return choose(Interface.read(name) for _, name in socket.if_nameindex()) or "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, an interface name or a wildcard) is reachable from this node only."""
    if host in ("localhost", "lo"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def advertised(endpoint: str, peer: str | None = None) -> str:
    """``endpoint`` (``tcp://HOST:PORT``, as bound) as other nodes reach it: a wildcard bind gets this
    node's address (:func:`node_address`, toward ``peer`` when known)."""
    host, _, port = endpoint.rpartition(":")
    if host.removeprefix("tcp://") in WILDCARDS or host == "tcp://[::]":
        return f"tcp://{node_address(peer)}:{port}"
    return endpoint


def reaching_other_nodes(bind: str) -> str:
    """``bind`` (an ``[online] bind``) for a socket that processes on other nodes connect to: as set
    unless it is loopback (the default, for a study on one node), then every interface."""
    return "0.0.0.0" if is_loopback(bind) else bind

