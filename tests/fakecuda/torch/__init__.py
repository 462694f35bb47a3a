"""A stand-in for torch on a machine without GPUs: the CUDA parts validate_gpu.py and
bench_gpu.py use, behaving as CUDA does where their answers depend on it. Tensors carry no
numbers, only what was computed from what (so a correct matmul compares equal to the CPU's);
each device has a stream whose clock advances by the work queued on it, at the rates the host
file gives. The host file is JSON, named by $FAKE_CUDA_HOST:
  {"devices": [{"name", "uuid" (8-4-4-4-12, as torch prints it), "pci_bus", "major", "minor",
                "total_memory", "sms", "tflops": {"fp16", "bf16", "tf32", "fp32"}, "mem_gbs",
                "h2d_gbs", "wrong": bool}],
   "arch_list": [...], "nccl": bool, "version": "2.5.1+cu124", "cuda": "12.4"}

The CUDA behaviour copied, with its source:
- a CUDA event is recorded on the current stream of the CURRENT device, and an event records
  only on streams of the device it was first recorded on (torch.cuda.Event.record: "Uses
  torch.cuda.current_stream() if no stream is specified. The stream's device must match the
  event's device", https://docs.pytorch.org/docs/stable/generated/torch.cuda.Event.html);
  elapsed_time is the stream time between two records of one device;
- devices are numbered fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, then filtered and
  reordered by CUDA_VISIBLE_DEVICES (indices in that order, or GPU-/MIG- UUIDs), read once when
  CUDA starts (CUDA C++ Programming Guide, "CUDA Environment Variables");
- ``device="cuda"`` is the current device; a kernel runs on its tensors' device and two
  tensors on different devices are refused.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator
from typing import Any

__version__ = "2.5.1+cu124"
_ids = itertools.count()


class _DType:
    def __init__(self, name: str, size: int) -> None:
        self.name, self.itemsize = name, size

    def __repr__(self) -> str:
        return f"torch.{self.name}"


float16, bfloat16, float32, float64, uint8 = (_DType("float16", 2), _DType("bfloat16", 2),
                                              _DType("float32", 4), _DType("float64", 8),
                                              _DType("uint8", 1))
half, float, double = float16, float32, float64


class device:  # noqa: N801 - torch's name
    def __init__(self, kind: str, index: int | None = None) -> None:
        if ":" in kind:
            kind, idx = kind.split(":")
            index = int(idx)
        self.type, self.index = kind, index

    def __repr__(self) -> str:
        return f"device(type='{self.type}', index={self.index})"


class version:  # noqa: N801
    cuda: str | None = "12.4"


class Generator:
    def __init__(self) -> None:
        self.seed = next(_ids)

    def manual_seed(self, seed: int) -> Generator:
        self.seed = seed
        return self


class _Host:
    """The GPUs of the host file, ordered and filtered as CUDA does when it starts."""

    def __init__(self) -> None:
        path = os.environ.get("FAKE_CUDA_HOST")
        self.doc: dict[str, Any] = json.load(open(path)) if path else {"devices": []}
        devs = list(self.doc.get("devices") or [])
        if os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
            devs.sort(key=lambda d: d.get("pci_bus", ""))
        else:  # FASTEST_FIRST, CUDA's default
            devs.sort(key=lambda d: (-max((d.get("tflops") or {}).values() or [0]), d.get("pci_bus", "")))
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            chosen = []
            for item in (x.strip() for x in visible.split(",")):
                if item.isdigit() and int(item) < len(devs):
                    chosen.append(devs[int(item)])
                elif item.startswith(("GPU-", "MIG-")):
                    hit = [d for d in devs if f"{d.get('prefix', 'GPU')}-{d['uuid']}".startswith(item)]
                    if not hit:
                        break
                    chosen.append(hit[0])
                else:
                    break  # CUDA stops at the first invalid entry
            devs = chosen
        self.devices = devs
        self.clock = [0.0] * len(devs)  # ms of work queued on each device's stream
        self.current = 0


_host: _Host | None = None


def _h() -> _Host:
    global _host
    if _host is None:
        _host = _Host()
        version.cuda = _host.doc.get("cuda", "12.4")
    return _host


class Tensor:
    def __init__(self, shape: tuple[int, ...], dtype: _DType, dev: int | None, expr: Any,
                 pinned: bool = False) -> None:
        self.shape, self.dtype, self.dev, self.expr, self.pinned = shape, dtype, dev, expr, pinned

    @property
    def device(self) -> device:
        return device("cpu") if self.dev is None else device("cuda", self.dev)

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __matmul__(self, other: Tensor) -> Tensor:
        if self.dev != other.dev:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least "
                               f"two devices, {self.device} and {other.device}!")
        n, k, m = self.shape[0], self.shape[1], other.shape[1]
        expr: Any = ("mm", self.expr, other.expr)
        if self.dev is not None:
            d = _h().devices[self.dev]
            kind = {"float16": "fp16", "bfloat16": "bf16"}.get(self.dtype.name, "fp32")
            if kind == "fp32" and backends.cuda.matmul.allow_tf32 and d.get("major", 0) >= 8:
                kind = "tf32"
            rate = (d.get("tflops") or {}).get(kind)
            if not rate:
                raise RuntimeError("CUDA error: no kernel image is available for execution on the device")
            _h().clock[self.dev] += 2 * n * k * m / (rate * 1e12) * 1000
            if d.get("wrong"):
                expr = ("garbage", next(_ids))
        return Tensor((n, m), self.dtype, self.dev, expr)

    def to(self, dev: Any) -> Tensor:
        return Tensor(self.shape, self.dtype, _index(dev), self.expr)

    def cpu(self) -> Tensor:
        return Tensor(self.shape, self.dtype, None, self.expr)

    def double(self) -> Tensor:
        return Tensor(self.shape, float64, self.dev, self.expr)

    def float(self) -> Tensor:
        return Tensor(self.shape, float32, self.dev, self.expr)

    def pin_memory(self) -> Tensor:
        return Tensor(self.shape, self.dtype, None, self.expr, pinned=True)

    def copy_(self, src: Tensor, non_blocking: bool = False) -> Tensor:
        size = src.numel() * src.dtype.itemsize
        if self.dev is not None:
            d = _h().devices[self.dev]
            if src.dev == self.dev:  # device to device: every byte read and written
                _h().clock[self.dev] += 2 * size / (d["mem_gbs"] * 1e9) * 1000
            elif src.dev is None:
                _h().clock[self.dev] += size / (d["h2d_gbs"] * (1 if src.pinned else 0.5) * 1e9) * 1000
        self.expr = src.expr
        return self


def _index(dev: Any) -> int | None:
    if dev is None or dev == "cpu":
        return None
    if isinstance(dev, device):
        return None if dev.type == "cpu" else (dev.index if dev.index is not None else _h().current)
    if isinstance(dev, int):
        return dev
    if dev == "cuda":
        return _h().current
    return int(str(dev).split(":")[1])


def _shape(size: Any) -> tuple[int, ...]:
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)


def randn(*size: Any, device: Any = None, dtype: _DType | None = None,
          generator: Generator | None = None) -> Tensor:
    seed = generator.seed if generator is not None else next(_ids)
    return Tensor(_shape(size), dtype or float32, _index(device), ("randn", seed, _shape(size)))


def empty(*size: Any, dtype: _DType | None = None, device: Any = None) -> Tensor:
    return Tensor(_shape(size), dtype or float32, _index(device), ("empty", next(_ids)))


def empty_like(t: Tensor, device: Any = None) -> Tensor:
    return Tensor(t.shape, t.dtype, _index(device) if device is not None else t.dev, ("empty", next(_ids)))


def allclose(a: Tensor, b: Tensor, rtol: float = 1e-5, atol: float = 1e-8) -> bool:
    return bool(a.expr == b.expr)


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        self.dev: int | None = None
        self.at: float | None = None

    def record(self, stream: Any = None) -> None:
        cur = _h().current
        if self.dev is not None and self.dev != cur:
            raise RuntimeError(f"Event device {self.dev} does not match recording stream's device {cur}.")
        self.dev, self.at = cur, _h().clock[cur]

    def synchronize(self) -> None:
        if self.at is None:
            return

    def elapsed_time(self, end: _Event) -> float:
        if self.at is None or end.at is None:
            raise RuntimeError("CUDA error: device not ready")
        if self.dev != end.dev:
            raise RuntimeError("CUDA error: invalid resource handle")
        return end.at - self.at


class _Props:
    def __init__(self, d: dict[str, Any]) -> None:
        self.name, self.major, self.minor = d["name"], d["major"], d["minor"]
        self.total_memory = d["total_memory"]
        self.multi_processor_count = d.get("sms", 0)
        self.uuid = d["uuid"]  # torch prints it 8-4-4-4-12, without "GPU-"


class _Cuda:
    Event = _Event

    def is_available(self) -> bool:
        return bool(_h().devices)

    def device_count(self) -> int:
        return len(_h().devices)

    def get_arch_list(self) -> list[str]:
        return list(_h().doc.get("arch_list") or ["sm_80", "sm_86", "sm_90"])

    def _dev(self, i: int | None) -> dict[str, Any]:
        return _h().devices[_h().current if i is None else i]

    def get_device_properties(self, i: int | None = None) -> _Props:
        return _Props(self._dev(i))

    def get_device_name(self, i: int | None = None) -> str:
        return str(self._dev(i)["name"])

    def get_device_capability(self, i: int | None = None) -> tuple[int, int]:
        d = self._dev(i)
        return d["major"], d["minor"]

    def current_device(self) -> int:
        return _h().current

    def set_device(self, i: int) -> None:
        _h().current = i

    @contextlib.contextmanager
    def device(self, i: Any) -> Iterator[None]:
        host, before = _h(), _h().current
        host.current = _index(i) if not isinstance(i, int) else i
        try:
            yield
        finally:
            host.current = before

    def synchronize(self, dev: Any = None) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def mem_get_info(self, dev: Any = None) -> tuple[int, int]:
        total = int(self._dev(None)["total_memory"])
        return total - (1 << 30), total

    def can_device_access_peer(self, i: int, j: int) -> bool:
        return bool(_h().doc.get("p2p", True))


cuda = _Cuda()


class _Matmul:
    allow_tf32 = False


class _BackendsCuda:
    matmul = _Matmul()


class backends:  # noqa: N801
    cuda = _BackendsCuda()


class distributed:  # noqa: N801
    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_nccl_available() -> bool:
        return bool(_h().doc.get("nccl", False))
