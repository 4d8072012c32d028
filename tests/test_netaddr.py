"""The address a wildcard bind is advertised with: this node's interface address, no name lookup; the
route toward a known peer first, then the first running interface that is no loopback, link-local
address or virtual bridge."""

from __future__ import annotations

import ipaddress

from enkflow.netaddr import Interface, advertised, choose, interface_address, is_loopback, node_address, reaching_other_nodes, route_source


def test_a_wildcard_endpoint_is_advertised_with_the_node_address_and_others_unchanged():
    node = node_address()
    ipaddress.ip_address(node)  # an address, never a name
    assert advertised("tcp://0.0.0.0:5555") == f"tcp://{node}:5555"
    assert advertised("tcp://*:5555") == f"tcp://{node}:5555"
    assert advertised("tcp://127.0.0.1:5555") == "tcp://127.0.0.1:5555"
    assert advertised("tcp://10.1.2.3:7") == "tcp://10.1.2.3:7"


def test_interfaces_and_loopback():
    assert interface_address("lo") == "127.0.0.1"
    assert interface_address("no-such-interface") is None
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("lo")
    assert not is_loopback("*") and not is_loopback("0.0.0.0") and not is_loopback("eth0")


def test_the_choice_skips_bridges_link_local_and_interfaces_without_carrier():
    interfaces = [Interface("lo", "127.0.0.1", True), Interface("docker0", "172.17.0.1", True),
                  Interface("virbr0", "192.168.122.1", True), Interface("br-1f2e", "172.18.0.1", True),
                  Interface("eth0", "169.254.3.4", True), Interface("eth1", "10.0.0.5", False),
                  Interface("eth2", None, True), Interface("ib0", "10.1.0.7", True)]
    assert choose(interfaces) == "10.1.0.7"
    assert choose(interfaces[:-1]) is None


def test_the_route_toward_a_known_peer_gives_the_source_address():
    assert route_source("127.0.0.1") == "127.0.0.1"
    assert node_address(peer="127.0.0.1") == node_address()  # a peer on this node says nothing of the others
    assert advertised("tcp://*:5555", peer="127.0.0.1") == f"tcp://{node_address()}:5555"


def test_the_output_service_binds_the_servers_interface_or_every_one_for_a_loopback_default():
    assert reaching_other_nodes("127.0.0.1") == "0.0.0.0" and reaching_other_nodes("ib0") == "ib0"
    assert reaching_other_nodes("*") == "*"
