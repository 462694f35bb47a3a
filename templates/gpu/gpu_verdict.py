"""gpu-provision validation, the verdict rules: pure functions of the measurements
(validate_gpu.py's ``measure``) and the provisioner's config, so a recorded measurement file is
judged again anywhere (the provisioner's tests do). Runs on the host beside validate_gpu.py
(Python 3.8+, standard library only).

``report(m, cfg)`` -> {"schema": 3, "verdict": "PASS"|"WARN"|"FAIL", "mode", "torch", "cuda",
"checks": [{"name", "status": "pass"|"warn"|"fail", "reason", "env"?}], "devices",
"measurements", "seconds"}. A check's "env" is the one setting that fixed a known trap, which
`gpu-provision run` applies to the jobs it starts on the host (provision/jobs/spec.py).
"""

from __future__ import annotations

import re
from typing import Any, Callable

import gpu_verdict_multi as multi

Check = Callable[..., None]
BUSY_MIB = 512  # memory in use before we started above this: someone else is on the GPU
# measured/peak above this: the timing missed the work, not a fast card. GeForce cards boost past
# the clock their datasheet peak assumes: healthy RTX 5090s are published at 1.16x theirs
# (zzc0721/torch-performance-test-data, 242.18 bf16 against 209.5), so "about 1.15" is 1.25 here
MEASUREMENT_ERROR = 1.25
# PCIe, per lane and direction, GB/s after line coding (PCI-SIG: 2.5/5/8/16/32/64 GT/s)
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
H2D_OF_LINK = 0.75  # pinned host-to-device copies reach about 3/4 of the link (nvbandwidth, bandwidthTest)
MIG_NAME = re.compile(r"\bMIG\s+(?:\d+c\.)?(\d+)g\.(\d+)gb\b", re.IGNORECASE)


