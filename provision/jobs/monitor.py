"""``watch``: the sampler's JSON lines (templates/jobs/watch_sampler.sh.j2) parsed once, and the rules
that raise alerts from them. Pure: a sequence of samples in, views and alerts out.

Alerts: a running job's GPUs at 0% for N minutes; GPU memory near full; a job that exited (or was
lost); "out of memory" or NaN in a job's log; thermal or power throttling; a disk over 95%; what
changed in the GPUs' health since the watch began (new Xid events of our GPUs, ECC errors, a row
remap pending, a power limit the host changed: provision/jobs/health.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..facts.host import Disk, parse_df, parse_meminfo
from .health import Snapshot, diff, parse_snapshot
from .state import JobState, parse_records

# nvmlClocksEventReasons bits (NVML's nvmlClocksThrottleReasons before R535), as nvidia-smi's
# clocks_event_reasons.active prints them
REASONS = {0x1: "idle", 0x2: "applications clocks setting", 0x4: "SW power cap",
           0x8: "HW slowdown", 0x10: "sync boost", 0x20: "SW thermal slowdown",
           0x40: "HW thermal slowdown", 0x80: "HW power brake slowdown",
           0x100: "display clock setting"}
THROTTLING = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # what costs speed: power and thermal limits
RECENT = 600.0  # seconds: a job that ended this recently is announced when a watch starts


@dataclass(frozen=True)
class GpuSample:
    index: int
    utilization_pct: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    reasons: int | None  # the active clock-event bitmask

    @property
    def memory_fraction(self) -> float | None:
        if self.memory_used_mib is None or not self.memory_total_mib:
            return None
        return self.memory_used_mib / self.memory_total_mib

    @property
    def reason_names(self) -> tuple[str, ...]:
        return tuple(n for bit, n in REASONS.items() if self.reasons and self.reasons & bit)

    @property
    def throttled(self) -> tuple[str, ...]:
        return tuple(n for bit, n in REASONS.items()
                     if self.reasons and self.reasons & bit & THROTTLING)

    def as_json(self) -> dict[str, Any]:
        return {"index": self.index, "utilization_pct": self.utilization_pct,
                "memory_used_mib": self.memory_used_mib, "memory_total_mib": self.memory_total_mib,
                "temperature_c": self.temperature_c, "power_w": self.power_w,
                "power_limit_w": self.power_limit_w, "sm_clock_mhz": self.sm_clock_mhz,
                "sm_clock_max_mhz": self.sm_clock_max_mhz,
                "clock_reasons": list(self.reason_names), "throttled": list(self.throttled)}


def _num(cell: str) -> float | None:
    """A nounits cell; ``[N/A]``, ``[Not Supported]`` and the like are None."""
    try:
        return float(cell.strip())
    except ValueError:
        return None


def parse_gpu_rows(text: str) -> tuple[GpuSample, ...]:
    """The sampler's nvidia-smi rows: timestamp, count, index, utilization.gpu, memory.used,
    memory.total, temperature.gpu, power.draw, power.limit, clocks.current.sm, clocks.max.sm,
    clocks_event_reasons.active (csv, noheader, nounits)."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 12 or not cells[2].isdigit():
            continue
        try:
            reasons: int | None = int(cells[11], 16)
        except ValueError:
            reasons = None
        n = [_num(c) for c in cells[3:11]]
        out.append(GpuSample(int(cells[2]), n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7],
                             reasons))
    return tuple(out)


@dataclass(frozen=True)
class Sample:
    host: str
    t: float
    boot: str
    gpus: tuple[GpuSample, ...]
    jobs: tuple[JobState, ...]
    disks: tuple[Disk, ...]
    memory_gb: float  # /proc/meminfo's: in a container, the machine's
    memory_available_gb: float
    gpu_note: str = ""  # why there are no GPU rows, when nvidia-smi said so
    memory_limit_gb: float | None = None  # the cgroup's limit, where one is set
    memory_used_gb: float | None = None  # what the cgroup holds, less reclaimable file cache
    health: Snapshot | None = None  # ECC, remapped rows, power limits, Xid lines (every ~30 s)

    @property
    def limited(self) -> bool:
        """The cgroup's limit is below the machine's memory: it is what a job can use."""
        return self.memory_limit_gb is not None and self.memory_limit_gb < self.memory_gb

    @property
    def usable_gb(self) -> float:
        """The memory a job can use: the cgroup's limit in a limited container."""
        return self.memory_limit_gb if self.limited and self.memory_limit_gb else self.memory_gb

    @property
    def free_gb(self) -> float:
        if self.limited and self.memory_limit_gb is not None:
            return round(max(0.0, self.memory_limit_gb - (self.memory_used_gb or 0.0)), 1)
        return self.memory_available_gb


