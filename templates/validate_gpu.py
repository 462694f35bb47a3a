"""gpu-provision validation: runs on the host in the provisioned env (Python 3.8+, torch only) and
prints ONE line: the JSON object below. Under a minute on a real GPU.

Argument 1 is the JSON config the provisioner renders (argument 2, optional, the inputs hash
recorded with the verdict in ~/.gpu-provision/steps/verdict.json):
  {"expected_gpus": int (what nvidia-smi showed the provisioner),
   "advertised": {"model": "RTX 4090", "count": 1} | null (the inventory's ``gpu:``),
   "thresholds": {"min_tflops_ratio", "min_bandwidth_ratio", "min_cpu_cores", "min_memory_gb",
                  "min_free_disk_gb"},
   "reference": {<GPU name as nvidia-smi prints it>: {"fp32", "tf32", "fp16", "bf16": dense peak
                 TFLOPS or null, "h2d_gbs": host-to-device GB/s a healthy PCIe link gives,
                 "source": url}},
   "data_dir": str | null}

Output schema (version 2):
  {"schema": 2, "verdict": "PASS"|"WARN"|"FAIL", "mode": "gpu"|"cpu", "torch": str|null,
   "cuda": str|null, "checks": [{"name", "status": "pass"|"warn"|"fail", "reason"}],
   "devices": [{"index", "name", "capability", "memory_gb"}],
   "measurements": {"smi": {...}, "host": {...}, "torch": {...}, "gpus": [{"index", "matmul_ok",
                    "tflops": {dtype: float}, "h2d_gbs": float}], "cpu_gflops": float|null},
   "seconds": float}
``judge(measurements, config)`` holds every verdict rule and is pure, so recorded measurements
can be judged again anywhere (the provisioner's tests do).
"""

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings

SMI_FIELDS = ("index,name,memory.total,memory.used,utilization.gpu,clocks.sm,clocks.max.sm,"
              "power.limit,temperature.gpu,pcie.link.gen.current,pcie.link.width.current")
BUSY_MIB = 512  # memory in use before we start above this: someone else is on the GPU


# -- measuring (needs the host) -------------------------------------------------------------

def _smi():
    """nvidia-smi's view before torch touches the GPU (torch's own context uses memory)."""
    out = {"gpus": [], "processes": [], "error": None}
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        out["error"] = f"nvidia-smi: {exc}"
        return out
    if r.returncode != 0:
        out["error"] = (r.stdout + r.stderr).strip()[:2000]
        return out
    keys = SMI_FIELDS.split(",")
    for line in r.stdout.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(keys):
            out["gpus"].append(dict(zip(keys, cells)))
    r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    for line in r.stdout.strip().splitlines() if r.returncode == 0 else []:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3:
            out["processes"].append({"pid": cells[0], "name": cells[1], "used_mib": cells[2]})
    return out


def _run(argv):
    """(exit code, stdout) of a command; 127 when it is missing."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 127, ""
    return r.returncode, r.stdout.strip()


def _fabric():
    """On NVSwitch boards CUDA waits for the fabric manager: its service state and version, and
    the fabric state per GPU (None where the tool or the field is missing)."""
    _, said = _run(["systemctl", "is-active", "nvidia-fabricmanager"])  # exits 3 when inactive
    word = said.splitlines()[0] if said else ""
    _, version = _run(["nv-fabricmanager", "--version"])
    m = re.search(r"version is\s*:\s*(\S+)", version)
    rc, states = _run(["nvidia-smi", "--query-gpu=fabric.state,fabric.status",
                       "--format=csv,noheader"])
    return {"manager": word if re.fullmatch(r"[a-z-]+", word) else None,
            "version": m.group(1) if m else None,
            "states": [ln.strip() for ln in states.splitlines()] if rc == 0 and states else None}


def _host(data_dir):
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
    return {"cpu_cores": os.cpu_count() or 0, "memory_gb": round(mem, 1), "disks": disks}


def _tflops(torch, device, dtype, n, seconds=0.6):
    """Median-free but steady: a warm-up, then as many n x n matmuls as fit in ``seconds``."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters, total = 0, 0.0
    while total < seconds * 1000 and iters < 50:
        start.record()
        for _ in range(5):
            a @ b
        end.record()
        end.synchronize()
        total += start.elapsed_time(end)
        iters += 5
    return round(2 * n ** 3 * iters / (total / 1000) / 1e12, 1)


