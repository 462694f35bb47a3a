"""The host's network: its interfaces' addresses (``ip -o addr show``) and the interface of its
default route (``/proc/net/route``), so a multi-host job can say which interface NCCL and gloo
use and where the rendezvous listens."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class NetAddress:
    iface: str
    address: str  # "10.0.0.5" or "fe80::1"
    prefix: int  # the network's prefix length (24 for /24)

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return ipaddress.ip_network(f"{self.address}/{self.prefix}", strict=False)

    def contains(self, address: str) -> bool:
        """Whether ``address`` lies in this interface's network (the host reaches it there)."""
        try:
            return ipaddress.ip_address(address) in self.network
        except ValueError:  # a name, not an address
            return False


_ADDR = re.compile(r"^\d+:\s+(\S+?)(?:@\S+)?\s+(inet6?)\s+([0-9A-Fa-f:.]+)/(\d+)\b")


def parse_ip_addr(text: str) -> tuple[NetAddress, ...]:
    """``ip -o addr show``: one line per address, ``4: eth0    inet 10.0.0.5/24 brd ...``.
    A missing ``ip`` (minimal containers) gives nothing: the rendezvous then falls back."""
    out = []
    for line in text.splitlines():
        m = _ADDR.match(line.strip())
        if m:
            out.append(NetAddress(iface=m.group(1), address=m.group(3), prefix=int(m.group(4))))
    return tuple(out)


def parse_default_route(text: str) -> str | None:
    """``/proc/net/route`` (every Linux has it, ``ip`` or not): the interface whose destination
    and mask are 0 (the default route) with the lowest metric."""
    best: tuple[int, str] | None = None
    for line in text.splitlines()[1:]:
        cells = line.split()
        if len(cells) >= 8 and cells[1] == "00000000" and cells[7] == "00000000":
            try:
                metric = int(cells[6])
            except ValueError:
                continue
            if best is None or metric < best[0]:
                best = (metric, cells[0])
    return best[1] if best else None
