"""The network facts multi-host jobs rest on: interfaces' addresses and the default route."""

from __future__ import annotations

from pathlib import Path

from provision.facts.network import NetAddress, parse_default_route, parse_ip_addr
from tests.cases import captured

NET = Path(__file__).resolve().parent.parent / "fixtures" / "net"


def test_ip_addr_on_the_build_machine() -> None:
    addrs = parse_ip_addr((NET / "ip-o-addr-show-build-machine.txt").read_text())
    assert addrs == (NetAddress("lo", "127.0.0.1", 8), NetAddress("lo", "::1", 128),
                     NetAddress("eth0", "192.0.2.2", 24), NetAddress("eth0", "fd00::2", 64),
                     NetAddress("eth0", "fe80::fc:ff:fe00:1", 64))
    assert addrs[0].contains("127.0.0.10") and not addrs[2].contains("127.0.0.10")
    assert addrs[2].contains("192.0.2.77") and not addrs[2].contains("my-host.example")


def test_default_route_from_proc_net_route() -> None:
    assert parse_default_route((NET / "proc-net-route-build-machine.txt").read_text()) == "eth0"
    assert parse_default_route("Iface\tDestination\tGateway\n") is None


def test_probes_reach_the_facts_and_a_host_without_ip_has_none() -> None:
    f = captured("cpu-only", {"net_addrs": (NET / "ip-o-addr-show-build-machine.txt").read_text(),
                              "net_route": (NET / "proc-net-route-build-machine.txt").read_text()})
    assert f.default_iface == "eth0" and [a.iface for a in f.addresses][:3] == ["lo", "lo", "eth0"]
    bare = captured("cpu-only", {"net_addrs": {"rc": 127, "out": "bash: ip: command not found"}})
    assert bare.addresses == ()