def num(value: Any) -> float | None:
    """A number nvidia-smi printed, or None: "[N/A]", "[Not Supported]", "N/A", "" are unknown,
    never 0 (an idle link or a card without the sensor is not a zero)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(?:[A-Za-z%]+)?\s*", str(value or ""))
    return float(m.group(1)) if m else None


def has_kernels(arches: list[str], capability: str) -> bool:
    """sm_X.Y runs a build for sm_X.Z when Z <= Y (PTX is not counted)."""
    major, minor = (int(x) for x in capability.split("."))
    for arch in arches:
        m = re.fullmatch(rf"sm_{major}(\d)a?", arch)
        if m and int(m.group(1)) <= minor:
            return True
    return False


def ranges(indexes: list[int]) -> str:
    """[0, 1, 2, 4, 5, 6, 7] -> "0-2, 4-7"."""
    out: list[str] = []
    for i in sorted(indexes):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = out[-1].split("-")[0] + f"-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


def _norm(name: str) -> list[str]:
    """Whole tokens of a GPU name: "NVIDIA A100-SXM4-80GB" -> ["a100", "sxm4", "80gb"]."""
    return [t for t in re.split(r"[\s_\-]+", name.lower()) if t and t not in ("nvidia", "geforce",
                                                                               "tesla")]


def claim_matches(claim: str, name: str) -> bool:
    """An advertised "L4" is the L4 and not the L40: every word of the claim is a whole word
    of the name."""
    have = _norm(name)
    return all(t in have for t in _norm(claim))


def smi_row(m: dict[str, Any], g: dict[str, Any]) -> dict[str, Any]:
    """nvidia-smi's row of the GPU torch calls ``g``: by UUID (torch orders GPUs fastest first
    and honours CUDA_VISIBLE_DEVICES, nvidia-smi by PCI bus), by index only in files recorded
    before UUIDs were."""
    rows = (m.get("smi") or {}).get("gpus") or []
    uuid = g.get("uuid")
    if uuid:
        return next((r for r in rows if r.get("uuid") == uuid or r.get("uuid") == g.get("parent_uuid")), {})
    return next((r for r in rows if str(r.get("index")) == str(g.get("index"))), {})


def judge(m: dict[str, Any], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []

    def check(name: str, status: str, reason: str, env: dict[str, str] | None = None) -> None:
        checks.append({"name": name, "status": status, "reason": reason, **({"env": env} if env else {})})

    th = {"min_tflops_ratio": 0.5, "min_bandwidth_ratio": 0.5, **(cfg.get("thresholds") or {})}
    expected = int(cfg.get("expected_gpus") or 0)
    t = m.get("torch") or {}
    smi = m.get("smi") or {}
    if expected:
        if smi.get("error"):
            check("driver", "fail", f"nvidia-smi failed: {str(smi['error']).splitlines()[0]}")
        else:
            names = ", ".join(sorted({str(g.get("name")) for g in smi.get("gpus") or []})) or "none"
            check("driver", "pass" if smi.get("gpus") else "fail",
                  f"nvidia-smi answers: {len(smi.get('gpus') or [])} GPU(s) ({names})")
    if t.get("error") or not t.get("version"):
        check("torch import", "fail", f"import torch failed: {t.get('error')}")
    else:
        check("torch import", "pass", f"torch {t['version']} (CUDA {t.get('cuda')})")
        if not expected:
            ok = t.get("cpu_matmul_ok")
            check("cpu matmul", "pass" if ok else "fail",
                  f"256x256 matmul {'matches' if ok else 'differs from'} float64; CPU "
                  f"{m.get('cpu_gflops')} GFLOPS")
            check("cuda build", "pass" if t.get("cuda") is None else "warn",
                  "CPU build on a host without an NVIDIA GPU" if t.get("cuda") is None else
                  "a CUDA build on a host without a GPU (larger, and no use here)")
        elif t.get("cuda") is None:
            check("cuda build", "fail", "Torch not compiled with CUDA enabled: the CPU wheel is "
                  "installed on a GPU host")
        elif m.get("libcuda") is False:
            check("cuda available", "fail", "no libcuda.so.1 on this host: the NVIDIA driver's "
                  "user-space library is missing, so CUDA cannot start")
        elif not t.get("available"):
            check("cuda available", "fail", multi.cuda_failure(m))
        else:
            check("cuda available", "pass", "torch.cuda.is_available()")
            _judge_gpus(m, cfg, th, check)
    _judge_health(m, check)
    return checks


def _mig(m: dict[str, Any]) -> list[dict[str, Any]]:
    return list((m.get("smi") or {}).get("mig") or [])


def _judge_count(m: dict[str, Any], cfg: dict[str, Any], check: Check) -> None:
    """torch's count against what this process can see: every GPU nvidia-smi lists (less those
    CUDA_VISIBLE_DEVICES hides), and ONE MIG instance however many exist (the MIG user guide,
    "CUDA Device Enumeration": a CUDA process enumerates a single MIG device)."""
    t, smi = m.get("torch") or {}, m.get("smi") or {}
    rows = smi.get("gpus") or []
    count = int(t.get("device_count", len(m.get("gpus") or [])))
    visible = (m.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    mig_parents = {str(x.get("gpu")) for x in _mig(m)}
    whole = [r for r in rows if str(r.get("index")) not in mig_parents]
    want = len(whole) + (1 if mig_parents else 0)
    said = f"torch sees {count} GPU(s), nvidia-smi {len(rows)}"
    if mig_parents:
        said += (f" ({len(whole)} whole GPU(s) and {len(_mig(m))} MIG instance(s) on GPU "
                 f"{', '.join(sorted(mig_parents))}, of which a process uses one)")
    if visible is not None:
        n_visible = len([x for x in visible.split(",") if x.strip() and not x.strip().startswith("-")])
        want = min(want, n_visible)
        said += f"; CUDA_VISIBLE_DEVICES={visible} shows this process {n_visible}"
    expected = int(cfg.get("expected_gpus") or 0)
    ok = count == want and len(rows) == expected
    if len(rows) != expected:
        said += f", at provisioning {expected}"
    check("gpu count", "pass" if ok else "fail", said)


def _judge_gpus(m: dict[str, Any], cfg: dict[str, Any], th: dict[str, Any], check: Check) -> None:
    t, smi = m.get("torch") or {}, m.get("smi") or {}
    if m.get("multi"):
        multi.judge_multi(m, th, check)  # first: its fix matters more than one GPU's speed
    _judge_count(m, cfg, check)
    refs = cfg.get("reference") or {}
    for g in m.get("gpus") or []:
        i, name = g["index"], g["name"]
        if not has_kernels(t.get("arch_list") or [], g["capability"]):
            check(f"gpu {i} kernels", "fail", f"{name} is sm_{g['capability'].replace('.', '')}; "
                  f"the wheel has {' '.join(t.get('arch_list') or [])}")
            continue
        if g.get("error"):
            check(f"gpu {i} matmul", "fail", str(g["error"]))
            continue
        ok = g.get("matmul_ok")
        check(f"gpu {i} matmul", "pass" if ok else "fail",
              "matches the CPU result" if ok else "differs from the CPU result")
        row = smi_row(m, g)
        ref = refs.get(str(row.get("name") or name)) or refs.get(MIG_NAME.split(name)[0].strip())
        _judge_speed(g, ref, row, th, check)
        _judge_memory(g, ref, th, check)
        _judge_h2d(g, row, th, check)
    _judge_busy(m, check)
    claim = cfg.get("advertised")
    if claim:
        names = [str(x.get("name")) for x in smi.get("gpus") or []] or \
            [g["name"] for g in m.get("gpus") or []]
        match = [n for n in names if claim_matches(claim["model"], n)]
        want = int(claim.get("count") or 1)
        if len(match) >= want and len(match) == len(names):
            check("advertised gpu", "pass", f"{claim['model']} x{want} advertised, "
                  f"{len(match)} seen ({', '.join(sorted(set(names)))})")
        else:
            check("advertised gpu", "fail", f"{claim['model']} x{want} was advertised, the host "
                  f"has {len(names)}: {', '.join(names) or 'none'}")


def mig_share(g: dict[str, Any], ref: dict[str, Any] | None) -> float | None:
    """The share of the whole GPU a MIG instance has: its SMs over the GPU's (torch reads the
    instance's multiprocessor count), else its compute slices over 7."""
    m = MIG_NAME.search(str(g.get("name") or ""))
    if not m:
        return None
    if g.get("sms") and ref and ref.get("sms"):
        return float(g["sms"]) / float(ref["sms"])
    return int(m.group(1)) / 7.0


