"""The verdict rules' invariants over generated measurements (templates/gpu/gpu_verdict*.py, pure
functions): no PASS without a measurement, a ratio above the measurement-error bound is never
healthy, a GPU behind its siblings under sustained load is never healthy."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.gpu_payload import FIX, payload

gv = payload("gpu_verdict")
speed = payload("gpu_verdict_speed")
held = payload("gpu_verdict_sustained")
CASE = json.loads((FIX / "8xh100-one-throttled.json").read_text())
REF = next(iter(CASE["config"]["reference"].values()))
TYPES = ("fp32", "tf32", "bf16", "fp16")
WHY = st.sampled_from(["RuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB",
                       "RuntimeError: CUDA error: unspecified launch failure",
                       "the CUDA events timed no GPU time: the work did not run on this device",
                       "not measured: NVIDIA_TF32_OVERRIDE=0 keeps cuBLAS from TF32"])


def _checks(m: dict[str, Any], cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in gv.judge(m, cfg)}


@settings(max_examples=200, deadline=None)
@given(measured=st.sets(st.sampled_from(TYPES)), why=WHY, ratio=st.floats(0.01, 1.2),
       mem=st.one_of(st.none(), st.floats(100, 3000)), h2d=st.one_of(st.none(), st.floats(1, 60)))
def test_no_pass_without_a_measurement(measured: set[str], why: str, ratio: float,
                                       mem: float | None, h2d: float | None) -> None:
    m = copy.deepcopy(CASE["measurements"])
    g = m["gpus"][0]
    m["gpus"] = [g]
    m["smi"]["gpus"] = [r for r in m["smi"]["gpus"] if r.get("uuid") == g.get("uuid")] or m["smi"]["gpus"][:1]
    m.pop("multi", None)
    g["tflops"] = {t: round(ratio * REF["peak"][t], 1) for t in measured}
    g["unmeasured"] = {t: why for t in TYPES if t not in measured}
    g["notes"] = [f"{t}: {why}" for t in TYPES if t not in measured]
    g["mem_gbs"], g["h2d_gbs"] = mem, h2d
    for name, value in (("mem", mem), ("h2d", h2d)):
        if value is None:
            g["unmeasured"][name] = why
    cfg = {**CASE["config"], "expected_gpus": 1}
    checks = _checks(m, cfg)
    s = checks["gpu 0 speed"]
    if not measured:
        assert s["status"] == "fail" and "not measured" in s["reason"]
    if set(TYPES) - measured:  # an H100 runs all four: one missing is never a pass
        assert s["status"] != "pass" and "not measured" in s["reason"]
    if mem is None:
        assert checks["gpu 0 memory bandwidth"]["status"] != "pass"
    if h2d is None:
        assert checks["gpu 0 bandwidth"]["status"] != "pass"
    if not measured or mem is None or h2d is None or set(TYPES) - measured:
        assert gv.verdict(list(checks.values())) != "PASS"


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from(TYPES), over=st.floats(1.0001, 50.0),
       mig=st.sampled_from([None, "3g.40gb", "1g.10gb", "1c.3g.71gb"]))
def test_a_figure_past_the_measurement_error_bound_is_never_healthy(dtype: str, over: float,
                                                                    mig: str | None) -> None:
    g = copy.deepcopy(CASE["measurements"]["gpus"][0])
    g["name"] = f"NVIDIA H100 80GB HBM3 MIG {mig}" if mig else "NVIDIA H100 80GB HBM3"
    g["sms"] = {None: 132, "3g.40gb": 60, "1g.10gb": 16, "1c.3g.71gb": 60}[mig]
    share = speed.mig_share(g, REF) or 1.0
    g["tflops"][dtype] = round(REF["peak"][dtype] * share * speed.MEASUREMENT_ERROR * over + 0.1, 1)
    said: list[tuple[str, str, str]] = []
    speed.judge_speed(g, REF, {"min_tflops_ratio": 0.5}, lambda *a, **k: said.append(a))
    assert said[0][1] != "pass" and "measurement error" in said[0][2]
    mem_share = speed.mig_memory_share(g, REF) or 1.0
    g["mem_gbs"] = round(REF["mem_gbs"] * mem_share * speed.MEASUREMENT_ERROR * over + 1, 1)
    said.clear()
    speed.judge_memory(g, REF, {"min_bandwidth_ratio": 0.5}, lambda *a, **k: said.append(a))
    assert said[0][1] == "warn" and "measurement error" in said[0][2]


def _sustained(rates: list[list[float]], names: list[str] | None = None) -> dict[str, Any]:
    return {"seconds": 20, "dtype": "bf16", "wall_s": 25, "gpus": [
        {"index": i, "uuid": f"GPU-{i}", "name": (names or [])[i] if names else "NVIDIA H100 80GB HBM3",
         "tflops": r, "seconds": 20.0, "samples": [], "error": None} for i, r in enumerate(rates)]}


def _held(m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    held.judge_sustained(m, {"NVIDIA H100 80GB HBM3": REF}, lambda n, s, r, **k: out.update(
        {n: {"status": s, "reason": r}}), lambda g: 1.0)
    return out


@settings(max_examples=200, deadline=None)
@given(base=st.floats(600, 900), n=st.integers(2, 8), behind=st.floats(0.0, 0.6),
       rounds=st.integers(2, 40), noise=st.floats(0, 0.02))
def test_a_gpu_behind_its_siblings_under_load_is_never_healthy(base: float, n: int, behind: float,
                                                               rounds: int, noise: float) -> None:
    rates = [[base * (1 - noise * (k % 2)) for k in range(rounds)] for _ in range(n)]
    slow = [r * (1 - behind) for r in rates[-1]]
    rates[-1] = slow
    checks = _held({"sustained": _sustained(rates)})
    steady = held.steady(slow) or 0
    best = max(held.steady(r) or 0 for r in rates)
    if steady < (1 - held.SIBLING_TOLERANCE) * best:
        assert checks[f"gpu {n - 1} sustained"]["status"] != "pass"
    if steady < REF["floor"]["bf16"]:
        assert checks[f"gpu {n - 1} sustained"]["status"] != "pass"


@settings(max_examples=100, deadline=None)
@given(over=st.floats(1.0001, 20.0), rounds=st.integers(1, 30))
def test_a_sustained_rate_past_the_bound_is_never_healthy(over: float, rounds: int) -> None:
    rate = REF["peak"]["bf16"] * held.MEASUREMENT_ERROR * over + 0.1
    checks = _held({"sustained": _sustained([[rate] * rounds])})
    assert checks["gpu 0 sustained"]["status"] != "pass"
    assert "measurement error" in checks["gpu 0 sustained"]["reason"]


def test_a_gpu_without_a_sustained_rate_is_not_measured() -> None:
    m = {"sustained": _sustained([[700.0] * 5, []])}
    m["sustained"]["gpus"][1]["error"] = "RuntimeError: CUDA error: an illegal memory access"
    checks = _held(m)
    assert checks["gpu 1 sustained"]["status"] == "fail"
    assert "not measured" in checks["gpu 1 sustained"]["reason"]


def test_caps_each_named_with_its_cost() -> None:
    caps = payload("gpu_verdict_health")
    rows = [{"index": "0", "enforced.power.limit": "700.00", "power.default_limit": "700.00",
             "power.max_limit": "700.00", "persistence_mode": "Enabled", "compute_mode": "Default",
             "clocks.applications.graphics": "[Requested functionality has been deprecated]"},
            {"index": "1", "enforced.power.limit": "450.00", "power.default_limit": "400.00",
             "power.max_limit": "450.00", "persistence_mode": "Disabled", "compute_mode": "Default",
             "clocks.applications.graphics": "1410", "clocks.default_applications.graphics": "1755"},
            {"index": "2", "enforced.power.limit": "700.00", "power.default_limit": "700.00",
             "persistence_mode": "Enabled", "compute_mode": "Prohibited"}]
    said: list[tuple[str, str, str]] = []
    caps.judge_caps({"smi": {"caps": rows[:1]}}, lambda *a, **k: said.append(a))
    assert said[-1] == ("gpu caps", "pass", "power limit at its default (700 W)")
    caps.judge_caps({"smi": {"caps": rows[:2]}}, lambda *a, **k: said.append(a))
    assert said[-1][1] == "warn" and said[-1][2].startswith(
        "GPU 1: application clocks set to 1410 MHz of the default 1755 MHz: kernels run no faster than "
        "that (nvidia-smi -rac, root, resets them); GPU 1: power limit raised to 450 W above its default "
        "400 W; persistence mode off on GPU 1")
    caps.judge_caps({"smi": {"caps": rows}}, lambda *a, **k: said.append(a))
    assert said[-1][1] == "fail" and said[-1][2].startswith("GPU 2: compute mode Prohibited: no process "
                                                            "may use this GPU")
