"""gpu-provision validation, the node under sustained load: every GPU loaded AT ONCE with large
matmuls for a given time, each GPU's rate per second of load and nvidia-smi's clocks, power,
temperature and clock-event reasons sampled during it. Shipped beside validate_gpu.py
(Python 3.8+, torch only, passed in); gpu_verdict_sustained.py judges it.

Why at once and for long: a failing fan or heat sink takes tens of seconds to throttle a card,
and a power supply that cannot feed every GPU together only shows when they all draw together
(NVML's HW power brake slowdown, https://docs.nvidia.com/deploy/nvml-api/
group__nvmlClocksEventReasons.html); the per-GPU figures load one GPU for about a second. As
huggingface/gpu-fryer does: large matmuls on every GPU, each judged against the best of its
siblings (within 10%).

How: one thread launches rounds of work on every GPU (kernel launches are asynchronous, so the
GPUs run together), each round about ROUND_MS of one GPU's time, timed by that GPU's own
events; nvidia-smi is started after a round is launched and read while the next one runs, so
every sample is taken under load, whatever nvidia-smi's start-up costs. A round is at most
MAX_LAUNCHES kernels per GPU (the matrices grow on a fast GPU instead, the same n for every
GPU of one model, as they are judged against each other), launched a CHUNK at a
time on each GPU in turn: a launch blocks the launching thread once a stream holds about a
thousand pending kernels (CUDA's launch queue; its size is not documented), so 1500 small
launches on one GPU would keep the others waiting, and a B200 runs an 8192 matmul in half a
millisecond.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import precision  # noqa: E402
from gpu_smi import REASONS  # noqa: E402

ROUND_MS = 1000.0
MAX_LAUNCHES, CHUNK = 200, 25
SIZES = (8192, 16384, 32768)  # n of the n x n matmuls, grown until a round fits MAX_LAUNCHES
SAMPLE_FIELDS = "uuid,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"


def _sampler(prefix: str | None) -> list[str]:
    return SAMPLE_FIELDS.split(",") + [f"{prefix}.{r}" for r in REASONS if prefix]


def _start(fields: list[str]) -> subprocess.Popen[str] | None:
    try:
        return subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(fields)}",
                                 "--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None


def _collect(proc: subprocess.Popen[str], fields: list[str], t: float,
             samples: dict[str, list[dict[str, Any]]], wait: float) -> bool:
    """The sampler's rows, if it has answered (waiting at most ``wait`` s), into ``samples``."""
    try:
        out, _ = proc.communicate(timeout=wait)
    except subprocess.TimeoutExpired:
        return False
    for line in out.strip().splitlines() if proc.returncode == 0 else []:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            continue
        row = dict(zip(fields, cells))
        uuid = row.pop("uuid")
        reasons = [k.split(".")[-1] for k, v in list(row.items()) if "reasons" in k and v.lower() == "active"]
        row = {k: v for k, v in row.items() if "reasons" not in k}
        samples.setdefault(uuid, []).append({"t": round(t, 1), **row, "reasons": reasons})
    return True