def matmul_tflops(torch, device, major):
    """TFLOPS per dtype the GPU has: fp32 on CUDA cores, tf32 and bf16 from sm_80, fp16."""
    out = {}
    torch.backends.cuda.matmul.allow_tf32 = False
    out["fp32"] = _tflops(torch, device, torch.float32, 4096)
    if major >= 8:
        torch.backends.cuda.matmul.allow_tf32 = True
        out["tf32"] = _tflops(torch, device, torch.float32, 8192)
        torch.backends.cuda.matmul.allow_tf32 = False
        out["bf16"] = _tflops(torch, device, torch.bfloat16, 8192)
    out["fp16"] = _tflops(torch, device, torch.float16, 8192)
    return out


def cpu_gflops(torch, n=1024, reps=5):
    """fp32 GFLOPS of the CPU: ``reps`` n x n matmuls."""
    a = torch.randn(n, n)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ a
    return reps * 2 * n ** 3 / (time.perf_counter() - t0) / 1e9


def _h2d(torch, device, mib=256):
    host = torch.empty(mib * 1048576, dtype=torch.uint8).pin_memory()
    dev = torch.empty_like(host, device=device)
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(5):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize(device)
    return round(5 * mib * 1048576 / (time.perf_counter() - t0) / 1e9, 1)


