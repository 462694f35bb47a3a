"""gpu-provision validation, the verdict rules of the sustained load (sustained.py): pure
functions of the measurements, beside gpu_verdict.py (Python 3.8+, standard library only).

Each GPU loaded together with all the others is judged:
- against the best of its siblings of the same model: within SIBLING_TOLERANCE (10%), as
  huggingface/gpu-fryer judges ("If the TFLOPS are within tflops_tolerance% of the best
  performing GPU, test will pass [default: 10]");
- against its model's healthy sustained floor (gpu_perf.yaml, the same floor as the per-GPU
  figures: 0.7 of a published sustained figure, else the recipe's min_tflops_ratio of the peak);
- against itself: the last seconds against the first (a drop over DROP, 15%, is heat or power
  catching up with it);
- by the clock-event reasons nvidia-smi reported during the load: hw_slowdown,
  hw_thermal_slowdown, hw_power_brake_slowdown (the board or the power supply pulled the clocks
  down) and sw_thermal_slowdown warn; sw_power_cap is the card at its power limit, as designed;
- a rate above MEASUREMENT_ERROR x the datasheet peak is a timing that missed the work, never a
  healthy figure; a GPU with no rate is "not measured" and fails.
"""

from __future__ import annotations

from typing import Any, Callable

Check = Callable[..., None]
SIBLING_TOLERANCE = 0.10
DROP = 0.15
MEASUREMENT_ERROR = 1.25
HARD_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def steady(series: list[float]) -> float | None:
    """The sustained rate: the median of the second half of the load (the first half includes
    the warm-up the card's clocks and heat need)."""
    if not series:
        return None
    return _median(series[len(series) // 2:])


def _num(value: Any) -> float | None:
    try:
        return float(str(value).split()[0])
    except (TypeError, ValueError, IndexError):
        return None


def readings(samples: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """"SM clock 1410-1980 MHz, power up to 698/700 W, up to 81 C", and every reason seen."""
    def span(key: str) -> tuple[float, float] | None:
        got = [x for x in (_num(s.get(key)) for s in samples) if x is not None]
        return (min(got), max(got)) if got else None
    parts = []
    clock, power, temp = span("clocks.sm"), span("power.draw"), span("temperature.gpu")
    top = span("clocks.max.sm")
    if clock:
        parts.append(f"SM clock {clock[0]:g}-{clock[1]:g}" + (f"/{top[1]:g}" if top else "") + " MHz")
    if power:
        limit = span("power.limit")
        parts.append(f"power up to {power[1]:g}" + (f"/{limit[1]:g}" if limit else "") + " W")
    if temp:
        parts.append(f"up to {temp[1]:g} C")
    seen: list[str] = []
    for s in samples:
        for r in s.get("reasons") or []:
            if r not in seen:
                seen.append(r)
    return ", ".join(parts), seen


def judge_sustained(m: dict[str, Any], refs: dict[str, Any], check: Check,
                    share: Callable[[dict[str, Any]], float], min_ratio: float = 0.5) -> None:
    """``min_ratio``: the recipe's min_tflops_ratio, the floor's share of the peak for a model
    without a published sustained figure (as the per-GPU speed check judges it)."""
    s = m.get("sustained")
    if not s:
        return
    gpus = s.get("gpus") or []
    dtype = s.get("dtype", "bf16")
    rates = {g["index"]: steady(g.get("tflops") or []) for g in gpus}
    measured = [g for g in gpus if rates.get(g["index"])]
    check("sustained load", "pass" if measured else "fail",
          f"{len(gpus)} GPU(s) loaded together with {dtype} matmuls for {s.get('seconds'):g} s of GPU "
          f"time ({s.get('wall_s')} s)" + ("" if measured else ": nothing was measured"))
    for g in gpus:
        i, name = g["index"], str(g.get("name"))
        rate = rates.get(i)
        if not rate:
            check(f"gpu {i} sustained", "fail", f"{name}: not measured under sustained load"
                  + (f": {g['error']}" if g.get("error") else ""))
            continue
        ref = refs.get(name) or {}
        scale = share(g)
        peak = ((ref.get("peak") or {}).get(dtype) or 0) * scale
        floor = ((ref.get("floor") or {}).get(dtype) or 0) * scale or min_ratio * peak
        series = g.get("tflops") or []
        first, last = _median(series[:3]), _median(series[-3:])
        siblings = [x for x in measured if str(x.get("name")) == name]
        best = max(siblings, key=lambda x: rates[x["index"]] or 0)
        best_rate = rates[best["index"]] or rate
        said, seen = readings(g.get("samples") or [])
        what = (f"{name}: {dtype} {rate:.1f} TFLOPS sustained over {g.get('seconds'):g} s (first "
                f"{first:.1f}, last {last:.1f}"
                + (f"; the best of {len(siblings)} is GPU {best['index']} at {best_rate:.1f}"
                   if len(siblings) > 1 else "") + (f"; floor {floor:.1f}" if floor else "") + ")"
                + (f"; {said}" if said else "") + (f"; clocks held by {', '.join(seen)}" if seen else ""))
        problems = []
        if peak and rate > MEASUREMENT_ERROR * peak:
            problems.append(f"{rate / peak:.2f}x the datasheet peak {peak:.1f}: a measurement error, "
                            "not a faster card")
        else:
            if len(siblings) > 1 and rate < (1 - SIBLING_TOLERANCE) * best_rate:
                problems.append(f"{1 - rate / best_rate:.0%} below the best of its siblings")
            if floor and rate < floor:
                problems.append("below this model's healthy sustained floor")
            if last < (1 - DROP) * first:
                problems.append(f"it slowed {1 - last / first:.0%} as the load went on")
            hard = [r for r in seen if r in HARD_REASONS]
            if hard:
                problems.append(f"{', '.join(hard)} during the load (the board, its cooling or the power "
                                "supply pulled the clocks down)")
        if problems:
            check(f"gpu {i} sustained", "warn", f"{'; '.join(problems)}: {what}")
        else:
            check(f"gpu {i} sustained", "pass", what)
