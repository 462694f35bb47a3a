"""Which NVIDIA driver a host gets and from where, or why none: the release's archive (the table
``provision/tables/driver.yaml``) x the GPUs' generations x Secure Boot. Pure: facts in, a
``Pick`` out, or ``NoDriver`` with the reason and what to do."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from ..errors import ProvisionError
from ..facts.host import HostFacts

TABLE = "provision/tables/driver.yaml"
# Enterprise Linux and its rebuilds by os-release ID. Others of the yum family that call
# themselves "like rhel" (Amazon Linux 2, Alibaba Cloud Linux, openEuler, TencentOS) number
# their releases otherwise and are served by neither ELRepo nor NVIDIA's rhelN repositories.
EL_IDS = ("rhel", "centos", "rocky", "almalinux", "ol")
SOURCES = {"ubuntu": "Ubuntu's archive", "debian": "Debian's archive", "elrepo": "ELRepo",
           "cuda-modules": "NVIDIA's CUDA repository", "cuda-versionlock": "NVIDIA's CUDA repository"}
# Before R560 the proprietary modules are NVIDIA's default, from it the open ones (driver
# installation guide, "Kernel Modules": "Starting in the 560 driver release series, the open
# kernel module flavor is the default and suggested installation").
OPEN_DEFAULT_FROM = 560
# The open modules' first branch, production-ready from it for data-center GPUs of Turing and
# later; GeForce and workstation GPUs ran them only as "alpha quality" behind the module
# parameter NVreg_OpenRmEnableUnsupportedGpus=1 until R560 ("NVIDIA Releases Open-Source GPU
# Kernel Modules", NVIDIA technical blog, 2022; open-gpu-kernel-modules README of those
# branches). Grace Hopper runs only the open modules ("NVIDIA Transitions Fully Towards
# Open-Source GPU Kernel Modules", 2024): Hopper on an Arm host is open on every branch.
OPEN_FIRST = 515
# the product names of GeForce and workstation GPUs (nvidia-smi's and pci.ids' alike:
# "NVIDIA GeForce RTX 3090", "GA102GL [RTX A6000]", "Quadro RTX 8000", "TITAN RTX")
_DESKTOP = re.compile(r"GeForce|TITAN|Quadro|\bRTX\b", re.IGNORECASE)
# Data-center products by name, an allow list (workstation cards such as T1000, T600 or T400
# and mining cards name no series that tells them apart): the open modules' first supported
# list (R515: T4, T4G, A2, A10, A10G, A16, A30, A40, A100) and the data-center GPUs after it
# (A800, H100, H800, H20, H200, GH200, L4, L20, L40, L40S); nvidia-smi's "NVIDIA A100-SXM4-80GB"
# and pci.ids' "GA100 [A100 SXM4 80GB]" alike
_DATA_CENTER = re.compile(r"\b(Tesla|T4G?|A2|A10G?|A16|A30|A40|A100|A800|H100|H800|H20|H200|"
                          r"GH200|L4|L20|L40S?)\b")
# GH100's PCI device ids (H100 2330.., H800 2324, H200 2335, GH200 2342: pci-ids.ucw.cz): a
# Grace Hopper whose pci.ids is older than it shows only "Device [10de:2342]"
_GH100_IDS = range(0x2300, 0x2400)


class NoDriver(ProvisionError):
    """No driver this tool can install drives these GPUs here: the reason and what to do."""


@dataclass(frozen=True)
class Generation:
    name: str
    below: tuple[int, int] | None  # compute capabilities under this one belong to it
    last: int | None  # the last branch that drives it
    first: int  # the first branch that drives it
    open: bool  # runs the open kernel modules
    open_only: bool  # runs nothing else
    pci_from: int  # its first PCI device id: what places a GPU the data does not name


@dataclass(frozen=True)
class Pick:
    """The driver to install: the branch, its module flavour and where it comes from."""

    release: str  # the table's row: "ubuntu-22.04"
    route: str  # ubuntu | debian | elrepo | cuda-modules | cuda-versionlock
    branch: int
    open: bool
    version: str  # the branch's first release: what the wheel rule may count on before it runs
    why: str  # the reason shown in the plan
    signed_only: bool = False  # Secure Boot: only modules signed with a key the kernel trusts

    @property
    def source(self) -> str:
        return SOURCES[self.route]


@cache
def table() -> dict[str, Any]:
    text = resources.files("provision.tables").joinpath("driver.yaml").read_text()
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


@cache
def generations() -> tuple[Generation, ...]:
    return tuple(Generation(str(g["name"]), _cc(g["below"]) if "below" in g else None,
                            g.get("last"), int(g.get("first", 0)), bool(g["open"]),
                            bool(g.get("open_only", False)), int(g["pci_from"]))
                 for g in table()["generations"])


def generation_of_pci_id(device_id: str) -> Generation:
    """The generation of a GPU the data does not name, by its PCI device id's range."""
    n = int(device_id, 16)
    return [g for g in generations() if g.pci_from <= n][-1]


