"""gpu-provision validation: runs on the host in the provisioned env (Python 3.8+, torch only) and
prints ONE line: the JSON object below. Under a minute on a real GPU.

Argument 1 is the JSON config the provisioner renders (the validate step journals the verdict
itself, templates/setup/validate.sh.j2):
  {"expected_gpus": int (what nvidia-smi showed the provisioner),
   "advertised": {"model": "RTX 4090", "count": 1} | null (the inventory's ``gpu:``),
   "thresholds": {"min_tflops_ratio", "min_bandwidth_ratio"},
   "reference": {<GPU name as nvidia-smi prints it>: {"fp32", "tf32", "fp16", "bf16": dense peak
                 TFLOPS or null, "h2d_gbs": host-to-device GB/s a healthy PCIe link gives,
                 "source": url}},
   "data_dir": str | null}

Output schema (version 2):
  {"schema": 2, "verdict": "PASS"|"WARN"|"FAIL", "mode": "gpu"|"cpu", "torch": str|null,
   "cuda": str|null, "checks": [{"name", "status": "pass"|"warn"|"fail", "reason"}],
   "devices": [{"index", "name", "capability", "memory_gb"}],
   "measurements": {"smi": {...}, "host": {...}, "torch": {...}, "gpus": [{"index", "matmul_ok",
                    "tflops": {dtype: float}, "h2d_gbs": float}], "cpu_gflops": float|null,
                    "multi": {...} (2+ GPUs: see measure_multi)},
   "seconds": float}
The host's cores, memory and free disk are measured here ("measurements"."host") and judged
against the recipe's minimums by the provisioner (provision/config/minimums.py: one rule for
the plan, before anything is installed, and for this report).
A check may carry "env": {NAME: value}: the fix for a known trap (NCCL_P2P_DISABLE=1 ...), which
`gpu-provision run` applies to the jobs it starts on this host.
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
              "power.limit,temperature.gpu,pcie.link.gen.current,pcie.link.width.current,"
              "pcie.link.gen.max,pcie.link.width.max")
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
    mem_limit, cpu_quota = _cgroup_limits()
    cores = os.cpu_count() or 0
    return {"cpu_cores": min(cores, max(1, int(cpu_quota))) if cpu_quota else cores,
            "memory_gb": round(min(mem, mem_limit) if mem_limit else mem, 1), "disks": disks}


def _cgroup_limits():
    """(memory limit GiB, CPU quota cores) of this process's cgroup, None where none is set:
    in a container /proc/meminfo and os.cpu_count() are the machine's, the cgroup is what a job
    gets (the facts read the same files: provision/facts/limits.py has the formats)."""
    mems, cpus = [], []
    cg, v1 = "", {}
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
        quota, period = _cgroup_file(d + "/cpu.cfs_quota_us") or "", _cgroup_file(d + "/cpu.cfs_period_us") or ""
        if quota.isdigit() and period.isdigit() and int(period):
            cpus.append(int(quota) / int(period))
    limits = [int(m) / 1024 ** 3 for m in mems if m and m.isdigit() and int(m) < 1 << 62]
    return (min(limits) if limits else None), (min(cpus) if cpus else None)


def _cgroup_file(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


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
    if t["device_count"] >= 2:
        try:
            m["multi"] = measure_multi(torch, t["device_count"])
        except Exception as exc:
            m["multi"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    return m


# -- the multi-GPU tier (2+ GPUs) ---------------------------------------------------------------

ALLREDUCE_TIMEOUT = 90  # seconds: an all-reduce that has not answered by then hangs (NCCL does)


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _allreduce_worker(rank, n, backend, port, mib, iters, queue):
    import torch
    import torch.distributed as dist
    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    x = torch.full((mib * 1048576 // 4,), float(rank + 1), device=dev)
    dist.all_reduce(x)  # warm-up, and the check: every element is 1 + 2 + ... + n
    ok = bool((x == n * (n + 1) / 2).all().item())
    dist.barrier()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize()
    per_op = (time.perf_counter() - t0) / iters
    if rank == 0:
        algbw = x.numel() * 4 / per_op / 1e9
        # nccl-tests' bus bandwidth: what each link carries in a ring all-reduce
        queue.put({"ok": ok, "busbw_gbs": round(algbw * 2 * (n - 1) / n, 1),
                   "algbw_gbs": round(algbw, 1), "mib": mib, "iters": iters})
    dist.destroy_process_group()


def allreduce_main(n, backend="nccl", mib=256, iters=20):
    """`validate_gpu.py --allreduce N [backend] [MiB] [iters]`: one process per GPU, prints one
    JSON line. Run in a subprocess with a time limit: a broken peer-to-peer path hangs NCCL."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_allreduce_worker, args=(n, backend, _free_port(), mib, iters, queue),
                       nprocs=n, join=True, start_method="spawn")
    print(json.dumps(queue.get()))


