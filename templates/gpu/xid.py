"""gpu-provision, the kernel log's Xid lines: read, scoped to our GPUs by PCI address and
classified by NVIDIA's Xid catalog. Pure functions (Python 3.8+, standard library only): shipped
beside validate_gpu.py, and the one rule the provisioner's job health (provision/jobs/health.py)
loads as well, so the host and the laptop read an Xid line alike.

The line, as the driver logs it (NVIDIA, "Xid Errors", https://docs.nvidia.com/deploy/xid-errors/):
  [Fri Apr  5 21:29:39 2024] NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has
  fallen off the bus.
  [240314.528856] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable ...
  May  6 00:38:27 alex kernel: [ 4909.922970] NVRM: Xid (0000:01:00): 13, 0005 00000000 ...
(domain:bus:device of the GPU; older drivers print no "PCI:"). nvidia-smi's pci.bus_id names the
same GPU "00000000:A1:00.0".

The classes come from NVIDIA's catalog (https://docs.nvidia.com/deploy/xid-errors/analyzing-
xid-catalog.html, "Resolution Bucket (Immediate Action)"): an application's own fault is
RESTART_APP with the application or CUDA to check (13, 31, 43, 45 ...: the next job is fine);
the GPU's hardware needs a reset, a reboot or service (RESET_GPU, RESTART_BM, the ECC and NVLink
workflows: 48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140 ...); the driver's firmware or its
software (GSP, context-switch timeouts) is the driver class.
"""

from __future__ import annotations

import re
from typing import Any

XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
                      r"(?:\.\d)?\): (?P<code>\d+), ?(?P<text>.*)")
STAMP = re.compile(r"^\s*\[\s*(?P<up>\d+\.\d+)\]|^\s*\[(?P<wall>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d "
                   r"[\d:]{8} \d{4})\]|^(?P<syslog>[A-Z][a-z]{2} [ \d]\d [\d:]{8})")

# code: (what NVIDIA calls it, class, the catalog's immediate action)
CATALOG: dict[int, tuple[str, str, str]] = {
    8: ("GPU stopped processing", "application", "RESTART_APP"),
    11: ("invalid or corrupted push buffer stream", "application", "RESTART_APP"),
    13: ("graphics engine exception", "application", "RESTART_APP"),
    25: ("invalid or illegal push buffer stream", "application", "RESTART_APP"),
    31: ("GPU memory page fault", "application", "RESTART_APP"),
    32: ("invalid or corrupted push buffer stream", "application", "RESTART_APP"),
    37: ("driver firmware error", "driver", "IGNORE"),
    38: ("driver firmware error", "driver", "IGNORE"),
    39: ("copy engine exception", "application", "RESTART_APP"),
    40: ("copy engine exception", "application", "RESTART_APP"),
    41: ("copy engine exception", "application", "RESTART_APP"),
    43: ("GPU stopped processing (the application's channel was reset)", "application", "IGNORE"),
    44: ("graphics engine fault during context switch", "driver", "IGNORE"),
    45: ("preemptive cleanup after an earlier error", "application", "IGNORE"),
    46: ("GPU stopped processing", "hardware", "RESET_GPU"),
    48: ("double bit ECC error", "hardware", "RESET_GPU"),
    54: ("auxiliary power is not connected to the GPU board", "hardware", "CHECK_MECHANICALS"),
    60: ("video processor exception", "application", "RESTART_APP"),
    62: ("internal micro-controller halt", "hardware", "RESET_GPU"),
    63: ("GPU memory remapping event (a row marked for remapping)", "hardware", "IGNORE"),
    64: ("GPU memory remapping failure", "hardware", "RESET_GPU"),
    66: ("illegal access by the driver", "driver", "IGNORE"),
    67: ("illegal access by the driver", "driver", "IGNORE"),
    68: ("NVDEC0 exception", "application", "RESTART_APP"),
    69: ("graphics engine class error", "application", "RESTART_APP"),
    74: ("NVLink error", "hardware", "RESET_GPU"),
    79: ("fell off the bus", "hardware", "RESTART_BM"),
    80: ("corrupted data sent to the GPU", "application", "RESTART_APP"),
    92: ("high single-bit ECC error rate", "hardware", "IGNORE"),
    93: ("InfoROM wear limit exceeded", "hardware", "IGNORE"),
    94: ("contained memory (ECC) error", "hardware", "RESTART_APP"),
    95: ("uncontained memory (ECC) error", "hardware", "RESET_GPU"),
    109: ("context switch timeout", "driver", "RESET_GPU"),
    110: ("security fault", "driver", "RESET_GPU"),
    119: ("GSP RPC timeout", "driver", "RESET_GPU"),
    120: ("GSP error", "driver", "RESET_GPU"),
    121: ("C2C link error", "hardware", "IGNORE"),
    136: ("link training failed", "hardware", "RESET_GPU"),
    137: ("NVLink privilege error", "driver", "IGNORE"),
    140: ("unrecovered ECC error", "hardware", "RESET_GPU"),
    143: ("GPU initialization error", "hardware", "RESET_GPU"),
    149: ("NVLink NETIR error", "hardware", "RESET_GPU"),
    154: ("GPU recovery action changed", "driver", "IGNORE"),
    155: ("NVLink software-defined error", "driver", "RESET_GPU"),
    156: ("resource retirement event", "hardware", "RESET_GPU"),
    158: ("GPU fatal timeout", "hardware", "RESET_GPU"),
    167: ("PCIe fatal timeout", "hardware", "RESET_GPU"),
}
for _code in (70, 71, 72, 75, 76, 77, 82, 83, 84, 85, 86, 88, 89) + tuple(range(96, 106)) \
        + tuple(range(126, 136)) + (139,):
    CATALOG.setdefault(_code, ("engine exception", "application", "RESTART_APP"))