def generation(cc: tuple[int, int]) -> Generation:
    return next(g for g in generations() if g.below is None or cc < g.below)


def release_key(facts: HostFacts) -> str | None:
    """The table's row for this OS, None when there is none to look for."""
    osr = facts.os
    if osr.id == "ubuntu":
        return f"ubuntu-{osr.version_id}"
    if osr.id == "debian" and osr.major:
        return f"debian-{osr.major}"
    if osr.id in EL_IDS and osr.major:
        return f"el-{osr.major}"
    return None


def choose(caps: list[tuple[int, int]], facts: HostFacts) -> Pick:
    """The driver for these GPUs on this host, or NoDriver with the reason and what to do."""
    key = release_key(facts)
    rows: dict[str, Any] = table()["releases"]
    if key is None or key not in rows:
        raise NoDriver(f"{TABLE} has no driver route for {facts.os.label} (it has "
                       f"{', '.join(rows)}): install the NVIDIA driver by hand, then run "
                       "bootstrap again")
    row: dict[str, Any] = rows[key]
    route = str(row["route"])
    source = SOURCES[route]
    _refuse_host(facts, route, key)
    gens = [generation(c) for c in caps]
    by_id = ""
    if not gens:  # the model is newer than the data: its PCI id says which generation it is
        ids = sorted({g.device_id for g in facts.pci_gpus if g.device_id})
        if facts.pci_gpus and not ids:
            raise NoDriver("the GPU's model is unknown to the data and lspci gives no PCI id to "
                           "place it by: which kernel modules drive it cannot be told; install "
                           "the NVIDIA driver by hand, then run bootstrap again")
        gens = [generation_of_pci_id(i) for i in ids]
        by_id = f" (by PCI id {', '.join(f'10de:{i}' for i in ids)}: the data does not name it)"
    names = " and ".join(sorted({g.name for g in gens}))
    if any(g.open_only for g in gens) and not all(g.open for g in gens):
        raise NoDriver(f"{names} GPUs in one host: Blackwell runs only the open kernel modules, "
                       "which the older GPUs cannot run; no one driver serves them all")
    branches = sorted(int(b) for b in row["branches"])
    last = min((g.last for g in gens if g.last), default=None)
    first = max((g.first for g in gens), default=0)
    fits = [b for b in branches if b >= first and (last is None or b <= last)]
    if not fits:
        need = " and ".join(p for p in (f">= {first}" if first else "",
                                          f"<= {last}" if last else "") if p)
        raise NoDriver(f"{source} for {key} has driver branches {', '.join(map(str, branches))}, "
                       f"and {names}{by_id} needs a branch {need}: {row['otherwise']}")
    prefer = int(table()["prefer"])
    branch = prefer if prefer in fits else max((b for b in fits if b < prefer), default=min(fits))
    # a release whose archive's open module package does not install beside its driver (the
    # table says why) runs the open modules only where the GPUs run nothing else
    early = bool(row.get("open_before_560", True))
    grace = _grace_hopper(facts, caps)
    if grace and branch < OPEN_DEFAULT_FROM and not early:
        raise NoDriver(f"Grace Hopper runs only the open kernel modules, and {source} for {key} "
                       f"cannot install them: {row.get('open_before_560_why', '')}; "
                       f"{row['otherwise']}")
    open_ = bool(gens) and all(g.open for g in gens) and route != "elrepo" and (
        branch >= OPEN_DEFAULT_FROM or any(g.open_only for g in gens)
        or (branch >= OPEN_FIRST and early and (_data_center(facts) or grace)))
    flavour = "open" if open_ else "proprietary"
    note = ""
    if open_ and branch < OPEN_DEFAULT_FROM and not any(g.open_only for g in gens):
        note = (", the only ones Grace Hopper runs" if grace else
                f", production for data-center GPUs from R{OPEN_FIRST}")
    elif not open_ and bool(gens) and all(g.open for g in gens) and route != "elrepo":
        gpu_names = _gpu_names(facts)
        if any(_DESKTOP.search(n) for n in gpu_names):
            note = (f": before R{OPEN_DEFAULT_FROM} the open ones run GeForce and workstation "
                    "GPUs only as a preview")
        elif any("Device" in n or not n for n in gpu_names) or not gpu_names:
            note = (f": before R{OPEN_DEFAULT_FROM} the open ones are for data-center GPUs, and "
                    "the GPU's product is not named")
        else:
            note = (f": before R{OPEN_DEFAULT_FROM} the open ones are for data-center GPUs (T4, "
                    "A10, A100, H100, L40S, ...), which this one is not")
        if not early and _data_center(facts):
            note = f": {row.get('open_before_560_why', '')}"
    who = f"{names}{by_id}: " if gens else "the GPU's model is unknown to the data: "
    why = (f"{who}branch {branch} with the {flavour} kernel modules{note} ({source} for {key} "
           f"has {', '.join(map(str, branches))})")
    signed = route == "ubuntu" and bool(facts.secure_boot)
    if signed:
        why += ("; Secure Boot is on: only Canonical's signed prebuilt modules load, and the "
                "step stops before installing where the archive has none for this kernel")
    return Pick(key, route, branch, open_, first_release(branch), why, signed)


