"""gpu-provision validation, the multi-GPU measurements (2+ GPUs): NCCL all-reduce over every
local GPU down a ladder of one setting at a time, peer access, the topology, /dev/shm, the
IOMMU/ACS evidence, compute modes; and the fabric manager's state when CUDA does not start.
Shipped beside validate_gpu.py (Python 3.8+, torch only); gpu_verdict_multi.py judges it.

`nccl_check.py --allreduce N [backend] [MiB] [iters]` is one all-reduce run: one process per
GPU, one JSON line. It runs in a subprocess with a time limit that covers start-up (a broken
peer-to-peer path hangs NCCL) in its own session, so a hang ends with every worker.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

# the ladder, each setting alone (gpu_verdict_multi.py says why each one)
LADDER: list[dict[str, str]] = [{}, {}, {"NCCL_SHM_DISABLE": "1"}, {"NCCL_CUMEM_ENABLE": "0"},
                                {"NCCL_P2P_DISABLE": "1"}]
FIRST_TIMEOUT = 90  # seconds: the first start spawns N workers that each import torch
LATER_TIMEOUT = 60
STAGES = ("started", "init", "all-reduce", "done")
NCCL_WARN = re.compile(r"(?:\S+\.cc:\d+ )?NCCL WARN .*")


def _run(argv: list[str], timeout: float = 30) -> dict[str, Any]:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"rc": 127, "out": "", "err": str(exc)}
    return {"rc": r.returncode, "out": r.stdout, "err": r.stderr}


def _read(path: str, default: str = "") -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def fabric() -> dict[str, Any]:
    """On NVSwitch boards CUDA waits for the fabric manager: its service state and version, and
    the fabric state per GPU (None where the tool or the field is missing)."""
    said = _run(["systemctl", "is-active", "nvidia-fabricmanager"])["out"].strip()  # exits 3 when inactive
    word = said.splitlines()[0] if said else ""
    m = re.search(r"version is\s*:\s*(\S+)", _run(["nv-fabricmanager", "--version"])["out"])
    st = _run(["nvidia-smi", "--query-gpu=fabric.state,fabric.status", "--format=csv,noheader"])
    return {"manager": word if re.fullmatch(r"[a-z-]+", word) else None,
            "version": m.group(1) if m else None,
            "states": [ln.strip() for ln in st["out"].strip().splitlines()]
            if st["rc"] == 0 and st["out"].strip() else None}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stage(rank: int, what: str) -> None:
    print(f"gp-stage {rank} {what}", file=sys.stderr, flush=True)


def _allreduce_worker(rank: int, n: int, backend: str, port: int, held: bool, mib: int, iters: int,
                      queue: Any) -> None:
    _stage(rank, "started")
    import torch
    import torch.distributed as dist
    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
    _stage(rank, "init")
    if held:  # the spawner holds the port: its TCPStore is the rendezvous, no race for the port
        store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=LATER_TIMEOUT))
        dist.init_process_group(backend, store=store, rank=rank, world_size=n)
    else:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    x = torch.full((mib * 1048576 // 4,), float(rank + 1), device=dev)
    _stage(rank, "all-reduce")
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
    _stage(rank, "done")
    dist.destroy_process_group()


def allreduce_main(args: list[str]) -> None:
    n = int(args[0])
    backend = args[1] if len(args) > 1 else "nccl"
    mib, iters = (int(args[2]) if len(args) > 2 else 64), (int(args[3]) if len(args) > 3 else 20)
    import torch.distributed as dist
    import torch.multiprocessing as mp
    held, store = True, None
    try:  # a port chosen by the kernel and held by this process until the workers are done
        store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=LATER_TIMEOUT),
                              wait_for_workers=False)
        port = int(store.port)
    except (TypeError, RuntimeError, ValueError):  # an old torch: a free port, then let go
        held, port = False, _free_port()
    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_allreduce_worker, args=(n, backend, port, held, mib, iters, queue),
                       nprocs=n, join=True, start_method="spawn")
    print(json.dumps(queue.get()))
    del store


def _stage_of(err: str) -> str | None:
    """The stage the slowest worker had reached."""
    last: dict[str, str] = {}
    for m in re.finditer(r"^gp-stage (\d+) (\S+)$", err, re.M):
        last[m.group(1)] = m.group(2)
    if not last:
        return "start-up (spawning the workers)"
    return min(last.values(), key=lambda s: STAGES.index(s) if s in STAGES else 0)


def allreduce(n: int, env: dict[str, str], backend: str = "nccl", mib: int = 64, iters: int = 20,
              timeout: float = FIRST_TIMEOUT) -> dict[str, Any]:
    """One all-reduce run over ``n`` local GPUs with ``env`` added (NCCL_DEBUG=WARN unless set,
    so a failure is said in NCCL's words); never hangs this process."""
    run: dict[str, Any] = {"env": env, "ok": False, "busbw_gbs": None, "error": None, "timeout": False,
                           "stage": None, "nccl_warn": None}
    argv = [sys.executable, os.path.abspath(__file__), "--allreduce", str(n), backend, str(mib), str(iters)]
    full = dict(os.environ, NCCL_DEBUG=os.environ.get("NCCL_DEBUG", "WARN"), **env)
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = proc.communicate()
        run.update(timeout=True, error=f"no answer within {timeout:g}s", stage=_stage_of(err or ""))
    run["seconds"] = round(time.perf_counter() - started, 1)
    warn = NCCL_WARN.search(err or "")
    run["nccl_warn"] = warn.group(0)[:300] if warn else None
    if run["timeout"]:
        return run
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = [ln for ln in (err or out).strip().splitlines()
                if ln.strip() and not ln.startswith("gp-stage")][-3:]
        run["error"] = f"exit {proc.returncode}: " + " | ".join(tail)[:600]
        run["stage"] = _stage_of(err or "")
        return run
    got = json.loads(lines[-1])
    run.update(ok=bool(got.get("ok")), busbw_gbs=got.get("busbw_gbs"), algbw_gbs=got.get("algbw_gbs"))
    if not run["ok"]:
        run["error"] = "wrong results: the sum differs from 1 + 2 + ... + n"
    return run


def ladder(n: int, backend: str = "nccl") -> list[dict[str, Any]]:
    """The all-reduce as it is, again as it is, then each setting alone, until one works."""
    runs: list[dict[str, Any]] = []
    for k, env in enumerate(LADDER):
        runs.append(allreduce(n, env, backend, timeout=FIRST_TIMEOUT if k == 0 else LATER_TIMEOUT))
        if runs[-1]["ok"]:
            break
    return runs


def measure_multi(torch: Any, n: int, smi: dict[str, Any]) -> dict[str, Any]:
    """What the multi-GPU tier judges. The all-reduce runs first, before this process opens a
    CUDA context: on a GPU in Exclusive_Process mode a context of ours would lock NCCL's worker
    out ("all CUDA-capable devices are busy or unavailable")."""
    nccl = bool(torch.distributed.is_available() and torch.distributed.is_nccl_available())
    m: dict[str, Any] = {"gpus": n, "nccl": nccl, "allreduce": ladder(n) if nccl else [],
                         "exclusive": [r.get("index") for r in smi.get("gpus") or []
                                       if str(r.get("compute_mode", "")).lower() == "exclusive_process"]}
    try:
        m["p2p"] = [[i != j and bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)]
                    for i in range(n)]
    except Exception as exc:
        m["p2p"], m["p2p_error"] = [], f"{type(exc).__name__}: {exc}"[:200]
    topo = _run(["nvidia-smi", "topo", "-m"])
    m["topology"] = _parse_topology(topo["out"]) if topo["rc"] == 0 else {}
    try:
        m["shm_bytes"] = shutil.disk_usage("/dev/shm").total
    except OSError:
        m["shm_bytes"] = None
    groups = os.listdir("/sys/kernel/iommu_groups") if os.path.isdir("/sys/kernel/iommu_groups") else []
    m["iommu_groups"] = len(groups)
    m["acs_redirect"] = None
    if os.geteuid() == 0 and shutil.which("lspci"):  # ACS control is in config space: root only
        r = _run(["lspci", "-vvv"], timeout=60)
        m["acs_redirect"] = len(re.findall(r"ACSCtl:.*SrcValid\+", r["out"])) if r["rc"] == 0 else None
    m["hypervisor"] = bool(re.search(r"^flags\s*:.*\bhypervisor\b", _read("/proc/cpuinfo"), re.MULTILINE))
    m["cmdline"] = _read("/proc/cmdline").strip()[:500]
    return m


def _parse_topology(text: str) -> dict[str, str]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_verdict_multi
    return gpu_verdict_multi.parse_topology(text)


if __name__ == "__main__" and sys.argv[1:2] == ["--allreduce"]:
    allreduce_main(sys.argv[2:])
