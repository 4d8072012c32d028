"""The address a wildcard bind is advertised with: this node's interface address, no name lookup."""

from __future__ import annotations

import ipaddress

from enkflow.netaddr import advertised, interface_address, is_loopback, node_address, probe_host


def test_a_wildcard_endpoint_is_advertised_with_the_node_address_and_others_unchanged():
    node = node_address()
    ipaddress.ip_address(node)  # an address, never a name
    assert advertised("tcp://0.0.0.0:5555") == f"tcp://{node}:5555"
    assert advertised("tcp://*:5555") == f"tcp://{node}:5555"
    assert advertised("tcp://127.0.0.1:5555") == "tcp://127.0.0.1:5555"
    assert advertised("tcp://10.1.2.3:7") == "tcp://10.1.2.3:7"


def test_interfaces_loopback_and_the_port_probe_host():
    assert interface_address("lo") == "127.0.0.1"
    assert interface_address("no-such-interface") is None
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("lo")
    assert not is_loopback("*") and not is_loopback("0.0.0.0") and not is_loopback("eth0")
    assert probe_host("127.0.0.1") == "127.0.0.1" and probe_host("*") == "" and probe_host("eth0") == ""