def _setup(torch: Any, g: dict[str, Any], dtype: Any, sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    """The matrices on GPU g and a batch that takes about ROUND_MS there, in at most
    MAX_LAUNCHES kernels where the GPU's memory allows matrices that large (3 n x n, a tenth of
    the free memory at most); ``sizes``: the n tried, smallest first."""
    with torch.cuda.device(g["index"]):
        free = _free_bytes(torch)
        a = b = None
        per = 1.0
        for n in sizes:
            a = torch.randn(n, n, device="cuda", dtype=dtype)
            b = torch.randn(n, n, device="cuda", dtype=dtype)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a @ b
            start.record()
            for _ in range(3):
                a @ b
            end.record()
            end.synchronize()
            per = max(start.elapsed_time(end) / 3, 1e-3)
            bigger = n * 2
            if (ROUND_MS / per <= MAX_LAUNCHES or n == sizes[-1]
                    or 3 * bigger * bigger * getattr(a.dtype, "itemsize", 2) > free / 10):
                break
            a = b = None  # the smaller matrices freed before the larger ones
    # (a round of a GPU whose memory kept n small is shorter than ROUND_MS, never more kernels)
    return {"g": g, "a": a, "b": b, "flop": 2 * n ** 3, "n": n, "free": free,
            "batch": max(1, min(int(ROUND_MS / per), MAX_LAUNCHES)),
            "tflops": [], "ms": 0.0, "error": None, "events": None}


def _same_size(torch: Any, work: list[dict[str, Any]], dtype: Any) -> None:
    """Siblings of one model are judged against each other (the best within 10%), so they run
    the one n: the median of what each chose (one throttled card does not choose for the
    others), where its memory allows it."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for w in work:
        if not w["error"]:
            by_name.setdefault(str(w["g"].get("name")), []).append(w)
    for group in by_name.values():
        ns = sorted(w["n"] for w in group)
        n = ns[len(ns) // 2]
        members = {id(w) for w in group}
        for i, w in enumerate(work):
            fits = w.get("n", 0) > n or 3 * n * n * 2 <= w.get("free", 0) / 10
            if id(w) in members and w["n"] != n and fits:
                w["a"] = w["b"] = None
                try:
                    work[i] = _setup(torch, w["g"], dtype, (n,))
                except Exception as exc:  # noqa: BLE001
                    w["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"


def _free_bytes(torch: Any) -> float:
    try:
        return float(torch.cuda.mem_get_info()[0])
    except Exception:  # noqa: BLE001 - an older torch: the smallest size only
        return 0.0


def _launch(torch: Any, live: list[dict[str, Any]]) -> None:
    """One round on every GPU: CHUNK kernels on each in turn until each has its batch, so that
    no GPU's queue holds the thread while the others wait for their work."""
    left = {id(w): w["batch"] for w in live}
    for w in live:
        _on(torch, w, lambda w: w.__setitem__("events", (_record(torch), None)))
    while any(n > 0 for n in left.values()):
        for w in live:
            n = min(CHUNK, left[id(w)])
            if n > 0:
                left[id(w)] -= n
                _on(torch, w, lambda w, n=n: [w["a"] @ w["b"] for _ in range(n)])
    for w in live:
        _on(torch, w, lambda w: w.__setitem__("events", (w["events"][0], _record(torch))))


def _record(torch: Any) -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _on(torch: Any, w: dict[str, Any], what: Any) -> None:
    """``what(w)`` on GPU w's device, unless it failed: then it stops, and the others go on."""
    if w["error"]:
        return
    try:
        with torch.cuda.device(w["g"]["index"]):
            what(w)
    except Exception as exc:  # noqa: BLE001 - this GPU stops; the others go on
        w["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"


def _finish(torch: Any, w: dict[str, Any]) -> None:
    if w["error"] or not w["events"] or w["events"][1] is None:
        return
    try:
        with torch.cuda.device(w["g"]["index"]):
            start, end = w["events"]
            end.synchronize()
            ms = start.elapsed_time(end)
        if ms > 0:
            w["ms"] += ms
            w["tflops"].append(round(w["flop"] * w["batch"] / (ms / 1000) / 1e12, 1))
    except Exception as exc:  # noqa: BLE001
        w["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"


def measure(torch: Any, gpus: list[dict[str, Any]], seconds: float, prefix: str | None) -> dict[str, Any]:
    """{"seconds", "dtype", "wall_s", "gpus": [{"index", "uuid", "name", "tflops": [per round],
    "seconds", "n" (of the n x n matmuls), "launches_per_round", "samples": [{"t", "clocks.sm",
    ..., "reasons"}], "error"}]}"""
    major = min((int(str(g["capability"]).split(".")[0]) for g in gpus), default=0)
    name, dtype = ("bf16", torch.bfloat16) if major >= 8 else ("fp16", torch.float16)
    out: dict[str, Any] = {"seconds": seconds, "dtype": name, "gpus": [], "wall_s": None}
    saved = precision.save(torch)
    precision.set_reduced(torch, True)
    work: list[dict[str, Any]] = []
    for g in gpus:
        try:
            work.append(_setup(torch, g, dtype))
        except Exception as exc:  # noqa: BLE001
            work.append({"g": g, "tflops": [], "ms": 0.0, "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                         "events": None})
    _same_size(torch, work, dtype)
    fields, samples = _sampler(prefix), {}  # type: list[str], dict[str, list[dict[str, Any]]]
    t0 = time.perf_counter()
    wall_bound = t0 + seconds * 1.5 + 30
    proc: subprocess.Popen[str] | None = None
    asked_at = 0.0
    try:
        while time.perf_counter() < wall_bound:
            live = [w for w in work if not w["error"]]
            if not live or all(w["ms"] >= seconds * 1000 for w in live):
                break
            _launch(torch, live)
            done = sum(w["ms"] for w in live) / len(live) / 1000  # seconds of load so far
            if proc is not None and _collect(proc, fields, asked_at, samples, ROUND_MS / 1000):
                proc = None
            if proc is None:
                proc, asked_at = _start(fields), done
            for w in live:
                _finish(torch, w)
    finally:
        if proc is not None:
            proc.kill()
            proc.communicate()
        precision.restore(torch, saved)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    for w in work:
        g = w["g"]
        key = g.get("parent_uuid") or g.get("uuid")
        out["gpus"].append({"index": g["index"], "uuid": g.get("uuid"), "name": g.get("name"),
                            "tflops": w["tflops"], "seconds": round(w["ms"] / 1000, 1),
                            "n": w.get("n"), "launches_per_round": w.get("batch"),
                            "samples": samples.get(str(key), []), "error": w["error"]})
    return out
