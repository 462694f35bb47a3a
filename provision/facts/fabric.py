"""NVSwitch boards and their fabric manager: the switches on the PCI bus, the fabric manager's
version and service state, and the fabric state nvidia-smi reports per GPU.

On HGX/DGX boards with NVSwitch (A100/H100/H200 SXM: NVIDIA functions of PCI class 0680, as
NVIDIA's gpu-admin-tools tell them apart), CUDA fails with error 802 "system not yet
initialized" until nvidia-fabricmanager, of exactly the loaded driver's version, has set up the
NVLink fabric. B200/B300 boards have no NVIDIA switch function: their NVSwitches sit behind
ConnectX-7 bridges and need NVLSM besides (``nvlink5``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .pci import PciGpu

# lspci -nn: "03:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)"
_SWITCH = re.compile(r"^(?P<slot>[0-9a-fA-F:.]+)\s+[^\[]*\[0680\]: .*\[10de:[0-9a-fA-F]{4}\]")
NVLINK5_GPUS = {"2901": "B200", "3182": "B300"}  # HGX boards whose switches hide behind CX-7


@dataclass(frozen=True)
class FabricManager:
    version: str | None  # `nv-fabricmanager --version`; None: the binary is not there
    active: str | None  # `systemctl is-active`: active | inactive | failed | activating ...
    enabled: str | None  # `systemctl is-enabled`: enabled | disabled | ...

    @property
    def running(self) -> bool:
        return self.active == "active"


@dataclass(frozen=True)
class FabricState:
    index: int
    state: str | None  # Not Supported | Not Started | In Progress | Completed; None: N/A
    status: str | None  # Success, or an NVML error; meaningful once Completed


def parse_nvswitches(lspci: str) -> tuple[str, ...]:
    """PCI slots of the NVIDIA NVSwitch functions (class 0680) in ``lspci -nn`` output."""
    return tuple(m.group("slot") for line in lspci.splitlines()
                 if (m := _SWITCH.match(line.strip())))


def nvlink5_board(gpus: tuple[PciGpu, ...]) -> str | None:
    """"8x B200" for an HGX board of NVLink5 GPUs (more than one: a single GPU has no fabric)."""
    models = [NVLINK5_GPUS[g.device_id] for g in gpus if g.device_id in NVLINK5_GPUS]
    return f"{len(models)}x {models[0]}" if len(models) > 1 else None


def parse_fm_version(text: str) -> str | None:
    """``Fabric Manager version is : 450.102.04`` -> ``450.102.04``."""
    m = re.search(r"Fabric Manager version is\s*:\s*(\d+(?:\.\d+)+)", text)
    return m.group(1) if m else None


def parse_fabric_manager(text: str) -> FabricManager | None:
    """The fabric manager probe's ``== version``/``== active``/``== enabled`` sections; None when
    it printed nothing (no fabric manager on the host)."""
    sections: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^== (\w+)$", line)
        if m:
            current = m.group(1)
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    if not sections:
        return None

    def word(key: str) -> str | None:
        value = sections.get(key, "").strip().splitlines()
        # systemctl's one word; anything longer is an error text (no systemd, no unit)
        return value[0] if value and re.fullmatch(r"[a-z-]+", value[0]) else None

    return FabricManager(version=parse_fm_version(sections.get("version", "")),
                         active=word("active"), enabled=word("enabled"))


def parse_fabric_states(text: str, rc: int) -> tuple[FabricState, ...]:
    """``--query-gpu=index,fabric.state,fabric.status --format=csv,noheader`` rows; none when the
    driver does not know the fields (``is not a valid field to query``) or the probe did not run."""
    if rc != 0:
        return ()
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 3 or not cells[0].isdigit():
            continue
        na = ("N/A", "[N/A]", "")
        out.append(FabricState(int(cells[0]), None if cells[1] in na else cells[1],
                               None if cells[2] in na else cells[2]))
    return tuple(out)


def fabric_summary(states: tuple[FabricState, ...]) -> str:
    """"fabric Completed on 8 GPUs" / "fabric In Progress on 8 GPUs"; "" when not reported."""
    names = [s.state or "N/A" for s in states]
    if not names:
        return ""
    counts = {s: names.count(s) for s in dict.fromkeys(names)}
    return "fabric " + ", ".join(f"{s} on {n} GPU{'s' if n > 1 else ''}" for s, n in counts.items())


def fabric_ready(states: tuple[FabricState, ...]) -> bool | None:
    """Every GPU's fabric Completed with Success; None where the driver does not report it
    (A100 boards say N/A even with the fabric manager running)."""
    known = [s for s in states if s.state is not None]
    if not known:
        return None
    return all(s.state == "Completed" and s.status in (None, "Success") for s in known)


def fm_packages(family: str, driver: str) -> list[str]:
    """The fabric manager of ``driver``'s package names on a package family ("apt", else the
    dnf/yum families), to try in this order. NVIDIA's CUDA repo (its gpu-driver-container install
    scripts) and Ubuntu's archive: apt ``nvidia-fabricmanager-<branch>`` before R580,
    ``nvidia-fabricmanager`` from R580 on; dnf/yum ``nvidia-fabric-manager`` before R580,
    ``nvidia-fabricmanager`` from R580 on. The one place these names are spelled: the step that
    installs it and doctor's fix both read them here."""
    branch = int(driver.split(".")[0])
    if family == "apt":
        return ["nvidia-fabricmanager", f"nvidia-fabricmanager-{branch}"] if branch >= 580 \
            else [f"nvidia-fabricmanager-{branch}"]
    return ["nvidia-fabricmanager", "nvidia-fabric-manager"] if branch >= 580 \
        else ["nvidia-fabric-manager", "nvidia-fabricmanager"]


def fm_install_spec(family: str, driver: str) -> str:
    """What a user installs for exactly ``driver``: ``nvidia-fabricmanager=580.65.06-1`` (apt),
    ``nvidia-fabricmanager-580.65.06`` (dnf)."""
    name = fm_packages(family, driver)[0]
    return f"{name}={driver}-1" if family == "apt" else f"{name}-{driver}"