def _allreduce(n, env, backend="nccl", mib=256, iters=20, timeout=ALLREDUCE_TIMEOUT):
    """One all-reduce run over ``n`` local GPUs with ``env`` added; never hangs this process."""
    run = {"env": env, "ok": False, "busbw_gbs": None, "error": None, "timeout": False}
    argv = [sys.executable, os.path.abspath(__file__), "--allreduce", str(n), backend, str(mib),
            str(iters)]
    # its own session: on a hang every worker it spawned is killed with it
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **env), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        import signal
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        run["timeout"] = True
        run["error"] = f"no answer within {timeout}s"
        return run
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = [ln for ln in (err or out).strip().splitlines() if ln.strip()][-3:]
        run["error"] = f"exit {proc.returncode}: " + " | ".join(tail)[:600]
        return run
    got = json.loads(lines[-1])
    run.update(ok=bool(got.get("ok")), busbw_gbs=got.get("busbw_gbs"),
               algbw_gbs=got.get("algbw_gbs"))
    if not run["ok"]:
        run["error"] = "wrong results: the sum differs from 1 + 2 + ... + n"
    return run


def _read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def parse_topology(text):
    """`nvidia-smi topo -m` -> {"i,j": link} for each GPU pair (NV#, PIX, PXB, PHB, NODE, SYS)."""
    rows = [ln.split() for ln in (text or "").splitlines() if re.match(r"^GPU\d+\s", ln)]
    links = {}
    for row in rows:
        i = int(row[0][3:])
        for j, cell in enumerate(row[1:1 + len(rows)]):
            if i != j and cell != "X":
                links[f"{i},{j}"] = cell
    return links


def measure_multi(torch, n):
    """What the multi-GPU tier judges: peer access per pair, the topology, NCCL all-reduce over
    every local GPU (again with NCCL_P2P_DISABLE=1 when it hangs or fails), /dev/shm, and the
    IOMMU/ACS evidence that breaks peer-to-peer on VMs."""
    p2p = [[i != j and bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)]
           for i in range(n)]
    topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
    try:
        shm = shutil.disk_usage("/dev/shm").total
    except OSError:
        shm = None
    groups = os.listdir("/sys/kernel/iommu_groups") if os.path.isdir("/sys/kernel/iommu_groups") else []
    acs = None
    if os.geteuid() == 0 and shutil.which("lspci"):  # ACS control is in config space: root only
        r = subprocess.run(["lspci", "-vvv"], capture_output=True, text=True, timeout=60)
        acs = len(re.findall(r"ACSCtl:.*SrcValid\+", r.stdout))
    cpuinfo = _read("/proc/cpuinfo", "")
    m = {"gpus": n, "p2p": p2p,
         "topology": parse_topology(topo.stdout) if topo.returncode == 0 else {},
         "shm_bytes": shm, "iommu_groups": len(groups), "acs_redirect": acs,
         "hypervisor": bool(re.search(r"^flags\s*:.*\bhypervisor\b", cpuinfo, re.MULTILINE)),
         "cmdline": (_read("/proc/cmdline", "") or "").strip()[:500],
         "nccl": bool(torch.distributed.is_available() and torch.distributed.is_nccl_available()),
         "allreduce": []}
    if m["nccl"]:
        first = _allreduce(n, {})
        m["allreduce"].append(first)
        if not first["ok"]:
            m["allreduce"].append(_allreduce(n, {"NCCL_P2P_DISABLE": "1"}))
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

    def check(name, status, reason, env=None):
        checks.append({"name": name, "status": status, "reason": reason, **({"env": env} if env else {})})

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
    if m.get("multi"):
        _judge_multi(m, th, check)
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