def _clocks(g: dict[str, Any]) -> str:
    load = g.get("under_load") or {}
    if not load:
        return ""
    parts = [f"under load: SM clock {load.get('clocks.sm', '?')}/{load.get('clocks.max.sm', '?')} MHz"]
    if num(load.get("power.draw")) is not None:
        parts.append(f"power {load.get('power.draw')}/{load.get('power.limit', '?')} W")
    elif num(load.get("power.limit")) is not None:
        parts.append(f"power limit {load.get('power.limit')} W")
    if num(load.get("temperature.gpu")) is not None:
        parts.append(f"{load.get('temperature.gpu')} C")
    if load.get("reasons"):
        parts.append("clocks held by " + ", ".join(load["reasons"]))
    return "; " + ", ".join(parts)


def _judge_speed(g: dict[str, Any], ref: dict[str, Any] | None, row: dict[str, Any],
                 th: dict[str, Any], check: Check) -> None:
    i, name = g["index"], g["name"]
    got = {k: v for k, v in (g.get("tflops") or {}).items() if v is not None}
    notes = "; ".join(g.get("notes") or [])
    if not ref or not any((ref.get("peak") or {}).values()):
        measured = ", ".join(f"{k} {v}" for k, v in got.items()) or "nothing"
        check(f"gpu {i} speed", "pass", f"{name}: {measured} TFLOPS; no reference figures for this "
              f"model to compare with{_clocks(g)}" + (f" ({notes})" if notes else ""))
        return
    share = mig_share(g, ref)
    scale = share or 1.0
    parts, slow, wrong = [], [], []
    for dtype, value in got.items():
        peak = (ref.get("peak") or {}).get(dtype)
        if not peak:
            continue
        peak *= scale
        floor = (ref.get("floor") or {}).get(dtype)
        if floor:  # from the model's published sustained figure
            floor *= scale
            parts.append(f"{dtype} {value} (floor {floor:.1f} of peak {peak:.1f})")
        else:
            floor = th["min_tflops_ratio"] * peak
            parts.append(f"{dtype} {value} (floor {floor:.1f} = {th['min_tflops_ratio']} x peak {peak:.1f})")
        if value > MEASUREMENT_ERROR * peak:
            wrong.append(f"{dtype} {value} is {value / peak:.2f}x the datasheet peak")
        elif value < floor:
            slow.append(dtype)
    what = f"{name}" + (f", a MIG instance with {scale:.2f} of the GPU" if share else "")
    if wrong:
        check(f"gpu {i} speed", "warn", f"{what}: {'; '.join(wrong)}: a measurement error (the "
              f"timing did not cover the work), not a faster card ({'; '.join(parts)})")
    elif slow:
        check(f"gpu {i} speed", "warn", f"{what}: {', '.join(slow)} below the healthy floor for "
              f"this model: throttled, power-capped, shared or not the card it claims to be "
              f"({'; '.join(parts)}){_clocks(g)}")
    else:
        check(f"gpu {i} speed", "pass", f"{what}: every figure at or above the healthy floor "
              f"({'; '.join(parts)}){_clocks(g)}")


