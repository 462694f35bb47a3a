"""gpu-provision validation, one GPU's figures: correctness against the CPU, matmul TFLOPS per
type, device-memory and host-to-device bandwidth, each with the readings nvidia-smi took while
the work ran. Shipped beside validate_gpu.py (Python 3.8+, torch only, passed in).

The rules a measurement on real hardware needs:
- every figure on the device it names: inside ``torch.cuda.device(i)``, timed by CUDA events
  recorded on that device's current stream (torch.cuda.Event.record uses
  torch.cuda.current_stream(), https://docs.pytorch.org/docs/stable/generated/torch.cuda.Event.html);
- sustained: at least WARMUP_S of the same work first, then at least MEASURE_S timed, the matrix
  size chosen from a probe so one figure stays within FIGURE_BOUND_S (Pascal's fp16 runs at 1/64);
- read under load: nvidia-smi is started after the warm-up and the work goes on until it has
  answered (at most READ_BOUND_S): without persistence mode each nvidia-smi start initialises
  the GPU first, 1-3 s (https://docs.nvidia.com/deploy/driver-persistence/), and a reading taken
  after the work ended is idle's (P8, PCIe gen 1). The link is read during the host-to-device copy
  it judges, the clocks during the heaviest matmul;
- each figure's precision switches set for it (precision.py) and what was in effect recorded.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import precision  # noqa: E402
from gpu_smi import load_fields, start_load_query, under_load  # noqa: E402

WARMUP_S = 0.3
MEASURE_S = 1.0
FIGURE_BOUND_S = 4.0  # wall-clock bound on one figure, whatever the GPU
READ_BOUND_S = 10.0  # how long the work waits for nvidia-smi's reading under it
U_FP32, U_TF32 = 2.0 ** -24, 2.0 ** -11  # unit roundoff: fp32 (24-bit significand), TF32 (11-bit)


def _timed(torch: Any, work: Any, seconds: float, deadline: float, hold: Any = None) -> dict[str, Any]:
    """Runs ``work`` (which queues GPU work on the current device) in batches between two events
    of the current device until the events have timed ``seconds`` of GPU time and ``hold`` (a
    process reading the GPU) has exited, or the wall deadline passed: {"ms", "calls"}."""
    ms, calls, batch = 0.0, 0, 1
    while (ms < seconds * 1000 or (hold is not None and hold.poll() is None)) \
            and time.perf_counter() < deadline:
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
           reading: Any = None) -> dict[str, Any]:
    """Rate of ``work`` (``per_call`` units each: FLOPs or bytes), sustained: a warm-up of at least
    WARMUP_S, then at least MEASURE_S timed, during which ``reading()`` (an nvidia-smi process,
    or None) is started and waited for. {"rate", "seconds", "calls", "error", "read"}: "read" is
    (the process, whether it answered while the work still ran)."""
    deadline = time.perf_counter() + deadline_s
    _timed(torch, work, WARMUP_S, deadline)
    proc = reading() if reading is not None else None
    got = _timed(torch, work, MEASURE_S, max(deadline, time.perf_counter() + READ_BOUND_S)
                 if proc is not None else deadline, hold=proc)
    out: dict[str, Any] = {"read": (proc, proc is not None and proc.poll() is not None)}
    if got["ms"] <= 0:
        return {**out, "rate": None, "seconds": 0.0, "calls": got["calls"],
                "error": "the CUDA events timed no GPU time: the work did not run on this device"}
    return {**out, "rate": per_call * got["calls"] / (got["ms"] / 1000),
            "seconds": round(got["ms"] / 1000, 2), "calls": got["calls"], "error": None}


def matmul_figure(torch: Any, dtype: Any, reading: Any = None) -> dict[str, Any]:
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
    got = figure(torch, lambda: a @ b, 2 * n ** 3, reading=reading)
    got["n"] = n
    got["tflops"] = round(got.pop("rate") / 1e12, 1) if got.get("rate") else None
    return got


def correctness(torch: Any, a: Any, dev: Any, mode: str) -> dict[str, Any]:
    """The GPU's fp32 product of ``a`` with itself against the CPU's in float64, judged by the
    error bound of the precision it ran in (``mode``: "ieee", or "tf32" where the environment
    forces it): |GPU - exact| <= 2 (2u_in + K u_fp32) (|A| |A|) elementwise, the forward error
    bound of a dot product of K terms whose inputs were rounded to u_in (Higham, "Accuracy and
    Stability of Numerical Algorithms", 3.1), with a factor 2 to spare. A wrong GPU is off by
    the size of the result, far past it; a healthy one in TF32 is inside it."""
    k = int(a.shape[1])
    u_in = U_TF32 if mode == "tf32" else 0.0
    gamma = 2 * (2 * u_in + k * U_FP32 / (1 - k * U_FP32) + U_FP32)
    exact = a.double() @ a.double()
    scale = a.double().abs() @ a.double().abs()
    got = (a.to(dev) @ a.to(dev)).cpu().double()
    err = (got - exact).abs()
    ok = bool((err <= scale * gamma).all().item())
    return {"ok": ok, "mode": mode, "bound": gamma,
            "worst": round(float((err / (scale * gamma)).max().item()), 4)}


def gpu_figures(torch: Any, i: int, cap_major: int, uuid: str | None,
                reasons: str | None = "clocks_event_reasons") -> dict[str, Any]:
    """Every figure of GPU ``i`` on GPU ``i``: matmul TFLOPS per type (the heaviest first, the
    clocks read under it), device-memory and host-to-device bandwidth (the link read under the
    copy). Each figure is independent: one that fails is a note and "unmeasured", not the end."""
    out: dict[str, Any] = {"tflops": {}, "figures": {}, "mem_gbs": None, "h2d_gbs": None,
                           "under_load": {}, "link": {}, "notes": [], "unmeasured": {}}
    saved = precision.save(torch)
    fields = load_fields(reasons)
    order: list[tuple[str, Any, bool | None]] = [("fp16", torch.float16, None)]
    if cap_major >= 8:
        order += [("bf16", torch.bfloat16, None), ("tf32", torch.float32, True)]
    order += [("fp32", torch.float32, False)]

    def reading() -> Any:
        return start_load_query(uuid, fields) if uuid else None

    try:
        with torch.cuda.device(i):
            for name, dtype, tf32 in order:
                why = _cannot(torch, name, tf32)
                if why:
                    out["unmeasured"][name] = why
                    out["notes"].append(f"{name}: {why}")
                    continue
                _measure(torch, out, name, lambda d=dtype, first=not out["under_load"]:
                         matmul_figure(torch, d, reading if first else None))
            out["mem_gbs"] = _bandwidth(torch, out, "mem", lambda: _device_copy(torch))
            out["h2d_gbs"] = _bandwidth(torch, out, "h2d", lambda: _host_copy(torch, reading))
    finally:
        precision.restore(torch, saved)  # the switches are process-wide
    return out


def _cannot(torch: Any, name: str, tf32: bool | None) -> str | None:
    """Set this figure's switches; why it cannot be measured as its type here, else None."""
    precision.set_reduced(torch, True)  # torch's default for fp16/bf16 GEMMs, said explicitly
    if tf32 is None:
        return None
    precision.set_fp32(torch, tf32)
    env = os.environ
    if tf32 and env.get("NVIDIA_TF32_OVERRIDE") == "0":
        return "not measured: NVIDIA_TF32_OVERRIDE=0 keeps cuBLAS from TF32 (this environment sets it)"
    if not tf32 and precision.fp32_mode(torch) == "tf32":
        value = env.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")
        return (f"not measured: TORCH_ALLOW_TF32_CUBLAS_OVERRIDE={value}"
                f" makes torch {torch.__version__} run every fp32 matmul in TF32 (NVIDIA's PyTorch "
                "container sets it; torch 2.0 and later let the setting win)")
    return None


def _measure(torch: Any, out: dict[str, Any], name: str, measure_fn: Any) -> None:
    try:
        got = measure_fn()
        proc, answered = got.pop("read", (None, False))
        out["figures"][name] = got
        out["tflops"][name] = got["tflops"]
        if got.get("error"):
            out["notes"].append(f"{name}: {got['error']}")
            out["unmeasured"][name] = got["error"]
        if proc is not None:
            if not answered:  # it would answer for an idle GPU now: not a reading of the load
                proc.kill()
            out["under_load"] = {**under_load(proc, load_fields_of(proc)), "during": name,
                                 "answered_under_load": answered}
    except Exception as exc:  # one type failing ("no kernel image") is a note
        out["notes"].append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
        out["unmeasured"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        _empty_cache(torch, out)


def load_fields_of(proc: Any) -> str:
    return str(next(a for a in proc.args if a.startswith("--query-gpu=")).split("=", 1)[1])


def _empty_cache(torch: Any, out: dict[str, Any]) -> None:
    try:
        torch.cuda.empty_cache()
    except Exception as exc:  # a sticky CUDA error: every later call on the device fails too
        out["notes"].append(f"empty_cache: {type(exc).__name__}: {str(exc)[:200]}")


def _bandwidth(torch: Any, out: dict[str, Any], name: str, measure_fn: Any) -> float | None:
    try:
        got = measure_fn()
    except Exception as exc:
        out["notes"].append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
        out["unmeasured"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return None
    finally:
        _empty_cache(torch, out)
    proc, answered = got.pop("read", (None, False))
    if proc is not None:  # the link under the copy it judges: PCIe drops to gen 1 at idle
        if not answered:
            proc.kill()
        read = under_load(proc, load_fields_of(proc))
        out["link"] = {**{k: v for k, v in read.items() if k.startswith("pcie.")},
                       "answered_under_load": answered} if read else {}
    out["figures"][name] = got
    if got.get("error"):
        out["notes"].append(f"{name}: {got['error']}")
        out["unmeasured"][name] = got["error"]
        return None
    return round(float(got["rate"]) / 1e9, 1)


def _device_copy(torch: Any) -> dict[str, Any]:
    """Device-memory bandwidth: a copy reads and writes every byte (2 x size per copy)."""
    free, _ = torch.cuda.mem_get_info()
    size = int(min(1 << 30, free // 8)) // 4 * 4
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return figure(torch, lambda: dst.copy_(src), 2 * size)


def _host_copy(torch: Any, reading: Any = None) -> dict[str, Any]:
    """Host-to-device from pinned memory, the link read while it runs."""
    size = 256 << 20
    host = torch.empty(size, dtype=torch.uint8).pin_memory()
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    return figure(torch, lambda: dev.copy_(host, non_blocking=True), size, reading=reading)


def cpu_gflops(torch: Any, n: int = 1024, reps: int = 5) -> float:
    a = torch.randn(n, n)
    a @ a  # warm-up: the first call allocates and picks the BLAS kernel
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ a
    return reps * 2 * n ** 3 / max(time.perf_counter() - t0, 1e-9) / 1e9