for _code in range(144, 151):
    CATALOG.setdefault(_code, ("NVLink error", "hardware", "RESET_GPU"))
# what the renter is told to do, by the catalog's immediate action
ACTION = {"RESTART_APP": "the application's own fault: restarting it is enough",
          "IGNORE": "informational", "RESET_GPU": "the GPU needs a reset (nvidia-smi -r, root)",
          "RESTART_BM": "the machine needs a reboot", "CHECK_MECHANICALS": "the board needs service"}
FAILS = ("RESET_GPU", "RESTART_BM", "CHECK_MECHANICALS")  # a hardware Xid that leaves the GPU unfit


def pci_key(address: str) -> str | None:
    """"00000000:A1:00.0" (nvidia-smi) or "0000:a1:00" (the Xid line) -> "0000:a1:00"."""
    m = re.search(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})", address or "")
    if not m:
        return None
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}"


def classify(code: int) -> dict[str, str]:
    what, kind, action = CATALOG.get(code, ("not in NVIDIA's catalog", "unknown", "CONTACT_SUPPORT"))
    return {"what": what, "class": kind, "action": action}


def parse(text: str) -> list[dict[str, Any]]:
    """Every Xid line of a kernel log: {"pci", "code", "what", "class", "action", "line",
    "uptime" (seconds since boot, from dmesg's stamp) or "stamp" (the wall-clock text)}."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = XID_LINE.search(line)
        if not m:
            continue
        code = int(m.group("code"))
        event: dict[str, Any] = {"pci": pci_key(m.group("pci")), "code": code, "line": line.strip()[:300],
                                 **classify(code)}
        s = STAMP.search(line)
        if s and s.group("up"):
            event["uptime"] = float(s.group("up"))
        elif s:
            event["stamp"] = s.group("wall") or s.group("syslog")
        out.append(event)
    return out


def scoped(events: list[dict[str, Any]], bus_ids: dict[str, str]) -> tuple[list[dict[str, Any]], int]:
    """The events of our GPUs ({pci.bus_id: GPU index}), each with its "gpu", and how many were
    another GPU's (another tenant's, on a shared machine whose kernel log we can read)."""
    ours = {pci_key(b): i for b, i in bus_ids.items() if pci_key(b)}
    mine = [{**e, "gpu": ours[e["pci"]]} for e in events if e.get("pci") in ours]
    return mine, len(events) - len(mine)


def says(events: list[dict[str, Any]]) -> str:
    """"GPU 3: 2 x Xid 79 (fell off the bus, the machine needs a reboot)"; grouped by GPU and code."""
    groups: dict[tuple[Any, int], int] = {}
    for e in events:
        key = (e.get("gpu", "?"), int(e["code"]))
        groups[key] = groups.get(key, 0) + 1
    parts = []
    for (gpu, code), n in sorted(groups.items(), key=lambda x: (str(x[0][0]), x[0][1])):
        c = classify(code)
        parts.append(f"GPU {gpu}: {n} x Xid {code} ({c['what']}; {c['class']}: "
                     f"{ACTION.get(c['action'], 'contact the provider')})")
    return "; ".join(parts)