def parse_cgroup_memory(text: str) -> tuple[float | None, float | None]:
    """The sampler's ``cgmem`` line, "LIMIT USAGE INACTIVE_FILE" in bytes -> (limit GB, used GB).
    Used is the usage less the inactive file cache, as ``docker stats`` counts it (docker/cli
    cli/command/container/stats_helpers.go, calculateMemUsageUnixNoCache: v1 usage -
    total_inactive_file, v2 usage - inactive_file): the kernel reclaims that cache before it
    kills anything."""
    words = text.split()
    nums = [int(w) if w.isdigit() else None for w in words[:3]] + [None, None, None]
    limit, usage, inactive = nums[0], nums[1], nums[2]
    if limit is None or limit >= 1 << 62:  # v1's "no limit" is LONG_MAX rounded to a page
        return None, None
    used = None if usage is None else max(0, usage - (inactive or 0))
    return round(limit / 1024**3, 2), None if used is None else round(used / 1024**3, 2)


def parse_sample(line: str, host: str) -> Sample | None:
    """One JSON line of the sampler; None for anything else (it never raises)."""
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    if not isinstance(doc, Mapping) or "t" not in doc:
        return None
    t = float(doc.get("t") or 0)
    boot = str(doc.get("boot") or "")
    gpu_text = str(doc.get("gpus") or "")
    gpus = parse_gpu_rows(gpu_text)
    mem, avail = parse_meminfo(str(doc.get("mem") or ""))
    limit, used = parse_cgroup_memory(str(doc.get("cgmem") or ""))
    return Sample(host=host, t=t, boot=boot, gpus=gpus, memory_limit_gb=limit, memory_used_gb=used,
                  jobs=parse_records(str(doc.get("jobs") or ""), host, now=t, host_boot=boot).jobs,
                  disks=parse_df(str(doc.get("disk") or "")), memory_gb=mem,
                  health=parse_snapshot(json.dumps(doc["health"]))
                  if isinstance(doc.get("health"), dict) else None,
                  memory_available_gb=avail,
                  gpu_note="" if gpus or not gpu_text else gpu_text.strip().splitlines()[-1][:200])


@dataclass(frozen=True)
class Alert:
    level: str  # error | warning | info
    host: str
    text: str

    def as_json(self) -> dict[str, str]:
        return {"level": self.level, "host": self.host, "text": self.text}


