"""The named fact checks knowledge entries refer to with ``when``: each looks at a host's facts
and returns the placeholders it provides (a true value, possibly empty) or None when it does not
hold. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..config.recipes import load_platform
from ..errors import ConfigError
from ..facts.fabric import fabric_ready, fabric_summary
from ..facts.host import HostFacts
from ..facts.limits import Finding
from ..facts.limits import judge as judge_limits

# Fact checks: each returns the placeholders it provides (a true value) or None.
Check = Callable[[HostFacts], "dict[str, str] | None"]


def _branches(packages: Sequence[str]) -> set[str]:
    found = set()
    for p in packages:
        name, _, version = p.partition(" ")
        m = re.search(r"nvidia-(?:driver|dkms)-(\d{3})", name) or re.match(r"(\d{3})\.", version)
        if m:
            found.add(m.group(1))
    return found


BUSY_MIB = 512  # memory in use before a job above this: someone else is on the GPU


def _ranges(indexes: list[int]) -> str:
    """[0, 1, 2, 4, 5, 6, 7] -> "0-2, 4-7"."""
    out: list[str] = []
    for i in sorted(indexes):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = out[-1].split("-")[0] + f"-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


def _busy_by_index(f: HostFacts) -> str | None:
    """Each GPU in use, by index, with the processes on it (their GPU UUIDs) and its
    utilisation, then the free ones to run on instead (the same words validation uses,
    templates/gpu/gpu_verdict.py); None when the processes do not name their GPUs."""
    by_uuid = {g.uuid: g for g in f.gpus if g.uuid and g.index is not None}
    placed = [p for p in f.gpu_processes if p.gpu_uuid in by_uuid]
    if not by_uuid or (f.gpu_processes and not placed):
        return None
    busy: dict[int, str] = {}
    for g in f.gpus:
        if g.index is None:
            continue
        mine = [p for p in placed if p.gpu_uuid == g.uuid]
        if not mine and (g.memory_used_mib or 0) <= BUSY_MIB:
            continue
        held = sum(p.used_memory_mib or 0 for p in mine) or g.memory_used_mib or 0
        who = ", ".join(f"pid {p.pid} ({p.name})" for p in mine[:3]) or "no process we can see"
        util = f", {g.utilization_pct}% busy" if g.utilization_pct is not None else ""
        busy[g.index] = f"GPU {g.index}: {held / 1024:.1f} GB held by {who}{util}"
    if not busy:
        return None
    text = "; ".join(busy.values())
    free = [g.index for g in f.gpus if g.index is not None and g.index not in busy]
    if free:
        many = len(free) > 1
        text += (f"; GPU{'s' if many else ''} {_ranges(free)} {'are' if many else 'is'} free: "
                 f"run with --gpus {','.join(map(str, free))}")
    else:
        text += "; no GPU is free (a shared or dirty instance)"
    return text


def busy(f: HostFacts) -> dict[str, str] | None:
    by_index = _busy_by_index(f)
    if by_index:
        return {"busy": by_index}
    if f.gpu_processes:
        procs = ", ".join(f"{p.name} (pid {p.pid}, {p.used_memory_mib or '?'} MiB)"
                          for p in f.gpu_processes[:5])
        return {"busy": f"{len(f.gpu_processes)} process(es) already run on it: {procs}"}
    used = [g for g in f.gpus if (g.memory_used_mib or 0) > BUSY_MIB]
    if used:
        return {"busy": "; ".join(f"GPU {g.index} has {g.memory_used_mib} MiB of "
                                  f"{g.memory_total_mib} MiB in use" for g in used)}
    return None


def _disk_full(f: HostFacts) -> dict[str, str] | None:
    low = [d for d in f.disks if d.total_gb > 0 and (d.free_gb < 5 or d.free_gb / d.total_gb < 0.05)]
    if not low:
        return None
    return {"disk_text": "; ".join(f"The disk holding {d.path} ({d.mount}) has {d.free_gb} GB "
                                   f"free of {d.total_gb} GB" for d in low) + "."}


def _home_small(f: HostFacts) -> dict[str, str] | None:
    home = next((d for d in f.disks if d.path == f.home), None)
    if home is None or home.total_gb >= 60:
        return None
    big = max((d for d in f.disks if d.mount != home.mount), key=lambda d: d.free_gb, default=None)
    if big is None or big.free_gb < 2 * home.total_gb:
        return None
    return {"home_text": f"The home disk ({home.mount}) is {home.total_gb} GB while {big.path} "
                         f"({big.mount}) has {big.free_gb} GB free: downloads and caches in "
                         "$HOME fill the small one first.", "data_mount": big.path}


def _conda_and_pip(f: HostFacts) -> dict[str, str] | None:
    """torch of conda's and a wheel's (pip, or uv, which the torch step may use) in one env."""
    both = [(env, w) for env, who in f.torch_installers.items() if "conda" in who
            for w in who if w in ("pip", "uv")]
    return {"env": both[0][0], "installer": both[0][1]} if both else None


def _nvcc_differs(f: HostFacts) -> dict[str, str] | None:
    if not (f.nvcc and f.driver_cuda):
        return None
    if f.nvcc.split(".")[:2] == f.driver_cuda.split(".")[:2]:
        return None
    return {"nvcc": f.nvcc, "driver_cuda": f.driver_cuda}


def _fabric_manager_down(f: HostFacts) -> dict[str, str] | None:
    """An NVSwitch board whose fabric manager is missing, stopped or not the driver's version
    (in a container, where it is the provider's: whose fabric is not up)."""
    if not f.nvswitches:
        return None
    fm, summary = f.fabric_manager, fabric_summary(f.fabric)
    if f.virtualization.kind == "container":
        state = f"the fabric is not up ({summary})" if fabric_ready(f.fabric) is False else None
    elif fm is None or fm.version is None:
        state = "nvidia-fabricmanager is not installed"
    elif f.driver and fm.version != f.driver:
        state = f"nvidia-fabricmanager is {fm.version}, not the driver's {f.driver}"
    elif not fm.running:
        state = f"nvidia-fabricmanager {fm.version} is {fm.active or 'not running'}"
    elif fabric_ready(f.fabric) is False:
        state = f"nvidia-fabricmanager runs but the fabric is not up ({summary})"
    else:
        state = None
    if state is None:
        return None
    return {"switches": f"{len(f.nvswitches)} NVSwitches on the PCI bus",
            "fm_state": state + (f"; {summary}" if summary and summary not in state else "")}


def limit_findings(f: HostFacts, platform: str | None = None) -> list[Finding]:
    """The limits a job will meet (facts/limits.py judges them), each fix in the words of the
    platform (``platform``, else the one the facts detected) where it has its own; doctor and
    validate show these."""
    name = platform or f.platform
    fixes: dict[str, str] = {}
    if name:
        try:
            fixes = dict(load_platform(name).limits_fix)
        except ConfigError:  # a platform unknown here: the generic fix
            pass
    return judge_limits(f.limits, memory_gb=f.memory_gb, cpu_cores=f.cpu_cores,
                        container=f.virtualization.kind == "container", fixes=fixes,
                        devices={d.path: d.device for d in f.disks})


def _limits(f: HostFacts, severity: str) -> dict[str, str] | None:
    """The limits a job will meet, of one severity."""
    found = [x for x in limit_findings(f) if x.severity == severity]
    if not found:
        return None
    return {"limits_text": "; ".join(x.text for x in found) + ".",
            "limits_fix": " ".join(f"{x.fix}." for x in found if x.fix)}


CHECKS: dict[str, Check] = {
    "host_limits": lambda f: _limits(f, "warn"),
    "host_limits_info": lambda f: _limits(f, "info"),
    "gpu_cc_unreadable": lambda f: {"faults": " ".join(f"{x}." for x in f.gpu_faults)}
    if f.gpu_faults else None,
    "fabric_manager_down": _fabric_manager_down,
    "nouveau_loaded": lambda f: {} if f.nouveau_loaded else None,
    "secure_boot": lambda f: {} if f.secure_boot else None,
    "no_module_for_kernel": lambda f: {"kernel": f.kernel}
    if f.nvidia_ko_for_kernel is False and f.virtualization.kind != "container" else None,
    "container": lambda f: {} if f.virtualization.kind == "container" else None,
    "no_driver_with_gpu": lambda f: {"pci": ", ".join(g.name for g in f.pci_gpus)}
    if f.nvidia_state == "no_driver" and f.pci_gpus else None,
    "several_driver_branches": lambda f: {"packages": ", ".join(f.driver_packages)}
    if len(_branches(f.driver_packages)) > 1 else None,
    "torch_conda_and_pip": _conda_and_pip,
    "gpu_busy": busy,
    "disk_nearly_full": _disk_full,
    "home_small_beside_data": _home_small,
    "nvcc_differs": _nvcc_differs,
}
