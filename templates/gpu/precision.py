"""gpu-provision validation, the precision switches: every check sets the ones its figure depends
on, whatever the image's environment or torch's defaults, and says what was really in effect.
Shipped beside validate_gpu.py (Python 3.8+, torch only, passed in).

The switches (PyTorch, docs/source/notes/cuda.rst, "TensorFloat-32 (TF32) on Ampere (and later)
devices" and "Reduced Precision Reduction in FP16 GEMMs"):
- fp32 matmuls on tensor cores (TF32, a 10-bit mantissa): ``torch.backends.cuda.matmul.
  fp32_precision`` ("ieee" | "tf32") from torch 2.9, where the legacy ``allow_tf32`` warns and
  its getter raises once the two APIs are mixed (aten/src/ATen/Context.cpp allowTF32CuBLAS);
  before it ``allow_tf32`` and ``torch.set_float32_matmul_precision``, one state;
- the same for convolutions: ``torch.backends.cudnn.conv.fp32_precision`` / ``cudnn.allow_tf32``;
- fp16/bf16 GEMMs with reduced-precision split-K reductions:
  ``allow_fp16_reduced_precision_reduction`` / ``allow_bf16_reduced_precision_reduction``;
- fp16 GEMMs accumulating in fp16 (``allow_fp16_accumulation``, torch 2.7+, "Full FP16
  Accumulation in FP16 GEMMs", pytorch/pytorch#144441): about twice the fp16 TFLOPS on consumer
  cards, so it is always off here; a process that turned it on would report a card twice as
  fast as its datasheet, and a less exact one.
The environment can overrule them:
- TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (NVIDIA's PyTorch container sets it: MONAI, "Precision and
  Accelerating", https://docs.monai.io/en/stable/precision_accelerating.html): torch 1.12-1.13
  use TF32 in cuBLAS whatever the setting (pytorch/pytorch#77114; the getter reads True after
  ``allow_tf32 = False``, pytorch/pytorch#100145); from 2.0 it only starts the setting at "high"
  (pytorch/pytorch#85859, "initialization only");
- NVIDIA_TF32_OVERRIDE=0 keeps NVIDIA's libraries from TF32 whatever torch asks.
So what is in effect is read back after setting, and the environment's words are recorded.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

ENV_RECORDED = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_TF32_OVERRIDE",
                "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "TORCH_ALLOW_TF32_CNMATMUL_OVERRIDE",
                "CUBLAS_WORKSPACE_CONFIG", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_MPS_PIPE_DIRECTORY")
TRUE = ("1", "ON", "YES", "TRUE", "Y")  # what c10::utils::check_env reads as set


def environment() -> dict[str, str | None]:
    """The variables that change what a figure measures (ENV_RECORDED and every NCCL_*): their
    effect is then named, not blamed on the hardware."""
    out: dict[str, str | None] = {k: os.environ.get(k) for k in ENV_RECORDED}
    out.update({k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")})
    return out


def override_forces_tf32(env: Any = None) -> bool:
    value = (env if env is not None else os.environ).get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")
    return str(value or "").strip().upper() in TRUE


def _matmul(torch: Any) -> Any:
    return torch.backends.cuda.matmul


def _new_api(torch: Any) -> bool:
    return hasattr(_matmul(torch), "fp32_precision")


def save(torch: Any) -> dict[str, Any]:
    """The switches as the process had them, to put back: inside a try, as reading the legacy
    getter raises where the user's code mixed the two APIs."""
    state: dict[str, Any] = {}
    m = _matmul(torch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("fp32_precision", "allow_fp16_reduced_precision_reduction",
                     "allow_bf16_reduced_precision_reduction", "allow_fp16_accumulation"):
            try:
                if hasattr(m, name):
                    state[name] = getattr(m, name)
            except Exception:  # noqa: BLE001 - an unreadable switch is not put back
                pass
        if not _new_api(torch):
            try:
                state["allow_tf32"] = bool(m.allow_tf32)
            except Exception:  # noqa: BLE001
                pass
        getter = getattr(torch, "get_float32_matmul_precision", None)
        if getter is not None and not _new_api(torch):
            try:
                state["float32_matmul_precision"] = getter()
            except Exception:  # noqa: BLE001
                pass
    return state


def restore(torch: Any, state: dict[str, Any]) -> None:
    m = _matmul(torch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, value in state.items():
            try:
                if name == "float32_matmul_precision":
                    torch.set_float32_matmul_precision(value)
                elif name != "allow_tf32" or "float32_matmul_precision" not in state:
                    setattr(m, name, value)
            except Exception:  # noqa: BLE001 - putting back is best effort
                pass


def set_fp32(torch: Any, tf32: bool) -> None:
    """fp32 matmuls in TF32 or in IEEE fp32, through the API this torch has."""
    m = _matmul(torch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if _new_api(torch):
            m.fp32_precision = "tf32" if tf32 else "ieee"
            return
        if hasattr(torch, "set_float32_matmul_precision"):
            torch.set_float32_matmul_precision("high" if tf32 else "highest")
        m.allow_tf32 = tf32


def set_conv(torch: Any, tf32: bool) -> None:
    """fp32 convolutions (cuDNN) in TF32 or IEEE: ``torch.backends.cudnn.conv.fp32_precision``
    from 2.9, else ``torch.backends.cudnn.allow_tf32`` (torch's default: TF32 allowed)."""
    cudnn = getattr(torch.backends, "cudnn", None)
    if cudnn is None:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conv = getattr(cudnn, "conv", None)
        try:
            if conv is not None and hasattr(conv, "fp32_precision"):
                conv.fp32_precision = "tf32" if tf32 else "ieee"
            else:
                cudnn.allow_tf32 = tf32
        except Exception:  # noqa: BLE001 - a torch without the switch runs its default
            pass


def set_reduced(torch: Any, allowed: bool = True) -> None:
    """fp16/bf16 split-K reductions (torch's default: allowed); fp16 accumulation always off
    (torch's default)."""
    m = _matmul(torch)
    for name, value in (("allow_fp16_reduced_precision_reduction", allowed),
                        ("allow_bf16_reduced_precision_reduction", allowed),
                        ("allow_fp16_accumulation", False)):
        if hasattr(m, name):
            try:
                setattr(m, name, value)
            except Exception:  # noqa: BLE001 - older torch: the reduction is not configurable
                pass


def tf32_in_effect(torch: Any) -> bool | None:
    """Whether fp32 matmuls run in TF32 now, as torch reads it back (None: unreadable)."""
    m = _matmul(torch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if _new_api(torch):
                return str(m.fp32_precision) == "tf32"
            return bool(m.allow_tf32)
        except Exception:  # noqa: BLE001
            return None


def torch_version(torch: Any) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", str(getattr(torch, "__version__", "0.0")))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def fp32_mode(torch: Any, env: Any = None) -> str:
    """How an fp32 matmul runs after ``set_fp32(torch, False)``: "ieee", or "tf32" where the
    environment forces it (the override on torch < 2.0, or a getter that still reads True)."""
    env = env if env is not None else os.environ
    if env.get("NVIDIA_TF32_OVERRIDE") == "0":
        return "ieee"
    if override_forces_tf32(env) and torch_version(torch) < (2, 0):
        return "tf32"
    return "tf32" if tf32_in_effect(torch) else "ieee"