def _judge_memory(g: dict[str, Any], ref: dict[str, Any] | None, th: dict[str, Any],
                  check: Check) -> None:
    got, want = g.get("mem_gbs"), (ref or {}).get("mem_gbs")
    if got is None or not want:
        return
    share = mig_share(g, ref) or 1.0
    want *= share
    ratio = got / want
    status = "warn" if ratio < th["min_bandwidth_ratio"] or ratio > MEASUREMENT_ERROR else "pass"
    why = "" if status == "pass" else ("; a measurement error" if ratio > MEASUREMENT_ERROR else
                                       "; slower memory than this model has")
    check(f"gpu {g['index']} memory bandwidth", status,
          f"device copy {got} GB/s of the datasheet's {want:.0f} ({ratio:.2f}){why}")


def _judge_h2d(g: dict[str, Any], row: dict[str, Any], th: dict[str, Any], check: Check) -> None:
    """Host-to-device against the link the GPU has under load (PCIe drops to gen 1 at idle),
    and that link against the GPU's own maximum."""
    got = g.get("h2d_gbs")
    if got is None:
        return
    link = g.get("link") or {}
    gen, width = num(link.get("pcie.link.gen.current")), num(link.get("pcie.link.width.current"))
    top_gen = num(link.get("pcie.link.gen.max") or row.get("pcie.link.gen.max"))
    top_width = num(link.get("pcie.link.width.max") or row.get("pcie.link.width.max"))
    if not gen or not width:
        check(f"gpu {g['index']} bandwidth", "pass", f"host-to-device {got} GB/s (the link's "
              "generation and width are unknown here, so not judged)")
        return
    want = PCIE_LANE_GBS.get(int(gen), 0.0) * width * H2D_OF_LINK
    said = f"host-to-device {got} GB/s on PCIe gen {gen:g} x{width:g} (about {want:.0f} expected)"
    narrow = bool(top_gen and top_width and (gen < top_gen or width < top_width))
    low = want > 0 and got < th["min_bandwidth_ratio"] * want
    if narrow:
        said += (f"; the GPU can do gen {top_gen:g} x{top_width:g}: the slot, riser or BIOS gives "
                 "it less")
    if low:
        said += "; slow even for this link (pinned memory throttled, or the link retrains)"
    check(f"gpu {g['index']} bandwidth", "warn" if narrow or low else "pass", said)


def _judge_busy(m: dict[str, Any], check: Check) -> None:
    """Who used which GPU before we started, by index, and the free ones to run on instead."""
    smi = m.get("smi") or {}
    rows = smi.get("gpus") or []
    procs = smi.get("processes") or []
    busy: dict[str, list[str]] = {}
    for r in rows:
        used = num(r.get("memory.used"))
        mine = [p for p in procs if p.get("gpu_uuid") and p.get("gpu_uuid") == r.get("uuid")]
        if not mine and (used is None or used <= BUSY_MIB):
            continue
        held = sum(num(p.get("used_mib")) or 0.0 for p in mine) or used or 0.0
        who = ", ".join(f"pid {p.get('pid')} ({p.get('name')})" for p in mine[:3]) or "no process we can see"
        util = num(r.get("utilization.gpu"))
        busy[str(r.get("index"))] = [f"GPU {r.get('index')}: {held / 1024:.1f} GB held by {who}"
                                     + (f", {util:.0f}% busy" if util is not None else "")]
    orphans = [p for p in procs if not p.get("gpu_uuid")]
    if not busy and not orphans:
        check("gpu busy", "pass", "no other process and no memory in use before we started")
        return
    text = "; ".join(v[0] for v in busy.values())
    if orphans:
        text += ("; " if text else "") + "; ".join(f"pid {p.get('pid')} ({p.get('name')}, "
                                                    f"{p.get('used_mib')} MiB)" for p in orphans[:5])
    free = [int(r["index"]) for r in rows
            if str(r.get("index")) not in busy and str(r.get("index")).isdigit()]
    if free and busy:
        text += (f"; GPU{'s' if len(free) > 1 else ''} {ranges(free)} "
                 f"{'are' if len(free) > 1 else 'is'} free: run with --gpus {','.join(map(str, free))}")
    elif busy:
        text += "; no GPU is free (a shared or dirty instance)"
    check("gpu busy", "warn", text)


