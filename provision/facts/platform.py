"""VM, container or bare metal, and which rental platform, from the raw markers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

_VM_VENDORS = ("qemu", "kvm", "vmware", "virtualbox", "xen", "microsoft corporation", "google",
               "amazon ec2", "openstack", "alibaba cloud", "tencent cloud", "bochs", "hetzner",
               "digitalocean", "oracle", "nutanix", "cloud hypervisor")
_CONTAINER_VIRT = ("docker", "podman", "lxc", "lxc-libvirt", "systemd-nspawn", "rkt", "wsl",
                   "container-other", "openvz")


@dataclass(frozen=True)
class Virtualization:
    kind: str  # "vm" | "container" | "bare"
    what: str | None  # "kvm", "docker", ...
    evidence: str


def detect_virtualization(systemd_detect_virt: str | None, dmi: str, container_markers: str,
                          hypervisor_flag: bool) -> Virtualization:
    """Containers first (a container on a VM is a container for us: its driver is not ours)."""
    sdv = (systemd_detect_virt or "").strip().splitlines()
    virt = sdv[0].strip() if sdv else ""
    markers = container_markers.strip()
    if virt in _CONTAINER_VIRT:
        return Virtualization("container", virt, f"systemd-detect-virt: {virt}")
    if markers:
        first = markers.splitlines()[0].strip()
        what = "docker" if "docker" in markers else "podman" if "containerenv" in markers else \
            "kubernetes" if "kubepods" in markers else "lxc" if "lxc" in markers else "container"
        return Virtualization("container", what, f"marker {first}")
    if virt and virt != "none":
        return Virtualization("vm", virt, f"systemd-detect-virt: {virt}")
    low = dmi.lower()
    for vendor in _VM_VENDORS:
        if vendor in low:
            return Virtualization("vm", vendor, f"DMI: {' / '.join(dmi.split())[:60]}")
    if hypervisor_flag:
        return Virtualization("vm", None, "cpu flag: hypervisor")
    return Virtualization("bare", None, "no VM or container markers")


@dataclass(frozen=True)
class PlatformMarkers:
    name: str
    files: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    hostname_prefix: tuple[str, ...] = ()


def detect_platform(markers: Iterable[PlatformMarkers], present_files: Iterable[str],
                    env_names: Iterable[str], hostname: str) -> tuple[str | None, str]:
    """The first platform whose markers match, with the evidence; (None, reason) when none."""
    files, envs = set(present_files), set(env_names)
    for m in markers:
        for f in m.files:
            if f in files:
                return m.name, f"{f} exists"
        for e in m.env:
            if e in envs:
                return m.name, f"${e} is set"
        for prefix in m.hostname_prefix:
            if hostname.startswith(prefix):
                return m.name, f"hostname {hostname}"
    return None, "no platform markers"
