"""gpu-provision validation, the verdict rules of one GPU's figures: correctness, matmul speed per
type, device-memory and host-to-device bandwidth. Pure functions of the measurements
(gpu_figures.py), beside gpu_verdict.py (Python 3.8+, standard library only).

A figure that was not measured is never a pass: the speed check FAILS when no type was measured
(or a CUDA error stopped one), WARNS when a type this GPU should run was not, naming why (an
error, or the environment: NVIDIA_TF32_OVERRIDE=0, TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 on an older
torch); a bandwidth that was not measured is its own warning. A figure above MEASUREMENT_ERROR x
the datasheet peak is a timing that missed the work, never healthy.
"""

from __future__ import annotations

import re
from typing import Any, Callable

Check = Callable[..., None]
# measured/peak above this: the timing missed the work, not a fast card. GeForce cards boost past
# the clock their datasheet peak assumes: healthy RTX 5090s are published at 1.16x theirs
# (zzc0721/torch-performance-test-data, 242.18 bf16 against 209.5), so "about 1.15" is 1.25 here
MEASUREMENT_ERROR = 1.25
# PCIe, per lane and direction, GB/s after line coding (PCI-SIG: 2.5/5/8/16/32/64 GT/s)
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
H2D_OF_LINK = 0.75  # pinned host-to-device copies reach about 3/4 of the link (nvbandwidth, bandwidthTest)
MIG_NAME = re.compile(r"\bMIG\s+(?:\d+c\.)?(\d+)g\.(\d+)gb\b", re.IGNORECASE)
CUDA_ERROR = re.compile(r"CUDA error|cudaError|illegal memory access|launch failure|ECC error", re.I)
TYPES = ("fp32", "tf32", "bf16", "fp16")


def num(value: Any) -> float | None:
    """A number nvidia-smi printed, or None: "[N/A]", "[Not Supported]", "N/A", "" are unknown,
    never 0 (an idle link or a card without the sensor is not a zero)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(?:[A-Za-z%]+)?\s*", str(value or ""))
    return float(m.group(1)) if m else None


def mig_share(g: dict[str, Any], ref: dict[str, Any] | None) -> float | None:
    """The compute share of the whole GPU a MIG instance has: its SMs over the GPU's (torch reads
    the instance's multiprocessor count), else its compute slices over 7."""
    m = MIG_NAME.search(str(g.get("name") or ""))
    if not m:
        return None
    if g.get("sms") and ref and ref.get("sms"):
        return float(g["sms"]) / float(ref["sms"])
    return int(m.group(1)) / 7.0


def mig_memory_share(g: dict[str, Any], ref: dict[str, Any] | None) -> float | None:
    """The memory share of a MIG instance: its GPU instance's memory over the GPU's. Memory
    bandwidth follows the memory slices, not the compute ones: 1g.20gb on an 80 GB H100 has 1/7
    of the SMs and 1/4 of the memory, and compute instances (1c.3g.71gb) share their GPU
    instance's memory (NVIDIA MIG user guide, "Supported MIG Profiles")."""
    m = MIG_NAME.search(str(g.get("name") or "")) or MIG_NAME.search("MIG " + str(g.get("mig_profile") or ""))
    if not m:
        return None
    total = (ref or {}).get("memory_gb")
    if total:
        return min(1.0, int(m.group(2)) / float(total))
    return mig_share(g, ref)


def _clocks(g: dict[str, Any]) -> str:
    load = g.get("under_load") or {}
    if not num(load.get("clocks.sm")) and not num(load.get("power.limit")):
        return ""
    parts = [f"under load: SM clock {load.get('clocks.sm', '?')}/{load.get('clocks.max.sm', '?')} MHz"]
    if num(load.get("power.draw")) is not None:
        parts.append(f"power {load.get('power.draw')}/{load.get('power.limit', '?')} W")
    elif num(load.get("power.limit")) is not None:
        parts.append(f"power limit {load.get('power.limit')} W")
    if num(load.get("temperature.gpu")) is not None:
        parts.append(f"{load.get('temperature.gpu')} C")
    if load.get("reasons"):
        parts.append("clocks held by " + ", ".join(load["reasons"]))
    if load.get("answered_under_load") is False:
        parts.append("read after the work ended")
    return "; " + ", ".join(parts)