def _judge_health(m: dict[str, Any], check: Check) -> None:
    """ECC, remapped rows, retired pages and Xid lines, each from its own query; a field the
    driver does not know, or [N/A], is unknown and judges nothing."""
    h = m.get("health") or {}
    if not h:
        return
    bad: list[str] = []
    warn: list[str] = []
    unknown: list[str] = []
    for part, rows in (("ecc", h.get("ecc")), ("remapped rows", h.get("remapped")),
                       ("retired pages", h.get("retired"))):
        if not isinstance(rows, list):
            said = rows.get("error", "not read") if isinstance(rows, dict) else "not read"
            unknown.append(f"{part} ({said})")
            continue
        for r in rows:
            gpu = f"GPU {r.get('index', '?')}"
            if part == "ecc" and (num(r.get("ecc.errors.uncorrected.volatile.total")) or 0) > 0:
                bad.append(f"{gpu}: {r['ecc.errors.uncorrected.volatile.total']} uncorrected ECC "
                           "errors since boot")
            if part == "remapped rows":
                if str(r.get("remapped_rows.failure")).strip().lower() == "yes":
                    bad.append(f"{gpu}: row remapping failed (the memory needs service)")
                if str(r.get("remapped_rows.pending")).strip().lower() == "yes":
                    warn.append(f"{gpu}: a remapped row is pending: reset the GPU to apply it")
                if (num(r.get("remapped_rows.uncorrectable")) or 0) > 0:
                    warn.append(f"{gpu}: {r['remapped_rows.uncorrectable']} rows remapped after "
                                "uncorrectable errors")
            if part == "retired pages":
                if str(r.get("retired_pages.pending")).strip().lower() == "yes":
                    warn.append(f"{gpu}: a retired page is pending: reset the GPU to apply it")
                if (num(r.get("retired_pages.double_bit.count")) or 0) > 0:
                    warn.append(f"{gpu}: {r['retired_pages.double_bit.count']} pages retired "
                                "after double-bit errors")
    xid = h.get("xid") or {}
    lines = xid.get("lines") or []
    if lines:
        warn.append(f"{len(lines)} Xid line(s) in the kernel log, the last: {lines[-1][:200]}")
    elif xid.get("error"):
        unknown.append(f"Xid ({xid['error']})")
    tail = f" (unknown: {'; '.join(unknown)})" if unknown else ""
    if bad:
        check("gpu health", "fail", "; ".join(bad + warn) + tail)
    elif warn:
        check("gpu health", "warn", "; ".join(warn) + tail)
    else:
        check("gpu health", "pass", "no uncorrected ECC errors, failed or pending row remaps, "
              "retired pages or Xid lines" + tail)


def verdict(checks: list[dict[str, Any]]) -> str:
    statuses = {c["status"] for c in checks}
    return "FAIL" if "fail" in statuses else "WARN" if "warn" in statuses else "PASS"


def report(m: dict[str, Any], cfg: dict[str, Any], seconds: float = 0.0) -> dict[str, Any]:
    checks = judge(m, cfg)
    t = m.get("torch") or {}
    py = m.get("python") or {}
    return {"schema": 3, "verdict": verdict(checks), "mode": "gpu" if cfg.get("expected_gpus") else "cpu",
            "torch": t.get("version"), "cuda": t.get("cuda"), "checks": checks,
            # the interpreter it ran in (a venv's python runs the one it links to: "python_base")
            "python": py.get("executable"), "torch_file": t.get("file"),
            "python_base": py.get("real") if py.get("real") != py.get("executable") else None,
            "devices": [{k: g.get(k) for k in ("index", "name", "uuid", "capability", "memory_gb")}
                        for g in m.get("gpus") or []],
            "measurements": m, "seconds": round(seconds, 1)}
