"""What a host has cost so far, how long it has sat idle, and what autostop saves.

One remote execution (``templates/money/idle_probe.sh.j2``) tells since when the machine runs (the later
of the kernel's boot and PID 1's start: a container's start), the last sign of work (our journal,
job files), whether a job of ours runs or a GPU is busy now, and the autostop watchdog's state.

For the live views (``jobs``, ``watch``): ``idle_probe_script()`` is the same probe to run (or
include in a sampler), ``parse_probe`` reads its line, ``idle_since`` says since when the host
has been idle, and ``idle_warning`` is the line to show when it has been idle for longer than the
autostop period with no autostop set.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProvisionError
from ..remote.executor import Executor
from ..remote.templating import render
from .autostop import duration_text, parse_duration, persistent_dirs, state_text

DEFAULT_PERIOD = parse_duration("30m", "--idle")  # the idle period autostop suggests


@dataclass(frozen=True)
class Probe:
    now: float
    btime: float  # the kernel's boot
    pid1_start: float  # PID 1's start: a container's start
    boot_id: str
    journal_first: float | None  # our first recorded step on the host (bootstrap)
    journal_last: float | None
    jobs: tuple[str, ...]  # "NAME PID" of each job of ours that runs
    jobs_last: float | None  # newest file under ~/.gpu-provision/jobs (a job's last output)
    gpus: tuple[tuple[int | None, int | None], ...] | None  # (util %, MiB used); None: no GPU
    autostop_alive: bool
    autostop_config: dict[str, Any] = field(default_factory=dict)
    autostop_state: dict[str, Any] = field(default_factory=dict)
    gpu_error: str = ""  # the GPU check failed: idleness is not known from the GPUs

    @property
    def since(self) -> float:
        """When this run of the machine began: billing starts about then."""
        return max(self.btime, self.pid1_start)


def idle_probe_script() -> str:
    return render("money/idle_probe.sh.j2", persist_dirs=persistent_dirs())


def parse_probe(line: str) -> Probe:
    d = json.loads(line)
    gpus = d.get("gpus")
    return Probe(now=float(d["now"]), btime=float(d["btime"]), pid1_start=float(d["pid1_start"]),
                 boot_id=str(d["boot_id"]), journal_first=d.get("journal_first"),
                 journal_last=d.get("journal_last"),
                 jobs=tuple(x for x in str(d.get("jobs") or "").splitlines() if x.strip()),
                 jobs_last=d.get("jobs_last"),
                 gpus=None if gpus is None else tuple((g[0], g[1]) for g in gpus),
                 autostop_alive=bool(d["autostop"]["alive"]),
                 autostop_config=d["autostop"].get("config") or {},
                 autostop_state=d["autostop"].get("state") or {},
                 gpu_error=str(d.get("gpu_error") or ""))


def probe(ex: Executor) -> Probe:
    return ex.query("cost", idle_probe_script(), lambda out: parse_probe(out.strip().splitlines()[-1]),
                    what="the cost probe", any_exit=True, fix="the host needs bash and coreutils",
                    reads_only=True)


def busy_now(p: Probe, util_max: int | None = None, mem_max_mib: int | None = None) -> str | None:
    """Why the host is busy now (a job, a GPU, what the watchdog last saw), or None when it is
    idle. The thresholds are the watchdog's where one is set (else 5% and 512 MiB)."""
    cfg = p.autostop_config if p.autostop_alive else {}
    util_max = util_max if util_max is not None else int(cfg.get("util_max", 5))
    mem_max_mib = mem_max_mib if mem_max_mib is not None else int(cfg.get("mem_max_mib", 512))
    if p.jobs:
        return f"job {p.jobs[0].split()[0]} runs"
    if p.autostop_alive and p.autostop_state.get("busy"):
        return str(p.autostop_state["busy"])
    for i, (util, mem) in enumerate(p.gpus or ()):
        if util is not None and util > util_max:
            return f"GPU {i} is {util}% busy"
        if mem is not None and mem > mem_max_mib:
            return f"GPU {i} holds {mem} MiB"
    return None


def idle_since(p: Probe) -> float | None:
    """Since when the host has been idle (None: busy now): the latest of its start, our last
    step, a job's last output, and the watchdog's last busy sample."""
    if busy_now(p) is not None or (p.gpu_error and not p.autostop_alive):
        return None  # busy, or not known (a GPU check that fails tells nothing)
    marks = [p.since, p.journal_last or 0, p.jobs_last or 0]
    if p.autostop_alive and p.autostop_state.get("last_active"):
        marks.append(float(p.autostop_state["last_active"]))
    return min(max(marks), p.now)