def judge_correctness(g: dict[str, Any], check: Check) -> None:
    i = g["index"]
    c = g.get("correctness") or {}
    ok = g.get("matmul_ok")
    if not c:
        check(f"gpu {i} matmul", "pass" if ok else "fail",
              "matches the CPU result" if ok else "differs from the CPU result")
        return
    how = ("in TF32, which this environment forces on fp32 matmuls (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE)"
           if c.get("mode") == "tf32" else "in IEEE fp32")
    if ok:
        check(f"gpu {i} matmul", "pass", f"matches the CPU result {how}: the worst element is "
              f"{c.get('worst')} of the error bound")
    else:
        check(f"gpu {i} matmul", "fail", f"differs from the CPU result {how}: the worst element is "
              f"{c.get('worst')} x the error bound ({c.get('bound', 0):.1e} x |A||B|)")


def unmeasured(g: dict[str, Any]) -> dict[str, str]:
    """Why each figure was not measured: the measurement's own "unmeasured", else its notes
    ("bf16: RuntimeError: ...", as recorded before it existed)."""
    out = dict(g.get("unmeasured") or {})
    for note in g.get("notes") or []:
        name, _, why = str(note).partition(": ")
        if name in TYPES + ("mem", "h2d") and name not in out:
            out[name] = why
    return out


def required(g: dict[str, Any], ref: dict[str, Any]) -> list[str]:
    """The types this GPU should run and the reference has a peak for: fp16 and fp32 on every
    GPU, bf16 and tf32 from compute capability 8.0."""
    major = int(str(g.get("capability") or "0.0").split(".")[0])
    want = ["fp32", "fp16"] + (["tf32", "bf16"] if major >= 8 else [])
    return [t for t in want if (ref.get("peak") or {}).get(t)]


def judge_speed(g: dict[str, Any], ref: dict[str, Any] | None, th: dict[str, Any], check: Check) -> None:
    i, name = g["index"], g["name"]
    got = {k: v for k, v in (g.get("tflops") or {}).items() if v is not None}
    missing = unmeasured(g)
    notes = "; ".join(g.get("notes") or [])
    if not ref or not any((ref.get("peak") or {}).values()):
        measured = ", ".join(f"{k} {v}" for k, v in got.items())
        check(f"gpu {i} speed", "pass" if got else "fail",
              f"{name}: {measured or 'not measured'} TFLOPS; no reference figures for this model to "
              f"compare with{_clocks(g)}" + (f" ({notes})" if notes else ""))
        return
    share = mig_share(g, ref)
    scale = share or 1.0
    parts, slow, wrong = [], [], []
    for dtype, value in got.items():
        peak = (ref.get("peak") or {}).get(dtype)
        if not peak:
            continue
        peak *= scale
        floor = (ref.get("floor") or {}).get(dtype)
        if floor:  # from the model's published sustained figure
            floor *= scale
            parts.append(f"{dtype} {value} (floor {floor:.1f} of peak {peak:.1f})")
        else:
            floor = th["min_tflops_ratio"] * peak
            parts.append(f"{dtype} {value} (floor {floor:.1f} = {th['min_tflops_ratio']} x peak {peak:.1f})")
        if value > MEASUREMENT_ERROR * peak:
            wrong.append(f"{dtype} {value} is {value / peak:.2f}x the datasheet peak")
        elif value < floor:
            slow.append(dtype)
    what = f"{name}" + (f", a MIG instance with {scale:.2f} of the GPU" if share else "")
    gaps = {t: missing.get(t, "no figure") for t in required(g, ref) if t not in got}
    gap = "; not measured: " + "; ".join(f"{t} ({why})" for t, why in gaps.items()) if gaps else ""
    if not got:
        check(f"gpu {i} speed", "fail", f"{what}: not measured: no type gave a figure ("
              + ("; ".join(f"{t}: {why}" for t, why in missing.items()) or "no figure was recorded") + ")")
    elif any(CUDA_ERROR.search(w) for w in gaps.values()):
        check(f"gpu {i} speed", "fail", f"{what}: a CUDA error stopped a figure ({'; '.join(parts)}){gap}")
    elif wrong:
        check(f"gpu {i} speed", "warn", f"{what}: {'; '.join(wrong)}: a measurement error (the "
              f"timing did not cover the work), not a faster card ({'; '.join(parts)}){gap}")
    elif slow:
        check(f"gpu {i} speed", "warn", f"{what}: {', '.join(slow)} below the healthy floor for "
              f"this model: throttled, power-capped, shared or not the card it claims to be "
              f"({'; '.join(parts)}){gap}{_clocks(g)}")
    elif gaps:
        check(f"gpu {i} speed", "warn", f"{what}: every measured figure at or above the healthy floor "
              f"({'; '.join(parts)}){gap}{_clocks(g)}")
    else:
        check(f"gpu {i} speed", "pass", f"{what}: every figure at or above the healthy floor "
              f"({'; '.join(parts)}){_clocks(g)}")


