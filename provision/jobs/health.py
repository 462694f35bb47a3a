"""The GPUs' health through a job: the snapshots templates/jobs/_health.sh.j2 prints (as a job
starts and ends, in `jobs`, in each watch sample) parsed, and what changed between two of them:
new Xid events of our GPUs (by PCI address, classified by NVIDIA's catalog), new ECC errors, rows
pending a remap, a power limit the host changed. Pure: text in, lines out.

The Xid lines are read by the validation payload's own rule (templates/gpu/xid.py, loaded from
the shipped templates), so the host's validation and the laptop read an Xid line alike.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from ..config.shipped import templates_dir
from .state import HostJobs


@cache
def xid_rules() -> ModuleType:
    """templates/gpu/xid.py (standard library only, written to run anywhere), as a module."""
    source = (templates_dir() / "gpu" / "xid.py").read_text()
    module = ModuleType("gpu_provision_xid")
    exec(compile(source, "templates/gpu/xid.py", "exec"), module.__dict__)  # noqa: S102 - our shipped file
    return module


def _num(cell: str | None) -> float | None:
    try:
        return float(str(cell).strip())
    except (TypeError, ValueError):
        return None


def _text(value: Any) -> str:
    try:
        return base64.b64decode(str(value or "")).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return ""


@dataclass(frozen=True)
class GpuHealth:
    index: str
    bus: str
    ecc_uncorrected: float | None = None
    ecc_corrected: float | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remap_uncorrectable: float | None = None
    power_limit: float | None = None
    power_default: float | None = None
    # microseconds each clock-event reason has held the clocks down since the driver loaded
    held_us: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Snapshot:
    t: float
    uptime: float
    gpus: tuple[GpuHealth, ...]
    xid: tuple[dict[str, Any], ...]  # our GPUs' events, each with "gpu" (nvidia-smi's index)
    dmesg: bool  # the kernel log was readable
    others: int = 0  # Xid lines of GPUs that are not ours
    # every Xid event read, scoped or not: a GPU that fell off the bus is no longer in this
    # snapshot's nvidia-smi rows, and its events are found by the job's start (new_xid)
    events: tuple[dict[str, Any], ...] = ()
    smi_rc: int | None = None  # nvidia-smi's exit status (None: an older snapshot's)
    lost: tuple[str, ...] = ()  # the PCI addresses nvidia-smi said it lost ("device handle")

    def when(self, event: dict[str, Any]) -> str:
        """When an event was logged: from dmesg's seconds since boot and this snapshot's clocks,
        else the time in the line's own stamp (dmesg -T, syslog)."""
        up = event.get("uptime")
        if up is not None and self.uptime:
            return time.strftime("%H:%M", time.localtime(self.t - self.uptime + float(up)))
        m = re.search(r"\b(\d\d:\d\d):\d\d\b", str(event.get("stamp") or ""))
        return m.group(1) if m else ""


# the clock-event reasons, as NVML names what each means (nvmlClocksEventReasons)
HELD = {"sw_power_cap": "clocks held at the power limit (sw_power_cap)",
        "sw_thermal_slowdown": "thermal slowdown by the driver (sw_thermal_slowdown)",
        "hw_thermal_slowdown": "hardware thermal slowdown (hw_thermal_slowdown)",
        "hw_power_brake_slowdown": "hardware power brake, the power supply's signal "
                                   "(hw_power_brake_slowdown)"}


def parse_snapshot(text: str | None) -> Snapshot | None:
    """One snapshot line; None for an empty or broken one (it never raises)."""
    try:
        doc = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(doc, dict) or "t" not in doc:
        return None
    fields = str(doc.get("fields") or "").split(",")
    gpus = []
    for line in _text(doc.get("gpus")).splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            continue
        r = dict(zip(fields, cells, strict=True))

        def yes(key: str, row: dict[str, str] = r) -> bool | None:
            v = row.get(key, "").lower()
            return True if v == "yes" else False if v == "no" else None
        gpus.append(GpuHealth(index=r.get("index", "?"), bus=r.get("pci.bus_id", ""),
                              ecc_uncorrected=_num(r.get("ecc.errors.uncorrected.volatile.total")),
                              ecc_corrected=_num(r.get("ecc.errors.corrected.volatile.total")),
                              remap_pending=yes("remapped_rows.pending"),
                              remap_failure=yes("remapped_rows.failure"),
                              remap_uncorrectable=_num(r.get("remapped_rows.uncorrectable")),
                              power_limit=_num(r.get("enforced.power.limit")),
                              power_default=_num(r.get("power.default_limit")),
                              held_us=tuple((k.rsplit(".", 1)[1], v) for k in r
                                            if k.startswith("clocks_event_reasons_counters.")
                                            and (v := _num(r[k])) is not None)))
    rules = xid_rules()
    events = rules.parse(_text(doc.get("xid")))
    mine, others = rules.scoped(events, {g.bus: g.index for g in gpus})
    return Snapshot(t=float(doc.get("t") or 0), uptime=_num(doc.get("uptime")) or 0.0, gpus=tuple(gpus),
                    xid=tuple(mine), dmesg=bool(doc.get("dmesg")), others=others,
                    events=tuple(events),
                    smi_rc=doc["smi_rc"] if isinstance(doc.get("smi_rc"), int) else None,
                    lost=tuple(k for m in LOST.finditer(_text(doc.get("gpus")))
                               if (k := _pci(m.group(1)))))