def _g(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


@dataclass
class Monitor:
    """The latest sample of each host, the little history the rules need, and the alerts."""

    idle_minutes: float = 10.0
    memory_full: float = 0.95
    disk_full: float = 0.95
    latest: dict[str, Sample] = field(default_factory=dict)
    idle_since: dict[tuple[str, int], float] = field(default_factory=dict)
    seen_running: set[tuple[str, str]] = field(default_factory=set)
    log_rate: dict[tuple[str, str], float] = field(default_factory=dict)  # bytes/s
    errors: dict[str, str] = field(default_factory=dict)  # host -> why it has no samples
    health_first: dict[str, Snapshot] = field(default_factory=dict)  # the watch's first health
    health_last: dict[str, Snapshot] = field(default_factory=dict)

    def update(self, sample: Sample) -> None:
        host = sample.host
        before = self.latest.get(host)
        for g in sample.gpus:
            key = (host, g.index)
            if g.utilization_pct == 0:
                self.idle_since.setdefault(key, sample.t)
            else:
                self.idle_since.pop(key, None)
        if before is not None:
            sizes = {j.id: j.log_size for j in before.jobs}
            for j in sample.jobs:
                old = sizes.get(j.id)
                if old is not None and j.log_size is not None and sample.t > before.t:
                    self.log_rate[(host, j.id)] = max(0.0, (j.log_size - old) / (sample.t - before.t))
        self.latest[host] = sample
        self.errors.pop(host, None)
        if sample.health is not None:
            self.health_first.setdefault(host, sample.health)
            self.health_last[host] = sample.health

    def alerts(self, host: str) -> list[Alert]:
        s = self.latest.get(host)
        if s is None:
            return []
        out: list[Alert] = []
        by_index = {g.index: g for g in s.gpus}
        for j in s.jobs:
            if j.running:
                self.seen_running.add((host, j.id))
                mine = [by_index[i] for i in (j.gpus or tuple(by_index)) if i in by_index]
                since = [self.idle_since.get((host, g.index)) for g in mine]
                if mine and all(x is not None for x in since):
                    idle = s.t - max(x for x in since if x is not None)
                    if idle >= self.idle_minutes * 60 and (j.started or 0) <= s.t - idle:
                        out.append(Alert("warning", host, f"job {j.id}: GPU "
                                         f"{','.join(str(g.index) for g in mine)} at 0% for "
                                         f"{_minutes(idle)} while it runs"))
            else:
                ended = j.ended if j.ended is not None else j.started
                if (host, j.id) in self.seen_running or \
                        (ended is not None and s.t - ended <= RECENT):
                    out.append(Alert("error" if j.failed else "info", host,
                                     f"job {j.id} {j.label}" + (f": {j.evidence[:160]}"
                                                                if j.evidence else "")))
            if j.hit and (j.running or (host, j.id) in self.seen_running):
                out.append(Alert("error", host, f"job {j.id} log: {j.hit[:200]}"))
        for g in s.gpus:
            frac = g.memory_fraction
            if frac is not None and frac >= self.memory_full:
                out.append(Alert("warning", host, f"GPU {g.index} memory "
                                 f"{(g.memory_used_mib or 0) / 1024:.1f}/"
                                 f"{(g.memory_total_mib or 0) / 1024:.1f} GiB ({frac:.0%})"))
            if g.throttled:
                out.append(Alert("warning", host, f"GPU {g.index} throttled: "
                                 f"{', '.join(g.throttled)} (SM {_g(g.sm_clock_mhz)} of "
                                 f"{_g(g.sm_clock_max_mhz)} MHz, {_g(g.temperature_c)} C, "
                                 f"{_g(g.power_w)}/{_g(g.power_limit_w)} W)"))
        for line in diff(self.health_first.get(host), self.health_last.get(host)):
            out.append(Alert("error" if "hardware" in line or "ECC" in line or "no longer" in line
                             else "warning", host, f"since the watch began: {line}"))
        if s.usable_gb and 1 - s.free_gb / s.usable_gb >= self.memory_full:
            of = " (the cgroup's limit: past it the kernel kills the job)" if s.limited else ""
            out.append(Alert("warning", host, f"memory {s.usable_gb - s.free_gb:.1f}/"
                             f"{s.usable_gb:g} GB used{of}"))
        for d in s.disks:
            if d.total_gb and 1 - d.free_gb / d.total_gb >= self.disk_full:
                out.append(Alert("warning", host, f"disk {d.path} {1 - d.free_gb / d.total_gb:.0%} "
                                 f"used ({d.free_gb} GB free of {d.total_gb})"))
        return out

    def as_json(self, hosts: Iterable[str]) -> dict[str, Any]:
        """The latest view of every host, for scripts (``watch --once --json``)."""
        out: list[dict[str, Any]] = []
        for host in hosts:
            s = self.latest.get(host)
            if s is None:
                out.append({"host": host, "error": self.errors.get(host, "no sample")})
                continue
            out.append({
                "host": host, "t": s.t, "boot": s.boot,
                "gpus": [g.as_json() for g in s.gpus], "gpu_note": s.gpu_note or None,
                "jobs": [{**j.as_json(s.t), "log_bytes_per_s": self.log_rate.get((host, j.id))}
                         for j in s.jobs],
                "disks": [{"path": d.path, "free_gb": d.free_gb, "total_gb": d.total_gb}
                          for d in s.disks],
                # what a job can use: the cgroup's limit in a limited container
                "memory": {"total_gb": s.usable_gb, "available_gb": s.free_gb,
                           "limit_gb": s.memory_limit_gb if s.limited else None,
                           "machine_gb": s.memory_gb},
                "alerts": [a.as_json() for a in self.alerts(host)],
            })
        return {"hosts": out}