# NVLink, per link and direction, GB/s, by the GPU's compute capability (NVIDIA's NVLink pages:
# NVLink 1 on P100, 2 on V100, 3 on A100, 4 on H100, 5 on Blackwell; GA102's bridge, RTX 3090/A6000,
# has 4 links of 14.0625 GB/s)
NVLINK_GBS = {"6.0": 20.0, "7.0": 25.0, "8.0": 25.0, "8.6": 14.0625, "9.0": 25.0, "10.0": 50.0}
# PCIe, per lane and direction, GB/s, by generation (after line coding)
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
GEFORCE_NO_P2P = re.compile(r"RTX (40|50)\d0", re.IGNORECASE)  # GeForce Ada and Blackwell
SMALL_SHM = 1 << 30  # bytes: Docker's default is 64 MiB


def _pcie_gbs(smi_gpu):
    """The link each GPU can have (max gen x max width; the current one drops at idle)."""
    gen = int(_num(smi_gpu.get("pcie.link.gen.max")) or _num(smi_gpu.get("pcie.link.gen.current")))
    width = int(_num(smi_gpu.get("pcie.link.width.max")) or _num(smi_gpu.get("pcie.link.width.current")))
    return PCIE_LANE_GBS.get(gen, 0) * width or None


def expected_busbw(m):
    """What the topology allows an all-reduce (bus bandwidth, GB/s), and why: the slowest pair's
    NVLinks, else the slowest PCIe link (halved when peer-to-peer is off: every byte crosses PCIe
    twice, through host memory)."""
    mm = m["multi"]
    links = mm.get("topology") or {}
    n = mm.get("gpus") or 0
    caps = {g.get("capability") for g in m.get("gpus") or []}
    if links and all(v.startswith("NV") for v in links.values()) and len(caps) == 1:
        per = NVLINK_GBS.get(caps.pop())
        count = min(int(v[2:] or 1) for v in links.values())
        if per:
            return per * count, f"NVLink between every pair: {count} link(s) of {per:g} GB/s"
    pcie = [x for x in (_pcie_gbs(g) for g in (m.get("smi") or {}).get("gpus", [])) if x]
    if not pcie:
        return None, "no PCIe link figures"
    p2p = mm.get("p2p") or []
    all_p2p = bool(p2p) and all(p2p[i][j] for i in range(n) for j in range(n) if i != j)
    first = next((a for a in mm.get("allreduce") or [] if a.get("ok")), {})
    via_host = not all_p2p or (first.get("env") or {}).get("NCCL_P2P_DISABLE") == "1"
    low = min(pcie)
    return (low / 2, f"PCIe {low:.1f} GB/s per GPU, through host memory (no peer-to-peer)") \
        if via_host else (low, f"PCIe {low:.1f} GB/s per GPU, peer-to-peer")


