"""The recipe's minimums (cores, memory, free disk, GPU memory) judged against what a host has:
the one rule `plan` (before anything is installed) and validation (after) both apply.

Pure: the caller says what the host has; each shortfall comes back as one line naming what is
short, by how much, and which recipe key asks for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

KEYS = ("min_cpu_cores", "min_memory_gb", "min_free_disk_gb", "min_gpu_memory_gb")


@dataclass(frozen=True)
class Resources:
    """What a job on the host can use."""

    cpu_cores: int | None = None
    memory_gb: float | None = None  # what /proc/meminfo says
    memory_limit_gb: float | None = None  # the cgroup's limit, where there is one
    cpu_limit: float | None = None  # the cgroup's CPU quota in cores, where there is one
    free_disk_gb: Mapping[str, float] = field(default_factory=dict)  # path -> GB free
    disk_total_gb: Mapping[str, float] = field(default_factory=dict)  # path -> its size
    gpu_memory_gb: Sequence[float] = ()  # each GPU's memory


@dataclass(frozen=True)
class Judgement:
    key: str  # the recipe key
    what: str  # "cpu cores", "memory", "free disk /root", "GPU memory (GPU 0)"
    ok: bool
    reason: str


def _num(x: float) -> str:
    """As written: the recipe's 8 stays 8, a measured 200.0 GB stays 200.0."""
    return str(x)


def judge(need: Mapping[str, float], have: Resources, who: str) -> list[Judgement]:
    """Every minimum ``who`` (the recipe) sets that the host's figures can answer, passed or
    short."""
    out: list[Judgement] = []
    cores = have.cpu_cores
    if have.cpu_limit is not None and (cores is None or have.cpu_limit < cores):
        cores_text = f"{_num(have.cpu_limit)} (the cgroup's CPU quota)"
        cores = max(1, int(have.cpu_limit))
    else:
        cores_text = str(cores)
    if "min_cpu_cores" in need and cores is not None:
        want = need["min_cpu_cores"]
        out.append(Judgement("min_cpu_cores", "cpu cores", cores >= want,
                             f"{cores_text}, {who} wants at least {_num(want)}"))
    memory = have.memory_gb
    memory_text = f"{_num(memory)} GB" if memory is not None else ""
    if have.memory_limit_gb is not None and (memory is None or have.memory_limit_gb < memory):
        memory = have.memory_limit_gb
        memory_text = f"{_num(memory)} GB (the cgroup's limit)"
    if "min_memory_gb" in need and memory is not None:
        want = need["min_memory_gb"]
        out.append(Judgement("min_memory_gb", "memory", memory >= want,
                             f"{memory_text}, {who} wants at least {_num(want)} GB"))
    if "min_free_disk_gb" in need:
        want = need["min_free_disk_gb"]
        for path, free in have.free_disk_gb.items():
            total = have.disk_total_gb.get(path)
            of = f" of {_num(total)} GB" if total is not None else ""
            out.append(Judgement("min_free_disk_gb", f"free disk {path}", free >= want,
                                 f"{_num(free)} GB free{of}, {who} wants {_num(want)} GB"))
    if "min_gpu_memory_gb" in need:
        want = need["min_gpu_memory_gb"]
        for i, gb in enumerate(have.gpu_memory_gb):
            out.append(Judgement("min_gpu_memory_gb", f"GPU memory (GPU {i})", gb >= want,
                                 f"{_num(gb)} GB, {who} wants at least "
                                 f"{_num(want)} GB"))
    return out


def shortfalls(need: Mapping[str, float], have: Resources, who: str) -> list[str]:
    """One line per minimum the host does not meet: what, how much there is, what ``who``
    wants and its key."""
    return [f"{j.what}: {j.reason} (validation.{j.key})" for j in judge(need, have, who)
            if not j.ok]
