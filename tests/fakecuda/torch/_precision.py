"""The stand-in torch's precision switches, as torch behaves (below: how, with the sources
for each rule): ``torch.backends.cuda.matmul`` (allow_tf32, fp32_precision from 2.9,
the reduced-precision reductions), ``torch.set_float32_matmul_precision`` and
``torch.backends.cudnn``, with TORCH_ALLOW_TF32_CUBLAS_OVERRIDE and NVIDIA_TF32_OVERRIDE read as
torch and NVIDIA's libraries read them. The torch version and the host come from the package.

- TF32 (compute capability 8.0 and newer): an fp32 matmul on tensor cores reads only the first
  10 bits of each input's mantissa (PyTorch, docs/source/notes/numerical_accuracy.rst and
  cuda.rst "TensorFloat-32 (TF32) on Ampere (and later) devices"). Whether it is used, as torch
  decides it (aten/src/ATen/Context.h/.cpp):
  * TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (NVIDIA's PyTorch container sets it): from torch 1.12
    (pytorch/pytorch#77114) to 1.13 it forces TF32 in cuBLAS whatever the setting says, and the
    getter reads True after ``allow_tf32 = False`` (pytorch/pytorch#100145, torch
    1.13.0a0+08820cb); from 2.0 (pytorch/pytorch#85859, "initialization only") it is only the
    starting value of float32_matmul_precision ("high"), which the setters change;
  * ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.set_float32_matmul_precision`` read and
    write one state (pytorch/pytorch#76509: "allow_tf32 getter and matmul precision getter
    should read the same underlying variable");
  * torch 2.9 adds ``torch.backends.cuda.matmul.fp32_precision`` ("ieee" | "tf32" | "none");
    the legacy getter then warns, and raises once the new API set the state (Context.cpp
    allowTF32CuBLAS: "mix of the legacy and new APIs");
  * NVIDIA_TF32_OVERRIDE=0 keeps cuBLAS from TF32 whatever torch asks (NVIDIA's CUDA libraries'
    environment variable).
"""

from __future__ import annotations

import os
import warnings
from typing import Any


def _pkg() -> Any:
    import torch  # the stand-in package itself: its version and its host, read when asked
    return torch


def _truthy(name: str) -> bool:
    """c10::utils::check_env: 1/ON/YES/TRUE/Y (any case) is true."""
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE", "Y")


def _version() -> tuple[int, int]:
    return _pkg()._version_tuple(_pkg().__version__)  # type: ignore[no-any-return]


class _Matmul:
    """torch.backends.cuda.matmul, as the torch version of the host file behaves (docstring)."""

    def __init__(self) -> None:
        object.__setattr__(self, "_precision", "highest")
        object.__setattr__(self, "_new_api", None)  # fp32_precision as set through the new API
        object.__setattr__(self, "allow_fp16_reduced_precision_reduction", True)
        object.__setattr__(self, "allow_bf16_reduced_precision_reduction", True)

    def _start(self) -> None:
        if _truthy("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") and _version() >= (2, 0):
            object.__setattr__(self, "_precision", "high")  # initialization only

    def _forced(self) -> bool:
        """torch 1.12-1.13: the environment variable wins over every setting."""
        return _truthy("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") and _version() < (2, 0)

    def _tf32_in_cublas(self) -> bool:
        _pkg()._h()
        if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
            return False
        if self._forced():
            return True
        if self._new_api is not None:
            return bool(self._new_api == "tf32")
        return bool(self._precision != "highest")

    def __getattr__(self, name: str) -> Any:
        _pkg()._h()
        if name == "allow_tf32":
            if _version() >= (2, 9):
                warnings.warn("Please use the new API settings to control TF32 behavior, such as "
                              "torch.backends.cuda.matmul.fp32_precision = 'ieee'", UserWarning, stacklevel=2)
                if self._new_api is not None:
                    raise RuntimeError("PyTorch is checking whether allow_tf32 is enabled for cuBlas "
                                       "matmul,Current status indicate that you have used mix of the "
                                       "legacy and new APIs to set the TF32 status for cublas matmul.")
            return self._forced() or self._precision != "highest"
        if name == "fp32_precision" and _version() >= (2, 9):
            return self._new_api or "none"
        if name == "allow_fp16_accumulation" and _version() >= (2, 7):  # off unless turned on
            return bool(self.__dict__.get("_fp16_acc", False))
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        _pkg()._h()
        if name == "allow_tf32":
            object.__setattr__(self, "_precision", "high" if value else "highest")
            object.__setattr__(self, "_new_api", None)
        elif name == "fp32_precision" and _version() >= (2, 9):
            if value not in ("ieee", "tf32", "none"):
                raise RuntimeError(f"Invalid precision {value}")
            object.__setattr__(self, "_new_api", None if value == "none" else value)
        elif name in ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"):
            object.__setattr__(self, name, bool(value))
        elif name == "allow_fp16_accumulation" and _version() >= (2, 7):
            object.__setattr__(self, "_fp16_acc", bool(value))
        else:
            raise AttributeError(name)


def set_float32_matmul_precision(precision: str) -> None:
    if precision not in ("highest", "high", "medium"):
        raise RuntimeError(f"Invalid precision {precision}")
    object.__setattr__(backends.cuda.matmul, "_precision", precision)
    object.__setattr__(backends.cuda.matmul, "_new_api", None)


def get_float32_matmul_precision() -> str:
    _pkg()._h()
    return str(backends.cuda.matmul._precision)


class _Cudnn:
    allow_tf32 = True
    enabled = True


class _BackendsCuda:
    matmul = _Matmul()


class backends:  # noqa: N801
    cuda = _BackendsCuda()
    cudnn = _Cudnn()