def measure(cfg):
    m = {"smi": _smi() if cfg.get("expected_gpus") else None, "host": _host(cfg.get("data_dir")),
         "torch": {}, "gpus": [], "cpu_gflops": None, "libcuda": None}
    try:
        import torch
    except Exception as exc:  # the env has no usable torch: nothing else can be measured
        m["torch"] = {"error": repr(exc)}
        return m
    t = m["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "error": None}
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    ref = a @ a
    t["cpu_matmul_ok"] = bool(torch.allclose(ref, (a.double() @ a.double()).float(), rtol=1e-3,
                                             atol=1e-3))
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
        m["fabric"] = _fabric()
        return m
    t["device_count"] = torch.cuda.device_count()
    t["arch_list"] = torch.cuda.get_arch_list()
    for i in range(t["device_count"]):
        cap = torch.cuda.get_device_capability(i)
        props = torch.cuda.get_device_properties(i)
        g = {"index": i, "name": torch.cuda.get_device_name(i), "capability": f"{cap[0]}.{cap[1]}",
             "memory_gb": round(props.total_memory / 1e9, 1), "matmul_ok": None, "tflops": {},
             "h2d_gbs": None, "error": None}
        m["gpus"].append(g)
        if not _has_kernels(t["arch_list"], g["capability"]):
            continue
        try:
            dev = torch.device("cuda", i)
            g["matmul_ok"] = bool(torch.allclose(ref, (a.to(dev) @ a.to(dev)).cpu(), rtol=1e-2,
                                                 atol=1e-2))
            g["tflops"] = matmul_tflops(torch, dev, cap[0])
            g["h2d_gbs"] = _h2d(torch, dev)
        except Exception as exc:  # a GPU that errors is a finding, not a crash
            g["error"] = f"{type(exc).__name__}: {exc}"[:500]
    return m


# -- judging (pure) -------------------------------------------------------------------------

def _has_kernels(arches, capability):
    """sm_X.Y runs a build for sm_X.Z when Z <= Y (PTX is not counted)."""
    major, minor = (int(x) for x in capability.split("."))
    return any(re.fullmatch(rf"sm_{major}(\d)a?", x) and int(x[len(f"sm_{major}"):].rstrip("a")) <= minor
               for x in arches)


def _norm(name):
    return re.sub(r"nvidia|geforce|tesla|[\s_-]", "", name.lower())


def judge(m, cfg):
    checks = []

    def check(name, status, reason):
        checks.append({"name": name, "status": status, "reason": reason})

    th = {"min_tflops_ratio": 0.5, "min_bandwidth_ratio": 0.5, **(cfg.get("thresholds") or {})}
    expected = int(cfg.get("expected_gpus") or 0)
    t = m.get("torch") or {}
    smi = m.get("smi") or {}
    if expected:
        if smi.get("error"):
            check("driver", "fail", f"nvidia-smi failed: {smi['error'].splitlines()[0]}")
        else:
            names = ", ".join(sorted({g["name"] for g in smi.get("gpus", [])})) or "none"
            check("driver", "pass" if smi.get("gpus") else "fail",
                  f"nvidia-smi answers: {len(smi.get('gpus', []))} GPU(s) ({names})")
    if t.get("error") or not t.get("version"):
        check("torch import", "fail", f"import torch failed: {t.get('error')}")
    else:
        check("torch import", "pass", f"torch {t['version']} (CUDA {t.get('cuda')})")
        if not expected:
            check("cpu matmul", "pass" if t.get("cpu_matmul_ok") else "fail",
                  f"256x256 matmul {'matches' if t.get('cpu_matmul_ok') else 'differs from'} float64;"
                  f" CPU {m.get('cpu_gflops')} GFLOPS")
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
            check("cuda available", "fail", _cuda_failure(m))
        else:
            check("cuda available", "pass", "torch.cuda.is_available()")
            _judge_gpus(m, cfg, th, check)
    _judge_host(m, th, check)
    return checks


ERR_802 = re.compile(r"\b802\b|system not yet initialized|cudaErrorSystemNotReady", re.I)


def _cuda_failure(m):
    """Why CUDA did not start, from torch's own warning; error 802 on an NVSwitch board names
    the fabric manager, its state, and the fix."""
    said = " ".join((m.get("torch") or {}).get("cuda_warnings") or [])
    if not ERR_802.search(said):
        first = said.split(" (Triggered internally")[0].strip()
        return ("torch.cuda.is_available() is False (the driver is too old for this wheel, or "
                "not loaded)" + (f": {first[:300]}" if first else ""))
    fab = m.get("fabric") or {}
    seen = []
    if fab.get("manager") or fab.get("version"):
        seen.append(f"nvidia-fabricmanager {fab.get('version') or '(not installed)'} "
                    f"{fab.get('manager') or ''}".strip())
    else:
        seen.append("no nvidia-fabricmanager service here")
    states = fab.get("states") or []
    if states:
        counts = {}
        for s in states:
            counts[s] = counts.get(s, 0) + 1
        seen.append("fabric " + ", ".join(f"{s} on {n} GPU(s)" for s, n in counts.items()))
    return ("CUDA error 802: system not yet initialized: on an NVSwitch board the GPUs wait for "
            f"the fabric manager to set up the NVLink fabric ({'; '.join(seen)}). Fix: run "
            "nvidia-fabricmanager of exactly the driver's version (`gpu-provision -H <host> "
            "driver` installs and starts it on a VM; by hand `systemctl enable --now "
            "nvidia-fabricmanager`) and wait for `nvidia-smi -q` to show Fabric State "
            "Completed; on a container rental it runs on the provider's host: ask the provider")


def _judge_gpus(m, cfg, th, check):
    t, smi, gpus = m["torch"], m.get("smi") or {}, m.get("gpus") or []
    seen = len(smi.get("gpus", []))
    count = t.get("device_count", len(gpus))
    expected = int(cfg.get("expected_gpus") or 0)
    ok = count == seen == expected
    check("gpu count", "pass" if ok else "fail",
          f"torch sees {count} GPU(s), nvidia-smi {seen}" + ("" if seen == expected else
                                                             f", at provisioning {expected}"))
    refs = cfg.get("reference") or {}
    for g in gpus:
        i, name = g["index"], g["name"]
        if not _has_kernels(t.get("arch_list", []), g["capability"]):
            check(f"gpu {i} kernels", "fail", f"{name} is sm_{g['capability'].replace('.', '')}; "
                  f"the wheel has {' '.join(t.get('arch_list', []))}")
            continue
        if g.get("error"):
            check(f"gpu {i} matmul", "fail", g["error"])
            continue
        check(f"gpu {i} matmul", "pass" if g.get("matmul_ok") else "fail",
              "matches the CPU result" if g.get("matmul_ok") else "differs from the CPU result")
        ref = refs.get(name)
        if not ref:
            measured = ", ".join(f"{k} {v}" for k, v in g.get("tflops", {}).items())
            check(f"gpu {i} speed", "pass", f"{name}: {measured} TFLOPS; no reference figures "
                  "for this model to compare with")
            continue
        parts, slow = [], []
        for dtype, got in g.get("tflops", {}).items():
            peak = ref.get(dtype)
            if not peak:
                continue
            ratio = got / peak
            parts.append(f"{dtype} {got}/{peak} ({ratio:.2f})")
            if ratio < th["min_tflops_ratio"]:
                slow.append(dtype)
        sg = next((x for x in smi.get("gpus", []) if str(x.get("index")) == str(i)), {})
        clocks = f"; SM clock {sg.get('clocks.sm')}/{sg.get('clocks.max.sm')} MHz, power limit " \
                 f"{sg.get('power.limit')} W, {sg.get('temperature.gpu')} C" if sg else ""
        check(f"gpu {i} speed", "warn" if slow else "pass",
              (f"{', '.join(slow)} below {th['min_tflops_ratio']} of {name}'s datasheet peak: "
               f"throttled, power-capped or not the card it claims to be" if slow else
               "TFLOPS measured/peak within the expected range") + f" ({'; '.join(parts)}){clocks}")
        want = ref.get("h2d_gbs")
        if want and g.get("h2d_gbs") is not None:
            low = g["h2d_gbs"] < th["min_bandwidth_ratio"] * want
            link = f" (link gen {sg.get('pcie.link.gen.current')} x{sg.get('pcie.link.width.current')})" \
                if sg else ""
            check(f"gpu {i} bandwidth", "warn" if low else "pass",
                  f"host-to-device {g['h2d_gbs']} GB/s, a healthy link gives about {want}{link}"
                  + ("; a narrower or older PCIe link than this GPU needs" if low else ""))
    busy = [x for x in smi.get("gpus", []) if _num(x.get("memory.used")) > BUSY_MIB]
    procs = smi.get("processes", [])
    if procs or busy:
        what = [f"{p['name']} (pid {p['pid']}, {p['used_mib']} MiB)" for p in procs[:5]]
        what += [f"GPU {x['index']} had {x['memory.used']} MiB in use" for x in busy]
        check("gpu busy", "warn", "in use before validation started: " + "; ".join(what) +
              " (a shared or dirty instance)")
    else:
        check("gpu busy", "pass", "no other process and no memory in use before we started")
    claim = cfg.get("advertised")
    if claim:
        names = [x["name"] for x in smi.get("gpus", [])] or [g["name"] for g in gpus]
        match = [n for n in names if _norm(claim["model"]) in _norm(n)]
        want = int(claim.get("count") or 1)
        if len(match) >= want and len(match) == len(names):
            check("advertised gpu", "pass", f"{claim['model']} x{want} advertised, "
                  f"{len(match)} seen ({', '.join(sorted(set(names)))})")
        else:
            check("advertised gpu", "fail", f"{claim['model']} x{want} was advertised, the host "
                  f"has {len(names)}: {', '.join(names) or 'none'}")


def _num(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _judge_host(m, th, check):
    h = m.get("host") or {}
    for key, have, unit, what in (("min_cpu_cores", h.get("cpu_cores"), "", "cpu cores"),
                                  ("min_memory_gb", h.get("memory_gb"), " GB", "memory")):
        need = th.get(key)
        if need is not None and have is not None:
            check(what, "pass" if have >= need else "warn",
                  f"{have}{unit}, the recipe wants at least {need}{unit}")
    need = th.get("min_free_disk_gb")
    for d in h.get("disks", []):
        if need is not None and d.get("free_gb") is not None:
            check(f"free disk {d['path']}", "pass" if d["free_gb"] >= need else "warn",
                  f"{d['free_gb']} GB free of {d['total_gb']} GB, the recipe wants {need} GB")


def verdict(checks):
    statuses = {c["status"] for c in checks}
    return "FAIL" if "fail" in statuses else "WARN" if "warn" in statuses else "PASS"


def report(m, cfg, seconds=0.0):
    checks = judge(m, cfg)
    t = m.get("torch") or {}
    return {"schema": 2, "verdict": verdict(checks), "mode": "gpu" if cfg.get("expected_gpus") else "cpu",
            "torch": t.get("version"), "cuda": t.get("cuda"), "checks": checks,
            "devices": [{k: g[k] for k in ("index", "name", "capability", "memory_gb")}
                        for g in m.get("gpus") or []],
            "measurements": m, "seconds": round(seconds, 1)}


def journal(verdict_, inputs):
    """Record the verdict for the provisioner (argument 2 is its inputs hash): a re-run that
    changes nothing skips validation after a PASS."""
    steps = os.path.expanduser("~/.gpu-provision/steps")
    os.makedirs(steps, exist_ok=True)
    with open(os.path.join(steps, "verdict.json.tmp"), "w") as f:
        json.dump({"step": "verdict", "inputs": inputs, "result": verdict_, "at": int(time.time())}, f)
    os.replace(os.path.join(steps, "verdict.json.tmp"), os.path.join(steps, "verdict.json"))


if __name__ == "__main__":
    config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    started = time.perf_counter()
    result = report(measure(config), config, time.perf_counter() - started)
    if len(sys.argv) > 2:
        journal(result["verdict"], sys.argv[2])
    print(json.dumps(result))
