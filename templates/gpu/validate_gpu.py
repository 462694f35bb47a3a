"""gpu-provision validation, the measuring half: runs on the host in the provisioned env
(Python 3.8+, torch only) and prints ONE line: the report of gpu_verdict.py (shipped beside it,
which holds every verdict rule) on what this file measured. About 10 s of load per GPU, and
on 2+ GPUs the NCCL all-reduce (one spawned process per GPU; bounded at 90 s, each further rung
of its ladder at 60 s); with "sustained_s" every GPU at once for that long (sustained.py).

Argument 1 is the JSON config the provisioner renders (the validate step journals the verdict
itself, templates/setup/validate.sh.j2):
  {"expected_gpus": int (what nvidia-smi showed the provisioner),
   "advertised": {"model": "RTX 4090", "count": 1} | null (the inventory's ``gpu:``),
   "thresholds": {"min_tflops_ratio", "min_bandwidth_ratio", "sustained_s"?},
   "reference": {<GPU name as nvidia-smi prints it>: {"peak": {dtype: dense TFLOPS},
                 "floor": {dtype: TFLOPS a healthy card sustains at least}, "mem_gbs", "sms",
                 "source"}},
   "data_dir": str | null}

The host's cores, memory and free disk are measured here ("measurements"."host") and judged
against the recipe's minimums by the provisioner (provision/config/minimums.py: one rule for the
plan, before anything is installed, and for this report).

How one GPU is measured is gpu_figures.py's docstring; here: GPUs are matched to nvidia-smi's
rows by UUID (CUDA_DEVICE_ORDER=PCI_BUS_ID and torch.cuda.get_device_properties(i).uuid,
torch >= 2.4, match nvidia-smi's ``uuid`` whatever CUDA_VISIBLE_DEVICES says); the multi-GPU
tier runs first, before this process opens a CUDA context, so a GPU in Exclusive_Process
compute mode is free for NCCL's workers; the environment variables that change what a figure
measures are recorded (precision.environment) so their effect is named, not blamed on the card.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import sys
import time
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_figures as gf  # noqa: E402
import gpu_verdict as gv  # noqa: E402
import gpu_verdict_multi as gvm  # noqa: E402
import nccl_check  # noqa: E402
import precision  # noqa: E402
import sustained  # noqa: E402
from gpu_smi import health, smi  # noqa: E402

judge, report, verdict = gv.judge, gv.report, gv.verdict  # what callers of this file used
_allreduce, parse_topology = nccl_check.allreduce, gvm.parse_topology
figure, matmul_figure, gpu_figures, cpu_gflops = gf.figure, gf.matmul_figure, gf.gpu_figures, gf.cpu_gflops
WARMUP_S, MEASURE_S, FIGURE_BOUND_S = gf.WARMUP_S, gf.MEASURE_S, gf.FIGURE_BOUND_S


def matmul_tflops(torch: Any, device: Any, major: int) -> dict[str, Any]:
    """bench's figures: gpu_figures' TFLOPS for one device."""
    return dict(gpu_figures(torch, device.index or 0, major, None)["tflops"])


# -- the host and the whole measurement ------------------------------------------------------

def host(data_dir: str | None) -> dict[str, Any]:
    mem = 0.0
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"MemTotal:\s+(\d+)", f.read())
            mem = int(m.group(1)) / 1048576 if m else 0.0
    except OSError:
        pass
    disks = []
    for path in [os.path.expanduser("~")] + ([data_dir] if data_dir else []):
        try:
            u = shutil.disk_usage(path)
            disks.append({"path": path, "free_gb": round(u.free / 1e9, 1),
                          "total_gb": round(u.total / 1e9, 1)})
        except OSError:
            disks.append({"path": path, "free_gb": None, "total_gb": None})
    mem_limit, cpu_quota = _cgroup_limits()
    cores = os.cpu_count() or 0
    # what a job can use (the smaller of the machine's and the cgroup's), and both figures
    return {"cpu_cores": min(cores, max(1, int(cpu_quota))) if cpu_quota else cores,
            "memory_gb": round(min(mem, mem_limit) if mem_limit else mem, 1), "disks": disks,
            "cpu_count": cores, "cpu_quota": round(cpu_quota, 2) if cpu_quota else None,
            "meminfo_gb": round(mem, 1),
            "memory_limit_gb": round(mem_limit, 2) if mem_limit else None}


def _cgroup_limits() -> tuple[float | None, float | None]:
    """(memory limit GiB, CPU quota cores) of this process's cgroup, None where none is set:
    in a container /proc/meminfo and os.cpu_count() are the machine's, the cgroup is what a job
    gets (the facts read the same files: provision/facts/limits.py has the formats)."""
    mems: list[str | None] = []
    cpus: list[float] = []
    cg, v1 = "", {}  # type: str, dict[str, str]
    try:
        with open("/proc/self/cgroup") as f:
            for ln in f:  # "0::/path" (v2), "4:memory:/path", "2:cpu,cpuacct:/path" (v1)
                _, ctl, path = ln.strip().split(":", 2)
                cg = path if ctl == "" else cg
                for name in ctl.split(","):
                    v1[name] = path.rstrip("/")
    except (OSError, ValueError):
        pass
    for d in {"/sys/fs/cgroup", "/sys/fs/cgroup" + cg.rstrip("/")}:
        mems.append(_cgroup_file(d + "/memory.max"))
        quota, _, period = (_cgroup_file(d + "/cpu.max") or "").partition(" ")
        if quota.isdigit() and period.isdigit() and int(period):
            cpus.append(int(quota) / int(period))
    for d in {"/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory" + v1.get("memory", "")}:
        mems.append(_cgroup_file(d + "/memory.limit_in_bytes"))
    for d in {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct",
              "/sys/fs/cgroup/cpu" + v1.get("cpu", "")}:
        quota = _cgroup_file(d + "/cpu.cfs_quota_us") or ""
        period = _cgroup_file(d + "/cpu.cfs_period_us") or ""
        if quota.isdigit() and period.isdigit() and int(period):
            cpus.append(int(quota) / int(period))
    limits = [int(m) / 1024 ** 3 for m in mems if m and m.isdigit() and int(m) < 1 << 62]
    return (min(limits) if limits else None), (min(cpus) if cpus else None)


def _cgroup_file(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _uuid(props: Any) -> str | None:
    """nvidia-smi's UUID of a torch device: props.uuid (torch >= 2.4 prints it 8-4-4-4-12,
    pytorch/pytorch#125083) with nvidia-smi's prefix, "MIG-" for a MIG instance (CUDA names it
    "<GPU> MIG 3g.40gb", as condor_gpu_discovery's documentation shows) else "GPU-"."""
    u = getattr(props, "uuid", None)
    if u is None:
        return None
    text = str(u)
    if text.startswith(("GPU-", "MIG-")):
        return text
    return ("MIG-" if gv.MIG_NAME.search(str(getattr(props, "name", ""))) else "GPU-") + text