def _judge_multi(m, th, check):
    """The multi-GPU tier: NCCL all-reduce works (else the trap and its fix), bus bandwidth
    against the topology, peer access per pair, /dev/shm. A check's "env" is the fix `run`
    applies."""
    mm = m["multi"]
    names = sorted({g["name"] for g in m.get("gpus") or []})
    n = mm.get("gpus") or len(m.get("gpus") or [])
    if mm.get("error"):
        check("multi-gpu", "fail", f"the multi-GPU measurements failed: {mm['error']}")
        return
    p2p = mm.get("p2p") or []
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    peer = [(i, j) for i, j in pairs if p2p and p2p[i][j] and p2p[j][i]]
    geforce = any(GEFORCE_NO_P2P.search(x) for x in names)
    vm_iommu = bool(mm.get("hypervisor") and mm.get("iommu_groups"))
    acs = bool(mm.get("acs_redirect"))
    if len(peer) == len(pairs):
        check("p2p", "pass", f"peer access between all {len(pairs)} GPU pair(s)")
    elif not peer:
        check("p2p", "pass", f"no peer access between any of the {len(pairs)} GPU pair(s): "
              "traffic between GPUs goes through host memory")
    else:
        have = ", ".join(f"{i}-{j}" for i, j in peer[:12]) or "none"
        check("p2p", "pass", f"peer access between {len(peer)} of {len(pairs)} GPU pair(s) "
              f"({have}); the others go through host memory")
    runs = mm.get("allreduce") or []
    if not mm.get("nccl"):
        check("nccl all-reduce", "warn", "this torch build has no NCCL: multi-GPU jobs fall back "
              "to gloo (slow)")
        return
    first = runs[0] if runs else {}
    if first.get("ok"):
        check("nccl all-reduce", "pass", f"{n} GPUs: results correct, bus bandwidth "
              f"{first.get('busbw_gbs')} GB/s")
        good = first
    else:
        fixed = next((r for r in runs[1:] if r.get("ok")), None)
        how = "hung (" + first["error"] + ")" if first.get("timeout") else \
            f"failed: {first.get('error')}"
        if geforce and peer:
            cause = (f"{', '.join(names)}: NVIDIA does not support peer-to-peer on GeForce RTX "
                     "40/50 cards, yet this driver reports it")
        elif acs or vm_iommu:
            cause = ("IOMMU/ACS redirect peer-to-peer traffic through the root complex " +
                     ("(a VM: the hypervisor's IOMMU)" if vm_iommu else
                      "(ACS is on in the PCIe switches: disable it in the BIOS)"))
        else:
            cause = "peer-to-peer between these GPUs does not work"
        if fixed is not None:
            check("nccl all-reduce", "warn", f"with peer-to-peer on it {how}; with "
                  f"NCCL_P2P_DISABLE=1 it works ({fixed.get('busbw_gbs')} GB/s): {cause}. "
                  "gpu-provision run sets NCCL_P2P_DISABLE=1", env={"NCCL_P2P_DISABLE": "1"})
            good = fixed
        else:
            last = runs[-1] if runs else first
            check("nccl all-reduce", "fail", f"NCCL all-reduce over {n} GPUs {how}; with "
                  f"NCCL_P2P_DISABLE=1 too ({last.get('error')}). Likely: {cause}")
            good = None
    shm = mm.get("shm_bytes")
    if shm is not None and shm < SMALL_SHM:
        check("/dev/shm", "warn", f"/dev/shm is {shm / 1048576:.0f} MiB (a container's default): "
              "NCCL's shared-memory transport fails with 'unhandled system error' and DataLoader "
              "workers with 'bus error'. Ask the platform for a larger shm (docker --shm-size); "
              "gpu-provision run sets NCCL_SHM_DISABLE=1 meanwhile", env={"NCCL_SHM_DISABLE": "1"})
    if good and good.get("busbw_gbs") is not None:
        want, basis = expected_busbw(m)
        if want:
            ratio = good["busbw_gbs"] / want
            low = ratio < th["min_bandwidth_ratio"]
            why = ""
            if low and (acs or vm_iommu):
                why = "; IOMMU/ACS on this host can route peer-to-peer through the root complex"
            check("multi-gpu bandwidth", "warn" if low else "pass",
                  f"all-reduce bus bandwidth {good['busbw_gbs']} GB/s of about {want:.0f} the "
                  f"topology allows ({ratio:.2f}; {basis}){why}")


def _num(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


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


if __name__ == "__main__" and sys.argv[1:2] == ["--allreduce"]:
    allreduce_main(int(sys.argv[2]), *sys.argv[3:4], *(int(x) for x in sys.argv[4:6]))
elif __name__ == "__main__":
    config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    started = time.perf_counter()
    result = report(measure(config), config, time.perf_counter() - started)
    print(json.dumps(result))
