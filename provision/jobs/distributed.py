"""One job over several hosts: torchrun on each, the rendezvous on the first, and the network
interface NCCL and gloo use on each, decided from the facts. Pure: tested on captured facts."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ProvisionError
from ..facts.host import HostFacts
from . import DEFAULT_PORT


@dataclass(frozen=True)
class Node:
    """One host of the job as the laptop reaches it, and what its facts say."""

    name: str  # the inventory name or user@host:port
    address: str  # the address the laptop connects to
    facts: HostFacts


@dataclass(frozen=True)
class Rendezvous:
    addr: str
    port: int
    reason: str
    ifnames: tuple[str | None, ...]  # per node, rank order: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME

    def env(self, rank: int) -> dict[str, str]:
        """What node ``rank``'s job gets: the interface its collectives use."""
        name = self.ifnames[rank]
        return {"NCCL_SOCKET_IFNAME": name, "GLOO_SOCKET_IFNAME": name} if name else {}


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def _iface_for(facts: HostFacts, addr: str) -> str | None:
    """The interface whose network holds ``addr`` (the most specific one), else the default
    route's."""
    nets = sorted((a for a in facts.addresses if a.contains(addr)), key=lambda a: -a.prefix)
    return nets[0].iface if nets else facts.default_iface


def rendezvous(nodes: Sequence[Node], port: int = DEFAULT_PORT,
               addr: str | None = None) -> Rendezvous:
    """Where rank 0 listens and which interface each node uses.

    The first node's address as the laptop knows it, when it lies on one of that node's
    interfaces' networks (a server on a LAN, or hosts on one machine); else the IPv4 address of
    its default route's interface (a rental reached through NAT or a forwarded port, whose
    private address the other hosts share). ``addr`` overrides both (--master-addr).
    """
    first = nodes[0]
    if addr:
        reason = "--master-addr"
    elif _is_ip(first.address) and any(a.contains(first.address) for a in first.facts.addresses):
        addr = first.address
        reason = f"{first.name}'s address lies on its interface {_iface_for(first.facts, addr)}"
    else:
        iface = first.facts.default_iface
        mine = [a for a in first.facts.addresses if a.iface == iface and ":" not in a.address]
        if not mine:
            raise ProvisionError(
                f"{first.name}: no address for the rendezvous: {first.address} is not on any of "
                "its interfaces, and its facts show no IPv4 address on a default route (no `ip` "
                "on the host?); give one the other hosts reach with --master-addr")
        addr = mine[0].address
        reason = (f"{first.name}'s address on its default route's interface {iface} "
                  f"({first.address} is not on any of its interfaces: NAT or a forwarded port)")
    return Rendezvous(addr=addr, port=port, reason=reason,
                      ifnames=tuple(_iface_for(n.facts, addr) for n in nodes))


PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)?)?$")


def torchrun_argv(command: Sequence[str], *, nnodes: int, node_rank: int, nproc_per_node: int,
                  master_addr: str, master_port: int) -> tuple[str, ...]:
    """torchrun on one node. ``command`` is what each process runs: a script and its arguments
    (``train.py --lr 1e-3``, a leading ``python`` is dropped), ``-m module ...``, or another
    program (``--no-python``). Its arguments pass through as argv, untouched."""
    cmd = list(command)
    if cmd and PYTHON.match(cmd[0]) and len(cmd) > 1:
        cmd = cmd[1:]
    if not cmd or cmd[0] == "torchrun" or cmd[0].endswith("/torchrun"):
        raise ProvisionError("with --hosts give what each process runs (train.py --lr 1e-3); "
                             "run adds torchrun and its --nnodes/--node-rank/--nproc-per-node")
    head = ["torchrun", f"--nnodes={nnodes}", f"--node-rank={node_rank}",
            f"--nproc-per-node={nproc_per_node}", f"--master-addr={master_addr}",
            f"--master-port={master_port}"]
    if cmd[0] != "-m" and not cmd[0].endswith(".py"):
        head.append("--no-python")
    return (*head, *cmd)


def nproc_for(facts: HostFacts, gpus: Sequence[int] | None, asked: int | None) -> int:
    """Processes per node: as asked, else one per GPU the job uses, else one (a CPU host)."""
    if asked:
        return asked
    if gpus is not None:
        return len(gpus) or 1
    return len(facts.gpus) or 1