def measure(cfg: dict[str, Any], env: dict[str, Any] | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"smi": smi() if cfg.get("expected_gpus") else None,
                         "host": host(cfg.get("data_dir")), "torch": {}, "gpus": [],
                         "cpu_gflops": None, "libcuda": None,
                         "env": env if env is not None else precision.environment(),
                         # the interpreter, and the one it is (a venv's python is a link to it)
                         "python": {"executable": sys.executable,
                                    "real": os.path.realpath(sys.executable),
                                    "prefix": sys.prefix, "version": sys.version.split()[0]}}
    try:
        import torch
    except Exception as exc:  # the env has no usable torch: nothing else can be measured
        m["torch"] = {"error": repr(exc)}
        return m
    t = m["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "error": None,
                      "file": getattr(torch, "__file__", None)}
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    ref = a @ a
    t["cpu_matmul_ok"] = bool(torch.allclose(ref, (a.double() @ a.double()).float(), rtol=1e-3, atol=1e-3))
    m["cpu_gflops"] = round(cpu_gflops(torch), 1)
    if torch.version.cuda is None or not cfg.get("expected_gpus"):
        return m
    try:  # the driver's user-space library: without it CUDA cannot start, whatever nvidia-smi says
        ctypes.CDLL("libcuda.so.1")
        m["libcuda"] = True
    except OSError:
        m["libcuda"] = False
        return m
    with warnings.catch_warnings(record=True) as caught:  # why CUDA did not start, in its words
        warnings.simplefilter("always")
        t["available"] = bool(torch.cuda.is_available())
    t["cuda_warnings"] = [str(w.message)[:1000] for w in caught]
    if not t["available"]:
        m["fabric"] = nccl_check.fabric()
        return m
    n = t["device_count"] = torch.cuda.device_count()
    t["arch_list"] = torch.cuda.get_arch_list()
    rows = (m["smi"] or {}).get("gpus") or []
    m["health"] = health({str(r.get("pci.bus_id")): str(r.get("index")) for r in rows})
    if n >= 2:  # before any context of ours: Exclusive_Process GPUs take one process each
        try:
            m["multi"] = nccl_check.measure_multi(torch, n, m["smi"] or {})
        except Exception as exc:
            m["multi"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    reasons = (m["smi"] or {}).get("reasons_field", "clocks_event_reasons")
    for i in range(n):
        g = _gpu(torch, i, m)
        m["gpus"].append(g)
        if not gv.has_kernels(t["arch_list"], g["capability"]):
            continue
        try:
            with torch.cuda.device(i):
                precision.set_fp32(torch, False)  # the check's own switches, whatever the image set
                g["correctness"] = gf.correctness(torch, a, torch.device("cuda", i),
                                                  precision.fp32_mode(torch))
                g["matmul_ok"] = g["correctness"]["ok"]
            g.update(gpu_figures(torch, i, int(g["capability"].split(".")[0]),
                                 g.get("parent_uuid") or g["uuid"], reasons))
        except Exception as exc:  # a GPU that errors is a finding, not a crash
            g["error"] = f"{type(exc).__name__}: {exc}"[:500]
    seconds = float((cfg.get("thresholds") or {}).get("sustained_s") or 0)
    if seconds > 0:
        fit = [g for g in m["gpus"] if not g.get("error")
               and gv.has_kernels(t["arch_list"], g["capability"])]
        m["sustained"] = sustained.measure(torch, fit, seconds, reasons)
    return m


def _gpu(torch: Any, i: int, m: dict[str, Any]) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(i)
    g: dict[str, Any] = {"index": i, "name": torch.cuda.get_device_name(i), "uuid": _uuid(props),
                         "capability": f"{props.major}.{props.minor}",
                         "memory_gb": round(props.total_memory / 1e9, 1),
                         "sms": getattr(props, "multi_processor_count", None), "matmul_ok": None,
                         "tflops": {}, "h2d_gbs": None, "mem_gbs": None, "error": None}
    mig = [x for x in (m["smi"] or {}).get("mig") or [] if x.get("uuid") == g["uuid"]]
    if mig:
        parent: dict[str, Any] = next((r for r in (m["smi"] or {}).get("gpus") or []
                                       if str(r.get("index")) == str(mig[0]["gpu"])), {})
        g["parent_uuid"] = parent.get("uuid")
        g["mig_profile"] = mig[0].get("profile")
    return g


def main(argv: list[str]) -> None:
    # torch numbers GPUs as nvidia-smi does when CUDA starts with this set (CUDA C++ Programming
    # Guide, "CUDA Environment Variables": CUDA_DEVICE_ORDER); an order set by the user stays
    # hers, and each GPU is still matched by UUID
    given = precision.environment()  # as the image gave it, before our own default below
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    config = json.loads(argv[1]) if len(argv) > 1 else {}
    started = time.perf_counter()
    try:
        result = report(measure(config, given), config, time.perf_counter() - started)
    except Exception as exc:  # still one JSON line: the provisioner reads nothing else
        result = {"schema": 3, "verdict": "FAIL", "mode": "gpu" if config.get("expected_gpus") else "cpu",
                  "torch": None, "cuda": None, "devices": [], "measurements": {},
                  "checks": [{"name": "validation", "status": "fail",
                              "reason": f"validate_gpu.py stopped: {type(exc).__name__}: {exc}"[:500]}],
                  "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(result))


if __name__ == "__main__" and sys.argv[1:2] == ["--allreduce"]:
    nccl_check.allreduce_main(sys.argv[2:])
elif __name__ == "__main__":
    main(sys.argv)
