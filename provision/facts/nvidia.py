"""nvidia-smi (every form the project reads), ``/proc/driver/nvidia/version`` and the failures.

Machine formats (``--query-gpu ... --format=csv``, ``-q -x``) are preferred; the human table and
``-q`` are parsed too because that is what users paste and what old drivers give. ``[N/A]`` and
"deprecated" cells become None.
"""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from typing import Literal

NvidiaState = Literal["ok", "no_driver", "not_loaded", "nvml_mismatch", "no_devices", "gpu_lost",
                      "unknown_error"]

STATE_TEXT: dict[str, str] = {
    "ok": "driver loaded, NVML answers",
    "no_driver": "no NVIDIA driver installed (nvidia-smi not found)",
    "not_loaded": "nvidia-smi cannot communicate with the driver (kernel module not loaded)",
    "nvml_mismatch": "NVML driver/library version mismatch (driver updated without a reboot)",
    "no_devices": "the driver sees no devices (GPU not passed through, or blocked by nouveau)",
    "gpu_lost": "a GPU has fallen off the bus (GPU is lost): hardware, reboot or ticket",
    "unknown_error": "nvidia-smi failed with an unknown error",
}

# Columns the facts script asks for, in order (``--query-gpu=...``).
QUERY_FIELDS = ("index", "name", "driver_version", "memory.total", "memory.used", "compute_cap",
                "utilization.gpu", "pci.bus_id", "uuid")


@dataclass(frozen=True)
class Gpu:
    index: int | None
    name: str
    driver: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    compute_cap: str | None = None  # "8.9"
    utilization_pct: int | None = None
    bus_id: str | None = None
    uuid: str | None = None


@dataclass(frozen=True)
class SmiHeader:
    driver: str | None
    cuda: str | None  # the max CUDA the driver supports ("CUDA Version" / "CUDA UMD Version")


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_memory_mib: int | None
    gpu_uuid: str | None = None  # the GPU it runs on (nvidia-smi's UUID), where asked for


def _na(value: str | None) -> str | None:
    """``[N/A]``, ``N/A``, ``[Not Supported]``, empty and "deprecated" cells -> None."""
    if value is None:
        return None
    v = value.strip()
    if not v or v.strip("[]").lower() in ("n/a", "not supported", "unknown error") or \
            "deprecated" in v.lower():
        return None
    return v


def _int(value: str | None) -> int | None:
    v = _na(value)
    m = re.match(r"-?\d+", v) if v else None
    return int(m.group()) if m else None


def parse_failure(text: str, exit_code: int) -> NvidiaState | None:
    """Map nvidia-smi's output and exit code to a named state; None when it succeeded."""
    low = text.lower()
    if exit_code == 127 or "command not found" in low or "no se ha encontrado la orden" in low or \
            "not found" in low and "nvidia-smi" in low and exit_code != 0:
        return "no_driver"
    if "couldn't communicate with the nvidia driver" in low:
        return "not_loaded"
    if "driver/library version mismatch" in low:
        return "nvml_mismatch"
    if "no devices were found" in low:
        return "no_devices"
    if "gpu is lost" in low:
        return "gpu_lost"
    if "unknown error" in low or exit_code != 0:
        return "unknown_error"
    return None


def nvml_library_version(text: str) -> str | None:
    """``NVML library version: 550.144`` (printed with a mismatch) -> ``"550.144"``."""
    m = re.search(r"NVML library version:\s*([\d.]+)", text)
    return m.group(1) if m else None


def parse_header(text: str) -> SmiHeader:
    """Driver and max CUDA from the table header, ``-q`` or ``--version``.

    Drivers >= 610 print ``KMD Version`` / ``CUDA UMD Version`` (the old names are deprecated
    there); those win when both appear.
    """
    def find(pattern: str) -> str | None:
        m = re.search(pattern, text, re.IGNORECASE)
        return m.group(1) if m else None

    num = r"\s*:\s*(\d+\.\d+(?:\.\d+)?)"
    driver = find(r"KMD Version" + num) or find(r"Driver Version" + num)
    cuda = find(r"CUDA UMD Version" + num) or find(r"CUDA Version" + num)
    return SmiHeader(driver=driver, cuda=cuda)


def _norm_col(col: str) -> str:
    return re.sub(r"\s*\[[^\]]*\]$", "", col.strip())


def parse_query_gpu(text: str, fields: tuple[str, ...] | None = None) -> tuple[Gpu, ...]:
    """``--query-gpu=... --format=csv[,noheader]``. Without ``fields`` the first row is the header."""
    rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if r and any(r)]
    if not rows:
        return ()
    if fields is None:
        header, rows = [_norm_col(c) for c in rows[0]], rows[1:]
    else:
        header = list(fields)
    gpus = []
    for pos, row in enumerate(rows):
        cell = dict(zip(header, (c.strip() for c in row), strict=False))  # short rows: N/A
        index = _int(cell.get("index"))
        gpus.append(Gpu(
            index=index if index is not None else pos,
            name=_na(cell.get("name")) or "unknown GPU",
            driver=_na(cell.get("driver_version")),
            memory_total_mib=_int(cell.get("memory.total")),
            memory_used_mib=_int(cell.get("memory.used")),
            compute_cap=_na(cell.get("compute_cap")),
            utilization_pct=_int(cell.get("utilization.gpu")),
            bus_id=_na(cell.get("pci.bus_id")),
            uuid=_na(cell.get("uuid")),
        ))
    return tuple(gpus)


