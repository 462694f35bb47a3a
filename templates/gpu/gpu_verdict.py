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

import os
import re
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_names  # noqa: E402
import gpu_verdict_health as health  # noqa: E402
import gpu_verdict_multi as multi  # noqa: E402
import gpu_verdict_speed as speed  # noqa: E402
import gpu_verdict_sustained as sustained  # noqa: E402

Check = Callable[..., None]
BUSY_MIB = 512  # memory in use before we started above this: someone else is on the GPU
# the primitives the speed rules define, named here too (callers and recorded tests use gv.*)
MEASUREMENT_ERROR, PCIE_LANE_GBS = speed.MEASUREMENT_ERROR, speed.PCIE_LANE_GBS
H2D_OF_LINK = speed.H2D_OF_LINK
MIG_NAME, num, mig_share = speed.MIG_NAME, speed.num, speed.mig_share


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


def claim_matches(claim: str, name: str, memory_mib: float | None = None) -> bool:
    """An advertised "L4" is the L4 and not the L40, "H100 SXM" the "NVIDIA H100 80GB HBM3"
    (gpu_names.py: model, form factor and memory as listings write them)."""
    return gpu_names.matches(claim, name, memory_mib)[0]


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
            health.judge_caps(m, check)
            sustained.judge_sustained(m, cfg.get("reference") or {}, check,
                                      lambda g: mig_share(g, _ref_of(cfg, m, g)) or 1.0,
                                      float(th["min_tflops_ratio"]))
    health.judge_health(m, check)
    return checks


def _ref_of(cfg: dict[str, Any], m: dict[str, Any], g: dict[str, Any]) -> dict[str, Any] | None:
    refs = cfg.get("reference") or {}
    row = smi_row(m, g)
    return refs.get(str(row.get("name") or g.get("name"))) or \
        refs.get(MIG_NAME.split(str(g.get("name")))[0].strip())


def _mig(m: dict[str, Any]) -> list[dict[str, Any]]:
    return list((m.get("smi") or {}).get("mig") or [])


def visible_count(visible: str, total: int) -> int:
    """The GPUs CUDA_VISIBLE_DEVICES shows: CUDA reads the entries in order and stops at the
    first invalid one ("0,2,-1,1" shows two; CUDA C++ Programming Guide, "CUDA Environment
    Variables")."""
    n = 0
    for item in (x.strip() for x in visible.split(",")):
        if (item.isdigit() and int(item) < max(total, 1)) or item.startswith(("GPU-", "MIG-")):
            n += 1
        else:
            break
    return n


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
        n_visible = visible_count(visible, len(rows))
        want = min(want, n_visible)
        said += f"; CUDA_VISIBLE_DEVICES={visible} shows this process {n_visible}"
    expected = int(cfg.get("expected_gpus") or 0)
    ok = count == want and len(rows) == expected
    if len(rows) != expected:
        said += f", at provisioning {expected}"
    check("gpu count", "pass" if ok else "fail", said)


def _judge_gpus(m: dict[str, Any], cfg: dict[str, Any], th: dict[str, Any], check: Check) -> None:
    t = m.get("torch") or {}
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
        row = smi_row(m, g)
        if g.get("error"):
            mode = str(row.get("compute_mode") or "")
            check(f"gpu {i} matmul", "fail", str(g["error"]) + (
                "; its compute mode is Prohibited: no process may use it (nvidia-smi -c DEFAULT, "
                "root)" if mode.lower() == "prohibited" else ""))
            continue
        speed.judge_correctness(g, check)
        ref = refs.get(str(row.get("name") or name)) or refs.get(MIG_NAME.split(name)[0].strip())
        speed.judge_speed(g, ref, th, check)
        speed.judge_memory(g, ref, th, check)
        speed.judge_h2d(g, row, th, check)
    _judge_busy(m, check)
    if cfg.get("advertised"):
        _judge_claim(m, cfg["advertised"], check)


def _judge_claim(m: dict[str, Any], claim: dict[str, Any], check: Check) -> None:
    """The GPUs against the advertised one, named as listings name them (gpu_names.py)."""
    rows = (m.get("smi") or {}).get("gpus") or []
    seen = [(str(x.get("name")), num(x.get("memory.total"))) for x in rows] or \
        [(str(g["name"]), (g.get("memory_gb") or 0) * 1e9 / 2 ** 20 or None) for g in m.get("gpus") or []]
    names = [n for n, _ in seen]
    verdicts = [gpu_names.matches(claim["model"], n, mib) for n, mib in seen]
    match = [n for n, (ok, _) in zip(names, verdicts) if ok]
    want = int(claim.get("count") or 1)
    if len(match) >= want and len(match) == len(names):
        check("advertised gpu", "pass", f"{claim['model']} x{want} advertised, "
              f"{len(match)} seen ({', '.join(sorted(set(names)))})")
        return
    why = sorted({w for ok, w in verdicts if not ok and w})
    check("advertised gpu", "fail", f"{claim['model']} x{want} was advertised, the host "
          f"has {len(names)}: {', '.join(names) or 'none'}" + (f" ({'; '.join(why)})" if why else ""))


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
