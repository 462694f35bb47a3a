"""gpu-provision validation, the verdict rules of the GPUs' health and of the caps the host set:
pure functions of the measurements (validate_gpu.py), beside gpu_verdict.py (Python 3.8+,
standard library only).

Health: ECC, remapped rows and retired pages, each from its own query (a field this driver does
not know, or [N/A], is unknown and judges nothing), and the kernel log's Xid lines of OUR GPUs,
classified by NVIDIA's catalog (xid.py): a hardware Xid whose immediate action is a GPU reset or
a reboot FAILS, another hardware or a driver Xid WARNS, an application's own fault (13, 31, 43,
45 ...) is said and passes.

Caps (nvidia-smi --help-query-gpu; what each costs the renter): the power limit the driver
enforces against the board's default and maximum (a host can lower it with `nvidia-smi -pl`, a
renter without root cannot raise it: under load the clocks drop until the draw fits), the
application clocks against their defaults, persistence mode (off: every new CUDA process and
nvidia-smi call waits while the driver initialises the GPU, 1-3 s each, NVIDIA's driver
persistence overview) and compute mode (Exclusive_Process: one process per GPU; Prohibited: none).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xid  # noqa: E402

Check = Callable[..., None]
POWER_CAPPED = 0.95  # an enforced limit below this share of the default is the host's cap


def _num(value: Any) -> float | None:
    try:
        return float(str(value).split()[0])
    except (TypeError, ValueError, IndexError):
        return None


def judge_health(m: dict[str, Any], check: Check) -> None:
    h = m.get("health") or {}
    if not h:
        return
    bad: list[str] = []
    warn: list[str] = []
    said: list[str] = []
    unknown: list[str] = []
    for part, rows in (("ecc", h.get("ecc")), ("remapped rows", h.get("remapped")),
                       ("retired pages", h.get("retired"))):
        if not isinstance(rows, list):
            why = rows.get("error", "not read") if isinstance(rows, dict) else "not read"
            unknown.append(f"{part} ({why})")
            continue
        for r in rows:
            _memory_health(part, r, bad, warn)
    xid = h.get("xid") or {}
    recovery = {str(r.get("index")): str(r.get("gpu_recovery_action") or "").strip()
                for r in h.get("recovery") or [] if isinstance(r, dict)} \
        if isinstance(h.get("recovery"), list) else {}
    _xid(xid, bad, warn, said, unknown, recovery)
    tail = (f" ({'; '.join(said)})" if said else "") + \
        (f" (unknown: {'; '.join(unknown)})" if unknown else "")
    # a PASS says what was read: on a host that lets us read nothing of it (a consumer card's
    # ECC "[N/A]", no row remapping, a container without dmesg) the health is not measured
    measured = (bool(xid) and "error" not in xid) or any(
        isinstance(rows, list) and any(_read(r) for r in rows)
        for rows in (h.get("ecc"), h.get("remapped"), h.get("retired")))
    if bad:
        check("gpu health", "fail", "; ".join(bad + warn) + tail)
    elif warn:
        check("gpu health", "warn", "; ".join(warn) + tail)
    elif not measured:
        check("gpu health", "warn", "not measured: this host lets us read none of ECC, row "
              "remapping, retired pages or the kernel's Xid lines" + tail)
    else:
        check("gpu health", "pass", "no uncorrected ECC errors, failed or pending row remaps, "
              "retired pages or hardware Xid errors on these GPUs" + tail)


def _read(row: dict[str, Any]) -> bool:
    """Whether nvidia-smi gave a value for any of a GPU's fields ("[N/A]", "[Not Supported]"
    are none)."""
    return any(k != "index" and (_num(v) is not None or str(v).strip().lower() in ("yes", "no"))
               for k, v in row.items())


def _memory_health(part: str, r: dict[str, Any], bad: list[str], warn: list[str]) -> None:
    gpu = f"GPU {r.get('index', '?')}"
    if part == "ecc" and (_num(r.get("ecc.errors.uncorrected.volatile.total")) or 0) > 0:
        bad.append(f"{gpu}: {r['ecc.errors.uncorrected.volatile.total']} uncorrected ECC errors since boot")
    if part == "remapped rows":
        if str(r.get("remapped_rows.failure")).strip().lower() == "yes":
            bad.append(f"{gpu}: row remapping failed (the memory needs service)")
        if str(r.get("remapped_rows.pending")).strip().lower() == "yes":
            warn.append(f"{gpu}: a remapped row is pending: reset the GPU to apply it")
        if (_num(r.get("remapped_rows.uncorrectable")) or 0) > 0:
            warn.append(f"{gpu}: {r['remapped_rows.uncorrectable']} rows remapped after uncorrectable errors")
    if part == "retired pages":
        if str(r.get("retired_pages.pending")).strip().lower() == "yes":
            warn.append(f"{gpu}: a retired page is pending: reset the GPU to apply it")
        if (_num(r.get("retired_pages.double_bit.count")) or 0) > 0:
            warn.append(f"{gpu}: {r['retired_pages.double_bit.count']} pages retired after double-bit errors")


def _xid(x: dict[str, Any], bad: list[str], warn: list[str], said: list[str], unknown: list[str],
         recovery: dict[str, str] | None = None) -> None:
    """``recovery``: each GPU's gpu_recovery_action now. A hardware Xid that needed a reset FAILS,
    unless its GPU says no action is pending now ("None": it was reset or recovered since; the
    line stays in the kernel log until the next boot): then it WARNS."""
    recovery = recovery or {}
    if x.get("error"):
        unknown.append(f"Xid ({x['error']})")
        return
    events = x.get("events")
    if events is None:  # a measurement from before the lines were scoped: every line, unscoped
        events = xid.parse("\n".join(x.get("lines") or []))
        if events:
            said.append("these Xid lines were not matched to our GPUs by PCI address")
    for kind in ("hardware", "driver", "unknown", "application"):
        mine = [e for e in events if e.get("class") == kind]
        if not mine:
            continue
        text = xid.says(mine) + f"; the last: {mine[-1].get('line', '')[:160]}"
        failing = [e for e in mine if kind == "hardware" and e.get("action") in xid.FAILS]
        cleared = [e for e in failing if recovery.get(str(e.get("gpu"))) == "None"]
        if failing and len(cleared) < len(failing):
            pending = sorted({f"GPU {e.get('gpu')}: {recovery[str(e.get('gpu'))]}" for e in failing
                              if recovery.get(str(e.get("gpu")), "None") != "None"
                              and not recovery[str(e.get("gpu"))].startswith("[")})
            bad.append(text + (f" (gpu_recovery_action now: {', '.join(pending)})" if pending else ""))
        elif failing:
            warn.append(text + " (logged earlier in this boot; the GPU now reports no recovery "
                        "action pending (gpu_recovery_action: None): it was reset or recovered "
                        "since; watch for it again)")
        elif kind == "application":
            said.append(text + " (the application's own fault, not the GPU's)")
        else:
            warn.append(text)
    if x.get("other_gpus"):
        said.append(f"{x['other_gpus']} Xid line(s) of GPUs that are not ours (another tenant's on "
                    "this machine) not counted")


def judge_caps(m: dict[str, Any], check: Check) -> None:
    """One check over every GPU's caps, each named with what it costs; absent where the caps
    were not read (an older measurement)."""
    caps = (m.get("smi") or {}).get("caps")
    if caps is None:
        return
    if isinstance(caps, dict):
        check("gpu caps", "pass", f"the caps could not be read ({caps.get('error')})")
        return
    warn: list[str] = []
    fail: list[str] = []
    said: list[str] = []
    for r in caps:
        gpu = f"GPU {r.get('index', '?')}"
        enforced = _num(r.get("enforced.power.limit")) or _num(r.get("power.limit"))
        default, top = _num(r.get("power.default_limit")), _num(r.get("power.max_limit"))
        if enforced and default and enforced < POWER_CAPPED * default:
            warn.append(f"{gpu}: power limited to {enforced:g} W of its default {default:g} W "
                        f"(max {top:g} W)" if top else f"{gpu}: power limited to {enforced:g} W of its "
                        f"default {default:g} W")
            warn[-1] += (f": the host lowered it (nvidia-smi -pl); under load the clocks drop until the "
                         f"draw fits, {1 - enforced / default:.0%} less power than the card is made for, "
                         "and only root on the host can raise it")
        elif enforced and default and enforced > default:
            said.append(f"{gpu}: power limit raised to {enforced:g} W above its default {default:g} W")
        app, app_default = _num(r.get("clocks.applications.graphics")), \
            _num(r.get("clocks.default_applications.graphics"))
        if app and app_default and app < app_default:
            warn.append(f"{gpu}: application clocks set to {app:g} MHz of the default {app_default:g} MHz: "
                        "kernels run no faster than that (nvidia-smi -rac, root, resets them)")
        mode = str(r.get("compute_mode") or "").strip()
        if mode.lower() == "prohibited":
            fail.append(f"{gpu}: compute mode Prohibited: no process may use this GPU "
                        "(nvidia-smi -c DEFAULT, root)")
        elif mode.lower() == "exclusive_process":
            said.append(f"{gpu}: compute mode Exclusive_Process (one process at a time)")
    persist = [str(r.get("index")) for r in caps
               if str(r.get("persistence_mode") or "").strip().lower() == "disabled"]
    if persist:
        said.append(f"persistence mode off on GPU {', '.join(persist)}: every new CUDA process and "
                    "nvidia-smi call waits 1-3 s while the driver initialises the GPU")
    at_default = sorted({f"{_num(r.get('power.default_limit')):g} W" for r in caps
                         if _num(r.get("power.default_limit")) and (_num(r.get("enforced.power.limit"))
                                                                    or _num(r.get("power.limit")))
                         == _num(r.get("power.default_limit"))})
    if not warn and not fail and at_default:
        said.insert(0, f"power limit at its default ({', '.join(at_default)})")
    tail = "; ".join(said)
    if fail:
        check("gpu caps", "fail", "; ".join(fail + warn) + (f"; {tail}" if tail else ""))
    elif warn:
        check("gpu caps", "warn", "; ".join(warn) + (f"; {tail}" if tail else ""))
    else:
        check("gpu caps", "pass", tail or "no caps set")