def judge_memory(g: dict[str, Any], ref: dict[str, Any] | None, th: dict[str, Any], check: Check) -> None:
    got, want = g.get("mem_gbs"), (ref or {}).get("mem_gbs")
    if got is None:
        why = unmeasured(g).get("mem")
        if why:
            check(f"gpu {g['index']} memory bandwidth", "warn", f"not measured: {why}")
        return
    if not want:
        return
    share = mig_memory_share(g, ref) or 1.0
    want *= share
    ratio = got / want
    status = "warn" if ratio < th["min_bandwidth_ratio"] or ratio > MEASUREMENT_ERROR else "pass"
    why = "" if status == "pass" else ("; a measurement error" if ratio > MEASUREMENT_ERROR else
                                       "; slower memory than this model has")
    of = f" ({share:.2f} of the GPU's memory)" if share < 1 else ""
    check(f"gpu {g['index']} memory bandwidth", status,
          f"device copy {got} GB/s of the datasheet's {want:.0f}{of} ({ratio:.2f}){why}")


def judge_h2d(g: dict[str, Any], row: dict[str, Any], th: dict[str, Any], check: Check) -> None:
    """Host-to-device against the link the GPU has during the copy (PCIe drops to gen 1 at idle),
    and that link against the GPU's own maximum."""
    got = g.get("h2d_gbs")
    if got is None:
        why = unmeasured(g).get("h2d")
        if why:
            check(f"gpu {g['index']} bandwidth", "warn", f"host-to-device not measured: {why}")
        return
    link = g.get("link") or {}
    gen, width = num(link.get("pcie.link.gen.current")), num(link.get("pcie.link.width.current"))
    top_gen = num(link.get("pcie.link.gen.max") or row.get("pcie.link.gen.max"))
    top_width = num(link.get("pcie.link.width.max") or row.get("pcie.link.width.max"))
    unread = ("nvidia-smi answered after the copy ended, so the link it read is idle's"
              if link.get("answered_under_load") is False else
              "the link's generation and width were not read" if not gen or not width else "")
    if unread:
        # the figure is judged against the GPU's own best link instead: a slot, riser or BIOS
        # that gives it less still shows as a copy too slow for the card
        if not top_gen or not top_width:
            check(f"gpu {g['index']} bandwidth", "pass", f"host-to-device {got} GB/s (not judged: "
                  f"{unread}, and the GPU's own maximum link is unknown)")
            return
        best = PCIE_LANE_GBS.get(int(top_gen), 0.0) * top_width * H2D_OF_LINK
        if best > 0 and got < th["min_bandwidth_ratio"] * best:
            check(f"gpu {g['index']} bandwidth", "warn", f"host-to-device {got} GB/s, slow for "
                  f"this GPU's PCIe gen {top_gen:g} x{top_width:g} (about {best:.0f} expected): "
                  f"a narrower link than the card's, or throttled pinned memory ({unread})")
        else:
            check(f"gpu {g['index']} bandwidth", "pass", f"host-to-device {got} GB/s, as this "
                  f"GPU's PCIe gen {top_gen:g} x{top_width:g} gives ({unread})")
        return
    assert gen and width  # (unread otherwise)
    want = PCIE_LANE_GBS.get(int(gen), 0.0) * width * H2D_OF_LINK
    said = f"host-to-device {got} GB/s on PCIe gen {gen:g} x{width:g} (about {want:.0f} expected)"
    narrow = bool(top_gen and top_width and (gen < top_gen or width < top_width))
    low = want > 0 and got < th["min_bandwidth_ratio"] * want
    if narrow:
        said += (f"; the GPU can do gen {top_gen:g} x{top_width:g}: the slot, riser or BIOS gives "
                 "it less")
    if low:
        said += "; slow even for this link (pinned memory throttled, or the link retrains)"
    check(f"gpu {g['index']} bandwidth", "warn" if narrow or low else "pass", said)