def new_xid(start: Snapshot, end: Snapshot) -> list[dict[str, Any]]:
    """The Xid events of the job's GPUs in ``end`` that ``start`` did not have (the same line is
    the same event). The job's GPUs are those of either snapshot: one that fell off the bus
    (Xid 79) is missing from the end's nvidia-smi rows, and its events are the ones that matter."""
    seen = {e["line"] for e in (start.events or start.xid)}  # whoever's: they were there
    buses = {g.bus: g.index for g in (*start.gpus, *end.gpus)}
    mine, _ = xid_rules().scoped(list(end.events) if end.events else list(end.xid), buses)
    return [e for e in mine if e["line"] not in seen]


def diff(start: Snapshot | None, end: Snapshot | None) -> list[str]:
    """What changed on our GPUs from ``start`` to ``end``, one line per GPU and kind:
    "GPU 3: 2 new Xid 79 (fell off the bus) at 14:02"."""
    if start is None or end is None:
        return []
    out: list[str] = []
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for e in new_xid(start, end):
        groups.setdefault((str(e.get("gpu")), int(e["code"])), []).append(e)
    for (gpu, code), events in sorted(groups.items()):
        c = events[0]
        at = end.when(c)
        out.append(f"GPU {gpu}: {len(events)} new Xid {code} ({c['what']}; {c['class']})"
                   + (f" at {at}" if at else ""))
    before = {g.index: g for g in start.gpus}
    for g in end.gpus:
        b = before.get(g.index)
        if b is None:
            continue
        more = (g.ecc_uncorrected or 0) - (b.ecc_uncorrected or 0)
        if g.ecc_uncorrected is not None and b.ecc_uncorrected is not None and more > 0:
            out.append(f"GPU {g.index}: {more:g} new uncorrected ECC error(s)")
        if g.remap_failure and not b.remap_failure:
            out.append(f"GPU {g.index}: row remapping failed (the memory needs service)")
        if g.remap_pending and not b.remap_pending:
            out.append(f"GPU {g.index}: a row remap is now pending (a GPU reset applies it)")
        was = dict(b.held_us)
        for reason, us in g.held_us:
            held = (us - was.get(reason, us)) / 1e6
            if held >= 1:
                out.append(f"GPU {g.index}: {held:.0f} s of {HELD.get(reason, reason)} during the job")
        if g.power_limit and b.power_limit and g.power_limit != b.power_limit:
            out.append(f"GPU {g.index}: power limit {b.power_limit:g} -> {g.power_limit:g} W during the job"
                       + (" (below its default: the host lowered it)" if g.power_default
                          and g.power_limit < g.power_default else ""))
    out += _gone(start, end, {str(e.get("gpu")) for e in new_xid(start, end)
                              if int(e["code"]) == 79})
    if start.dmesg and not end.dmesg:
        out.append("the kernel log became unreadable: Xid events after that are unknown")
    return out


# "Unable to determine the device handle for GPU 0000:03:00.0: GPU is lost" (and the form
# without a space, "GPU0000:..."; tests/fixtures/nvidia-smi/fail-*device-handle*, fail-gpu-lost)
LOST = re.compile(r"device handle for GPU ?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")


# what an end snapshot without rows says, by nvidia-smi's exit status (nvidia-smi(1), RETURN
# VALUE: 15 GPU is lost, 9 the driver is not loaded, 17 the operating system blocked it)
NO_ANSWER = {124: "nvidia-smi did not answer within 10 s", 9: "nvidia-smi found no driver loaded",
             17: "nvidia-smi was refused access to the GPUs (a container that lost its devices: "
                 "restart it)"}


def _gone(start: Snapshot, end: Snapshot, fell: set[str]) -> list[str]:
    """The job's GPUs missing from the end, by PCI address. Gone where the end tells: a GPU
    lost (nvidia-smi exit 15), an Xid 79, or nvidia-smi answering for the others; when it
    answered for none for another reason, the GPUs' state at the end is unknown, said so."""
    there = {g.bus for g in end.gpus}
    missing = [g for g in start.gpus if g.bus not in there]
    if not missing:
        return []
    names = ", ".join(g.index for g in missing)
    if end.gpus or end.smi_rc is None:
        return [f"GPU {names}: no longer answer{'s' if len(missing) == 1 else ''} nvidia-smi"]
    # no rows at all: the GPUs nvidia-smi named lost, or with an Xid 79, are gone; of the
    # others nothing is known (nvidia-smi fails whole when one GPU is off the bus)
    lost = [g for g in missing if g.index in fell or (_pci(g.bus) or "?") in end.lost]
    out = [f"GPU {', '.join(g.index for g in lost)}: no longer answer"
           f"{'s' if len(lost) == 1 else ''} nvidia-smi (lost: off the bus)"] if lost else []
    rest = [g for g in missing if g not in lost]
    if rest:
        why = ("nvidia-smi failed whole (exit 15: a GPU is lost)" if end.smi_rc == 15 else
               NO_ANSWER.get(end.smi_rc or 0, f"nvidia-smi failed (exit {end.smi_rc})"))
        out.append(f"GPU {', '.join(g.index for g in rest)}: state at the end unknown: {why}")
    return out


def _pci(address: str) -> str | None:
    key = xid_rules().pci_key(address)
    return str(key) if key else None


def job_health(raw: tuple[str, str], now: str = "") -> list[str]:
    """A job's health lines: its start against its end, or against ``now`` while it runs."""
    start, end = raw
    return diff(parse_snapshot(start), parse_snapshot(end or now))


def health_notes(listed: Sequence[HostJobs]) -> dict[tuple[str, str], list[str]]:
    """Each job's health from its start to its end (a running one: to now), by (host, job)."""
    out: dict[tuple[str, str], list[str]] = {}
    for h in listed:
        for j in h.jobs:
            lines = job_health(j.health, h.health_now if j.running else "")
            if lines:
                out[(h.host, j.id)] = lines
    return out