def idle_warning(host: str, idle_seconds: float | None, autostop_set: bool,
                 price_per_hour: float | None, currency: str | None,
                 period: float = DEFAULT_PERIOD) -> str | None:
    """The warning ``jobs``/``watch``/``cost`` show when a host has sat idle longer than the
    autostop period with no autostop set; None otherwise."""
    if autostop_set or idle_seconds is None or idle_seconds <= period:
        return None
    spent = (f": {_money(price_per_hour * idle_seconds / 3600, currency)} paid for an idle "
             "machine so far" if price_per_hour else "")
    return (f"{host}: idle for {duration_text(idle_seconds)} with no autostop set{spent}; "
            f"`gpu-provision -H {host} autostop --idle {duration_text(period)}` stops it next "
            "time")


def _money(value: float | None, currency: str | None) -> str:
    return "-" if value is None else f"{value:.2f} {currency or ''}".strip()


def row(host: str, price: float | None, currency: str | None, p: Probe) -> dict[str, Any]:
    """One host's line of ``cost`` (also its JSON)."""
    hours = max(0.0, (p.now - p.since) / 3600)
    idle_from = idle_since(p)
    idle_s = None if idle_from is None else p.now - idle_from
    cfg, state = p.autostop_config, p.autostop_state
    set_ = bool(cfg) and p.autostop_alive and not state.get("fired_at") \
        and not state.get("dead") and not state.get("gave_up")
    autostop: dict[str, Any] = {"set": set_}
    failure = state.get("last_failure") or ""
    if set_:
        period = float(cfg.get("idle") or 0)
        idle_for = float(state.get("idle_for") or 0)
        left = max(0.0, period - idle_for) if not state.get("busy") else None
        # a saving is promised only where the action is known to end the bill (clouds.py)
        ends = cfg.get("billing_ends", True)
        saves = price if ends is True else None
        autostop.update(idle=period, action=cfg.get("action"), stops_in=left,
                        saves_per_hour=saves, still_billed=cfg.get("bills"))
        text = (f"{cfg.get('action')} after {cfg.get('idle_text')} idle"
                + (f", in {duration_text(left)}" if left is not None else
                   f" (busy: {state.get('busy')})"))
        if state.get("held") and state["held"] != "nothing to stop":
            text += f"; did not fire: {state['held']}"
        if state.get("spend"):
            text += f"; max_spend: {state['spend']}"
        if price and ends is True:
            text += f"; then saves {_money(price, currency)}/h"
        elif price:
            text += (f"; saves {_money(price, currency)}/h only if the provider stops billing a "
                     "powered-off machine (not known here)")
    elif cfg and (state.get("fired_at") or state.get("dead") or state.get("gave_up")):
        text = state_text(state, p.autostop_alive, cfg)
    else:
        text = "not set" + (f": each idle hour costs {_money(price, currency)}" if price else "")
    if failure:
        autostop["last_failure"] = failure
        text += f"; last failure: {failure}"
    warning = idle_warning(host, idle_s, set_, price, currency,
                           float(cfg.get("idle") or DEFAULT_PERIOD))
    return {
        "host": host, "price_per_hour": price, "currency": currency,
        "since": p.since, "since_text": time.strftime("%Y-%m-%d %H:%M", time.localtime(p.since)),
        "hours": round(hours, 3), "cost": round(price * hours, 2) if price else None,
        "since_bootstrap_hours": round((p.now - p.journal_first) / 3600, 3)
        if p.journal_first else None,
        "boot_id": p.boot_id, "busy": busy_now(p), "idle_seconds": idle_s,
        "idle_cost": round(price * idle_s / 3600, 2) if price and idle_s else None,
        "autostop": autostop, "autostop_text": text,
        "price_text": _money(price, currency) if price else "no price_per_hour",
        "cost_text": _money(price * hours if price else None, currency),
        "idle_text": busy_now(p) or (f"idle {duration_text(idle_s)}" if idle_s is not None
                                     else f"not known: the GPU check fails ({p.gpu_error})"
                                     if p.gpu_error else "-"),
        "gpu_error": p.gpu_error or None,
        "warnings": [w for w in [warning, _failed(host, state)] if w],
    }


def _failed(host: str, state: dict[str, Any]) -> str | None:
    """The warning when the watchdog stopped trying: the machine bills on."""
    why = state.get("dead") or state.get("gave_up")
    return f"{host}: autostop will not stop this machine: {why}" if why else None


def price_of(settings: Any) -> tuple[float | None, str | None]:
    price = settings.get("price_per_hour")
    if price is not None and float(price) < 0:
        raise ProvisionError(f"price_per_hour {price}: a price cannot be negative")
    return (float(price) if price is not None else None), settings.get("currency")