def parse_compute_apps(text: str) -> tuple[GpuProcess, ...]:
    """``--query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader``
    (the GPU's UUID first: "GPU-..." or "MIG-..."), or the same without ``gpu_uuid``. A
    process name nvidia-smi cannot read is "[Not Found]"."""
    out = []
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        uuid = None
        if row and row[0].strip().startswith(("GPU-", "MIG-")):
            uuid, row = row[0].strip(), row[1:]
        if len(row) >= 2 and row[0].strip().isdigit():
            out.append(GpuProcess(pid=int(row[0]), name=row[1].strip(),
                                  used_memory_mib=_int(row[2]) if len(row) > 2 else None,
                                  gpu_uuid=uuid))
    return tuple(out)


_TABLE_GPU = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s*\|")
_TABLE_MEM = re.compile(r"\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|\s*(\d+|N/A)%?")


def parse_table(text: str) -> tuple[SmiHeader, tuple[Gpu, ...]]:
    """The default ``nvidia-smi`` table: header plus index, (truncated) name, memory, utilization."""
    header = parse_header(text)
    gpus: list[Gpu] = []
    for line in text.splitlines():
        m = _TABLE_GPU.match(line)
        if m:
            gpus.append(Gpu(index=int(m.group(1)), name=m.group(2).strip(), driver=header.driver))
            continue
        mm = _TABLE_MEM.search(line)
        if mm and gpus and gpus[-1].memory_total_mib is None:
            gpus[-1] = replace(gpus[-1], memory_used_mib=int(mm.group(1)),
                               memory_total_mib=int(mm.group(2)),
                               utilization_pct=_int(mm.group(3)))
    return header, tuple(gpus)


def parse_q(text: str) -> tuple[SmiHeader, tuple[Gpu, ...]]:
    """``nvidia-smi -q`` (or ``-a``): per-GPU blocks of ``Key : value`` lines."""
    header = parse_header(text)
    gpus: list[Gpu] = []
    section = ""
    for line in text.splitlines():
        if re.match(r"^GPU [0-9A-Fa-f]{4,8}:", line):
            gpus.append(Gpu(index=len(gpus), name="unknown GPU", driver=header.driver,
                            bus_id=line.split(" ", 1)[1].strip()))
            section = ""
            continue
        if not gpus:
            continue
        key, sep, value = line.partition(":")
        k = key.strip()
        if not sep or not value.strip():
            section = k
            continue
        g = gpus[-1]
        if k == "Product Name":
            gpus[-1] = replace(g, name=value.strip())
        elif k == "GPU UUID":
            gpus[-1] = replace(g, uuid=value.strip())
        elif section == "FB Memory Usage" and k == "Total":
            gpus[-1] = replace(g, memory_total_mib=_int(value))
        elif section == "FB Memory Usage" and k == "Used":
            gpus[-1] = replace(g, memory_used_mib=_int(value))
        elif section == "Utilization" and k == "Gpu":
            gpus[-1] = replace(g, utilization_pct=_int(value))
    return header, tuple(gpus)


def parse_q_xml(text: str) -> tuple[SmiHeader, tuple[Gpu, ...]]:
    """``nvidia-smi -q -x``."""
    root = ET.fromstring(text)
    driver = _na(root.findtext("driver_version"))
    header = SmiHeader(driver=driver, cuda=_na(root.findtext("cuda_version")))
    gpus = []
    for i, g in enumerate(root.findall("gpu")):
        gpus.append(Gpu(
            index=i,
            name=_na(g.findtext("product_name")) or "unknown GPU",
            driver=driver,
            memory_total_mib=_int(g.findtext("fb_memory_usage/total")),
            memory_used_mib=_int(g.findtext("fb_memory_usage/used")),
            utilization_pct=_int(g.findtext("utilization/gpu_util")),
            bus_id=g.get("id"),
            uuid=_na(g.findtext("uuid")),
        ))
    return header, tuple(gpus)


@dataclass(frozen=True)
class ListedGpu:
    index: int
    name: str
    uuid: str | None
    mig_devices: int  # MIG instances listed under it (0 when MIG is off)


def parse_list(text: str) -> tuple[ListedGpu, ...]:
    """``nvidia-smi -L``: one line per GPU, indented MIG device lines under it."""
    gpus: list[ListedGpu] = []
    for line in text.splitlines():
        m = re.match(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)", line)
        if m:
            gpus.append(ListedGpu(int(m.group(1)), m.group(2), m.group(3), 0))
        elif re.match(r"^\s+MIG ", line) and gpus:
            gpus[-1] = replace(gpus[-1], mig_devices=gpus[-1].mig_devices + 1)
    return tuple(gpus)


@dataclass(frozen=True)
class KernelModule:
    version: str
    open: bool  # NVIDIA's open GPU kernel modules (required for Blackwell)


def parse_driver_version(text: str) -> KernelModule | None:
    """``/proc/driver/nvidia/version`` or ``/sys/module/nvidia/version`` -> the loaded module."""
    t = text.strip()
    if re.fullmatch(r"\d+\.\d+(\.\d+)?", t):
        return KernelModule(version=t, open=False)
    m = re.search(r"NVRM version:.*?Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s", t + " ")
    if not m:
        return None
    return KernelModule(version=m.group(1), open="Open Kernel Module" in t)