def _gpu_names(facts: HostFacts) -> list[str]:
    return [g.name for g in facts.gpus] or [g.name for g in facts.pci_gpus]


def _data_center(facts: HostFacts) -> bool:
    """Every GPU is a data-center product by its name (a name pci.ids does not know, "Device
    [10de:2b85]", is not taken for one)."""
    names = _gpu_names(facts)
    return bool(names) and all(_DATA_CENTER.search(n) and not _DESKTOP.search(n) for n in names)


def _grace_hopper(facts: HostFacts, caps: list[tuple[int, int]]) -> bool:
    """Hopper on an Arm host: by compute capability, or by GH100's PCI ids where the GPU is not
    named."""
    if facts.arch != "aarch64":
        return False
    if caps:
        return all(c[0] == 9 for c in caps)
    ids = [g.device_id for g in facts.pci_gpus if g.device_id]
    return bool(ids) and all(int(i, 16) in _GH100_IDS for i in ids)


def _refuse_host(facts: HostFacts, route: str, key: str) -> None:
    """Hosts a route cannot serve, whatever the GPU."""
    if route == "elrepo" and facts.arch not in ("", "x86_64"):
        raise NoDriver(f"ELRepo's el7 NVIDIA kmods are built for x86_64 only (nvidia-kmod.spec: "
                       f"ExclusiveArch x86_64), not {facts.arch}: install the driver by hand")
    if route == "elrepo" and "uek" in facts.kernel:
        raise NoDriver(f"the running kernel {facts.kernel} is Oracle's UEK; ELRepo's kmod-nvidia "
                       "is built for the Red Hat compatible kernel (3.10.0-1160.el7) and links "
                       "only into kernels of its ABI: boot the Red Hat compatible kernel "
                       "(grubby --set-default /boot/vmlinuz-3.10.0-*, then reboot) and run "
                       "bootstrap again")
    if facts.secure_boot and route != "ubuntu":
        # DKMS builds (Debian, NVIDIA's repository) are signed with a key made on the host and
        # ELRepo's kmods with ELRepo's: either loads only once its key is enrolled at the
        # console, which a rented host rarely offers ("Key was rejected by service")
        key_file = ("/etc/pki/elrepo/SECURE-BOOT-KEY-elrepo.org.der" if route == "elrepo"
                    else "/var/lib/dkms/mok.pub")
        raise NoDriver(
            f"Secure Boot is enabled, and the driver module from {SOURCES[route]} for {key} is "
            "not signed with a key this kernel trusts: it would not load (\"Key was rejected by "
            "service\") and no reboot changes that. Turn Secure Boot off (on Azure Trusted "
            "Launch or a GCP Shielded VM: the VM's security settings) and run bootstrap again; "
            "or install the driver yourself and enrol its signing key (mokutil --import "
            f"{key_file}, confirmed at the console on the next boot)")


def first_release(branch: int) -> str:
    """The branch's first release (the table's first_release)."""
    return str(table()["first_release"][branch])
