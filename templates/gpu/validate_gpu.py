"""gpu-provision validation, the measuring half: runs on the host in the provisioned env
(Python 3.8+, torch only) and prints ONE line: the report of gpu_verdict.py (shipped beside it,
which holds every verdict rule) on what this file measured. About 10 s of load per GPU, and
on 2+ GPUs the NCCL all-reduce (one spawned process per GPU; bounded at 90 s, each further rung
of its ladder at 60 s).

Argument 1 is the JSON config the provisioner renders (the validate step journals the verdict
itself, templates/setup/validate.sh.j2):
  {"expected_gpus": int (what nvidia-smi showed the provisioner),
   "advertised": {"model": "RTX 4090", "count": 1} | null (the inventory's ``gpu:``),
   "thresholds": {"min_tflops_ratio", "min_bandwidth_ratio"},
   "reference": {<GPU name as nvidia-smi prints it>: {"peak": {dtype: dense TFLOPS},
                 "floor": {dtype: TFLOPS a healthy card sustains at least}, "mem_gbs", "sms",
                 "source"}},
   "data_dir": str | null}

The host's cores, memory and free disk are measured here ("measurements"."host") and judged
against the recipe's minimums by the provisioner (provision/config/minimums.py: one rule for the
plan, before anything is installed, and for this report).

How it measures (the rules a measurement on real hardware needs):
- every figure on the device it names: inside ``torch.cuda.device(i)``, timed by CUDA events
  recorded on that device's current stream (torch.cuda.Event.record uses
  torch.cuda.current_stream(), https://docs.pytorch.org/docs/stable/generated/torch.cuda.Event.html);
- sustained: at least WARMUP_S of the same work first, then at least MEASURE_S timed, the matrix
  size chosen from a probe so one figure stays within FIGURE_BOUND_S (Pascal's fp16 runs at
  1/64 rate);
- clocks, power, temperature, clock-event reasons and the PCIe link read by nvidia-smi WHILE the
  work runs (at idle an H100 reads 345 MHz and PCIe gen 1), per GPU by UUID:
  CUDA_DEVICE_ORDER=PCI_BUS_ID and torch.cuda.get_device_properties(i).uuid (torch >= 2.4) match
  nvidia-smi's ``uuid`` whatever CUDA_VISIBLE_DEVICES says;
- the multi-GPU tier first, before this process opens a CUDA context, so a GPU in
  Exclusive_Process compute mode is free for NCCL's workers.
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
import gpu_verdict as gv  # noqa: E402
import gpu_verdict_multi as gvm  # noqa: E402
import nccl_check  # noqa: E402
from gpu_smi import REASON_FIELDS, health, load_fields, smi, start_load_query, under_load  # noqa: E402

judge, report, verdict = gv.judge, gv.report, gv.verdict  # what callers of this file used
_allreduce, parse_topology = nccl_check.allreduce, gvm.parse_topology

WARMUP_S = 0.3
MEASURE_S = 1.0
FIGURE_BOUND_S = 4.0  # wall-clock bound on one figure, whatever the GPU


# -- the single-GPU figures -----------------------------------------------------------------

def _timed(torch: Any, work: Any, seconds: float, deadline: float) -> dict[str, Any]:
    """Runs ``work`` (which queues GPU work on the current device) in batches between two events
    of the current device until the events have timed ``seconds`` of GPU time (or the wall
    deadline passed): {"ms", "calls"}."""
    ms, calls, batch = 0.0, 0, 1
    while ms < seconds * 1000 and time.perf_counter() < deadline:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            work()
        end.record()
        end.synchronize()
        took = start.elapsed_time(end)
        ms += took
        calls += batch
        if took < 50:  # few launches per event pair, so the events time the device, not Python
            batch *= 2
    return {"ms": ms, "calls": calls}


def figure(torch: Any, work: Any, per_call: float, deadline_s: float = FIGURE_BOUND_S,
           on_load: Any = None) -> dict[str, Any]:
    """Rate of ``work`` (``per_call`` units each: FLOPs or bytes), sustained: a warm-up of at least
    WARMUP_S, then at least MEASURE_S timed. {"rate", "seconds", "calls", "error"}."""
    deadline = time.perf_counter() + deadline_s
    _timed(torch, work, WARMUP_S, deadline)
    if on_load is not None:
        on_load()
    got = _timed(torch, work, MEASURE_S, deadline)
    if got["ms"] <= 0:
        return {"rate": None, "seconds": 0.0, "calls": got["calls"],
                "error": "the CUDA events timed no GPU time: the work did not run on this device"}
    return {"rate": per_call * got["calls"] / (got["ms"] / 1000), "seconds": round(got["ms"] / 1000, 2),
            "calls": got["calls"], "error": None}


def matmul_figure(torch: Any, dtype: Any, on_load: Any = None) -> dict[str, Any]:
    """TFLOPS of n x n matmuls on the current device; n from a probe so one matmul takes at
    most ~50 ms (8192 on a datacenter card, smaller where the type is slow)."""
    n = 1024
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a @ b
    start.record()
    for _ in range(3):
        a @ b
    end.record()
    end.synchronize()
    per = start.elapsed_time(end) / 3  # ms per 1024 matmul
    while n < 8192 and per * 8 <= 50:
        n, per = n * 2, per * 8
    if n != 1024:
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
    got = figure(torch, lambda: a @ b, 2 * n ** 3, on_load=on_load)
    got["n"] = n
    got["tflops"] = round(got.pop("rate") / 1e12, 1) if got.get("rate") else None
    return got


def gpu_figures(torch: Any, i: int, cap_major: int, uuid: str | None) -> dict[str, Any]:
    """Every figure of GPU ``i`` on GPU ``i``: matmul TFLOPS per type (the heaviest first, the
    clocks read under it), device-memory and host-to-device bandwidth (the link read under it).
    Each figure is independent: one that fails is a note, not the end."""
    out: dict[str, Any] = {"tflops": {}, "figures": {}, "mem_gbs": None, "h2d_gbs": None,
                           "under_load": {}, "link": {}, "notes": []}
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    order = [("fp16", torch.float16, False)]
    if cap_major >= 8:
        order += [("bf16", torch.bfloat16, False), ("tf32", torch.float32, True)]
    order += [("fp32", torch.float32, False)]
    tries = list(REASON_FIELDS)  # the load query with the reasons' newer name, then the older
    try:
        with torch.cuda.device(i):
            for name, dtype, tf32 in order:
                started: list[Any] = []
                fields = load_fields(tries.pop(0)) if not out["under_load"] and tries else ""

                def hook(f: str = fields, s: list[Any] = started) -> None:
                    if f:  # read under the heaviest figure whose query answers
                        s.append((start_load_query(uuid, f), f))
                try:
                    torch.backends.cuda.matmul.allow_tf32 = tf32
                    got = matmul_figure(torch, dtype, on_load=hook)
                    out["figures"][name] = got
                    out["tflops"][name] = got["tflops"]
                    if got.get("error"):
                        out["notes"].append(f"{name}: {got['error']}")
                except Exception as exc:  # one type failing ("no kernel image") is a note
                    out["notes"].append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
                finally:
                    for proc, fields in started:
                        out["under_load"] = under_load(proc, fields)
                    torch.cuda.empty_cache()
            # the link under load: PCIe drops to gen 1 at idle and trains up under work
            out["link"] = {k: v for k, v in out["under_load"].items() if k.startswith("pcie.")}
            out["mem_gbs"] = _bandwidth(torch, out, "mem", lambda: _device_copy(torch))
            out["h2d_gbs"] = _bandwidth(torch, out, "h2d", lambda: _host_copy(torch))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32  # the legacy switch is process-wide
    return out


def _bandwidth(torch: Any, out: dict[str, Any], name: str, measure_fn: Any) -> float | None:
    try:
        got = measure_fn()
    except Exception as exc:
        out["notes"].append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
        return None
    finally:
        torch.cuda.empty_cache()
    out["figures"][name] = got
    if got.get("error"):
        out["notes"].append(f"{name}: {got['error']}")
        return None
    return round(float(got["rate"]) / 1e9, 1)


def _device_copy(torch: Any) -> dict[str, Any]:
    """Device-memory bandwidth: a copy reads and writes every byte (2 x size per copy)."""
    free, _ = torch.cuda.mem_get_info()
    size = int(min(1 << 30, free // 8)) // 4 * 4
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return figure(torch, lambda: dst.copy_(src), 2 * size)


def _host_copy(torch: Any) -> dict[str, Any]:
    """Host-to-device from pinned memory."""
    size = 256 << 20
    host = torch.empty(size, dtype=torch.uint8).pin_memory()
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    return figure(torch, lambda: dev.copy_(host, non_blocking=True), size)


def cpu_gflops(torch: Any, n: int = 1024, reps: int = 5) -> float:
    a = torch.randn(n, n)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ a
    return reps * 2 * n ** 3 / max(time.perf_counter() - t0, 1e-9) / 1e9


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


def measure(cfg: dict[str, Any]) -> dict[str, Any]:
    m: dict[str, Any] = {"smi": smi() if cfg.get("expected_gpus") else None,
                         "host": host(cfg.get("data_dir")), "torch": {}, "gpus": [],
                         "cpu_gflops": None, "libcuda": None,
                         "env": {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")},
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
    m["health"] = health([str(r.get("uuid")) for r in (m["smi"] or {}).get("gpus") or []])
    if n >= 2:  # before any context of ours: Exclusive_Process GPUs take one process each
        try:
            m["multi"] = nccl_check.measure_multi(torch, n, m["smi"] or {})
        except Exception as exc:
            m["multi"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    for i in range(n):
        props = torch.cuda.get_device_properties(i)
        cap = (props.major, props.minor)
        g: dict[str, Any] = {"index": i, "name": torch.cuda.get_device_name(i), "uuid": _uuid(props),
                             "capability": f"{cap[0]}.{cap[1]}",
                             "memory_gb": round(props.total_memory / 1e9, 1),
                             "sms": getattr(props, "multi_processor_count", None), "matmul_ok": None,
                             "tflops": {}, "h2d_gbs": None, "mem_gbs": None, "error": None}
        mig = [x for x in (m["smi"] or {}).get("mig") or [] if x.get("uuid") == g["uuid"]]
        if mig:
            parent: dict[str, Any] = next((r for r in (m["smi"] or {}).get("gpus") or []
                           if str(r.get("index")) == str(mig[0]["gpu"])), {})
            g["parent_uuid"] = parent.get("uuid")
        m["gpus"].append(g)
        if not gv.has_kernels(t["arch_list"], g["capability"]):
            continue
        try:
            with torch.cuda.device(i):
                dev = torch.device("cuda", i)
                got = (a.to(dev) @ a.to(dev)).cpu()
                g["matmul_ok"] = bool(torch.allclose(ref, got, rtol=1e-2, atol=1e-2))
            g.update(gpu_figures(torch, i, cap[0], g.get("parent_uuid") or g["uuid"]))
        except Exception as exc:  # a GPU that errors is a finding, not a crash
            g["error"] = f"{type(exc).__name__}: {exc}"[:500]
    return m


def main(argv: list[str]) -> None:
    # torch numbers GPUs as nvidia-smi does when CUDA starts with this set (CUDA C++ Programming
    # Guide, "CUDA Environment Variables": CUDA_DEVICE_ORDER); an order set by the user stays
    # hers, and each GPU is still matched by UUID
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    config = json.loads(argv[1]) if len(argv) > 1 else {}
    started = time.perf_counter()
    try:
        result = report(measure(config), config, time.perf_counter() - started)
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
