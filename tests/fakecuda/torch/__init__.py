"""A stand-in for torch on a machine without GPUs: the CUDA parts validate_gpu.py and
bench_gpu.py use, behaving as CUDA and torch do where their answers depend on it. Large tensors
carry no numbers, only what was computed from what (so a correct big matmul compares equal to
the CPU's); small ones (at most SMALL elements) carry real numbers (numpy), so a correctness
check compares real products and a TF32 matmul really is less exact. Each device has a stream
whose clock advances by the work queued on it, at the rates the host file gives. The host file is
JSON, named by $FAKE_CUDA_HOST:
  {"devices": [{"name", "uuid" (8-4-4-4-12, as torch prints it), "pci_bus", "major", "minor",
                "total_memory", "sms", "tflops": {"fp16", "bf16", "tf32", "fp32"}, "mem_gbs",
                "h2d_gbs", "wrong": bool,
                "fail": {"fp16"|"bf16"|"tf32"|"fp32"|"mem"|"h2d"|"any": "RuntimeError text"},
                "sticky": bool (after the first failure every CUDA call on the device fails, as a
                          sticky CUDA error does),
                "fail_min_mib": the failures above only where the work touches at least this
                                many MiB (an out-of-memory error hits the large matrices only),
                "throttle": {"after_s": GPU seconds of load with EVERY device busy, "factor":
                             the rate it then runs at, e.g. 0.7}}],
   (every device is busy when, between two event records on a device, work was queued on all
   the others: what a loop that launches on each GPU in turn does, and one GPU at a time never;
   records with nothing queued anywhere between them, as a round's start events recorded on
   every GPU in turn, leave it as it was)
   "arch_list": [...], "nccl": bool, "version": "2.5.1+cu124", "cuda": "12.4"}
With $FAKE_CUDA_STATE set, each device's state is written there for the stand-in nvidia-smi
(tests/fakecuda/bin/nvidia-smi): STATE/<uuid>.json = {"at": wall time of the last work queued,
"throttled": bool}, so nvidia-smi answers the readings under load only while work runs.

The behaviour copied, with its source:
- a CUDA event is recorded on the current stream of the CURRENT device, and an event records
  only on streams of the device it was first recorded on (torch.cuda.Event.record: "Uses
  torch.cuda.current_stream() if no stream is specified. The stream's device must match the
  event's device", https://docs.pytorch.org/docs/stable/generated/torch.cuda.Event.html);
  elapsed_time is the stream time between two records of one device;
- devices are numbered fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, then filtered and
  reordered by CUDA_VISIBLE_DEVICES (indices in that order, or GPU-/MIG- UUIDs), read once when
  CUDA starts; CUDA stops at the first invalid entry (CUDA C++ Programming Guide, "CUDA
  Environment Variables");
- ``device="cuda"`` is the current device; a kernel runs on its tensors' device and two
  tensors on different devices are refused;
- TF32 (compute capability 8.0 and newer): an fp32 matmul on tensor cores reads only the first
  10 bits of each input's mantissa (PyTorch, docs/source/notes/numerical_accuracy.rst); whether
  it is used is decided as torch decides it (_precision.py says how, with its sources).
"""

from __future__ import annotations

import builtins
import contextlib
import itertools
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

__version__ = "2.5.1+cu124"
_ids = itertools.count()
SMALL = 512 * 512  # tensors up to this many elements carry real numbers


class _DType:
    def __init__(self, name: str, size: int, np_type: Any) -> None:
        self.name, self.itemsize, self.np = name, size, np_type

    def __repr__(self) -> str:
        return f"torch.{self.name}"


float16 = _DType("float16", 2, np.float16)
bfloat16 = _DType("bfloat16", 2, np.float32)  # numpy has no bfloat16: only its timing matters
float32 = _DType("float32", 4, np.float32)
float64 = _DType("float64", 8, np.float64)
uint8 = _DType("uint8", 1, np.uint8)
bool_ = _DType("bool", 1, np.bool_)
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


def _version_tuple(text: str) -> tuple[int, int]:
    parts = text.split("+")[0].split(".")
    return int(parts[0]), int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


class _Host:
    """The GPUs of the host file, ordered and filtered as CUDA does when it starts."""

    def __init__(self) -> None:
        path = os.environ.get("FAKE_CUDA_HOST")
        self.doc: dict[str, Any] = {"devices": []}
        if path:
            with open(path) as f:
                self.doc = json.load(f)
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
        self.last_wall = [0.0] * len(devs)  # when work was last queued on each device
        self.together_ms = [0.0] * len(devs)  # ms run while every device was busy
        self.since: list[set[int]] = [set() for _ in devs]  # devices with work since i's last record
        self.together = [False] * len(devs)
        self.written = [0.0] * len(devs)
        self.broken: list[str | None] = [None] * len(devs)  # a sticky error, once raised
        self.current = 0
        self.state = os.environ.get("FAKE_CUDA_STATE")

    def throttled(self, i: int) -> bool:
        t = self.devices[i].get("throttle")
        return bool(t) and self.together_ms[i] >= builtins.float(t["after_s"]) * 1000

    def run(self, i: int, ms_at_full_rate: float, kind: str, mib: float = 0.0) -> None:
        """Queue work on device ``i``: its failures, its clock, its state for nvidia-smi."""
        d = self.devices[i]
        if self.broken[i]:
            raise RuntimeError(self.broken[i])
        fail = (d.get("fail") or {}).get(kind) or (d.get("fail") or {}).get("any")
        if fail and mib >= builtins.float(d.get("fail_min_mib") or 0):
            if d.get("sticky"):
                self.broken[i] = fail
            raise RuntimeError(fail)
        now = time.time()
        factor = builtins.float(d["throttle"]["factor"]) if self.throttled(i) else 1.0
        ms = ms_at_full_rate / factor
        self.last_wall[i] = now
        for seen in self.since:
            seen.add(i)
        if self.together[i]:
            self.together_ms[i] += ms
        self.clock[i] += ms
        if self.state and now - self.written[i] > 0.05:
            self.written[i] = now
            path = os.path.join(self.state, f"{d['uuid']}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"at": now, "throttled": self.throttled(i)}, f)
            os.replace(path + ".tmp", path)


_host: _Host | None = None


def _h() -> _Host:
    global _host, __version__
    if _host is None:
        _host = _Host()
        version.cuda = _host.doc.get("cuda", "12.4")
        __version__ = _host.doc.get("version", __version__)
        backends.cuda.matmul._start()
    return _host


def _tf32_round(x: np.ndarray) -> np.ndarray:
    """fp32 -> the 10-bit mantissa TF32 reads (round to nearest, ties away), back as fp32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


class Tensor:
    def __init__(self, shape: tuple[int, ...], dtype: _DType, dev: int | None, expr: Any,
                 pinned: bool = False, value: np.ndarray | None = None) -> None:
        self.shape, self.dtype, self.dev, self.expr, self.pinned = shape, dtype, dev, expr, pinned
        self.value = value

    @property
    def device(self) -> device:
        return device("cpu") if self.dev is None else device("cuda", self.dev)

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def _same(self, value: np.ndarray, expr: Any, dtype: _DType | None = None) -> Tensor:
        return Tensor(tuple(value.shape), dtype or self.dtype, self.dev, expr, value=value)

    def __matmul__(self, other: Tensor) -> Tensor:
        if self.dev != other.dev:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least "
                               f"two devices, {self.device} and {other.device}!")
        n, k, m = self.shape[0], self.shape[1], other.shape[1]
        expr: Any = ("mm", self.expr, other.expr)
        tf32 = False
        if self.dev is not None:
            d = _h().devices[self.dev]
            kind = {"float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}.get(self.dtype.name, "fp32")
            if kind == "fp32" and backends.cuda.matmul._tf32_in_cublas() and d.get("major", 0) >= 8:
                kind, tf32 = "tf32", True
            rate = (d.get("tflops") or {}).get(kind) or ((d.get("tflops") or {}).get("fp32", 0) / 32
                                                         if kind == "fp64" else None)
            if not rate:
                raise RuntimeError("CUDA error: no kernel image is available for execution on the device")
            _h().run(self.dev, 2 * n * k * m / (rate * 1e12) * 1000, kind,
                     (n * k + k * m + n * m) * self.dtype.itemsize / 2 ** 20)
            if d.get("wrong"):
                expr = ("garbage", next(_ids))
        value = None
        if self.value is not None and other.value is not None:
            a, b = self.value, other.value
            if tf32:
                a, b = _tf32_round(a), _tf32_round(b)
            value = np.matmul(a, b).astype(self.dtype.np)
            if self.dev is not None and _h().devices[self.dev].get("wrong"):
                value = np.random.default_rng(next(_ids)).standard_normal(value.shape).astype(value.dtype)
        return Tensor((n, m), self.dtype, self.dev, expr, value=value)

    # elementwise arithmetic on small tensors (the correctness check's error bound)
    def _other(self, other: Any) -> Any:
        return other.value if isinstance(other, Tensor) else other

    def __sub__(self, other: Any) -> Tensor:
        assert self.value is not None
        return self._same(self.value - self._other(other), ("sub", self.expr, getattr(other, "expr", other)))

    def __mul__(self, other: Any) -> Tensor:
        assert self.value is not None
        return self._same(self.value * self._other(other), ("mul", self.expr, getattr(other, "expr", other)))

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> Tensor:
        assert self.value is not None
        return self._same(self.value / self._other(other), ("div", self.expr, getattr(other, "expr", other)))

    def __le__(self, other: Any) -> Tensor:  # type: ignore[override]
        assert self.value is not None
        return self._same(self.value <= self._other(other), ("le", self.expr), bool_)

    def abs(self) -> Tensor:
        assert self.value is not None
        return self._same(np.abs(self.value), ("abs", self.expr))

    def all(self) -> Tensor:
        assert self.value is not None
        return self._same(np.array(bool(np.all(self.value))), ("all", self.expr), bool_)

    def max(self) -> Tensor:
        assert self.value is not None
        return self._same(np.array(np.max(self.value)), ("max", self.expr))

    def item(self) -> Any:
        assert self.value is not None
        return self.value.item()

    def to(self, dev: Any) -> Tensor:
        i = _index(dev)
        if i is not None:
            _h().run(i, 0.0, "any")
        return Tensor(self.shape, self.dtype, i, self.expr,
                      value=None if self.value is None else self.value.copy())

    def cpu(self) -> Tensor:
        return Tensor(self.shape, self.dtype, None, self.expr, value=self.value)

    def _cast(self, dtype: _DType) -> Tensor:
        return Tensor(self.shape, dtype, self.dev, self.expr,
                      value=None if self.value is None else self.value.astype(dtype.np))

    def double(self) -> Tensor:
        return self._cast(float64)

    def float(self) -> Tensor:
        return self._cast(float32)

    def pin_memory(self) -> Tensor:
        return Tensor(self.shape, self.dtype, None, self.expr, pinned=True, value=self.value)

    def copy_(self, src: Tensor, non_blocking: bool = False) -> Tensor:
        size = src.numel() * src.dtype.itemsize
        if self.dev is not None:
            d = _h().devices[self.dev]
            if src.dev == self.dev:  # device to device: every byte read and written
                _h().run(self.dev, 2 * size / (d["mem_gbs"] * 1e9) * 1000, "mem", 2 * size / 2 ** 20)
            elif src.dev is None:
                _h().run(self.dev, size / (d["h2d_gbs"] * (1 if src.pinned else 0.5) * 1e9) * 1000, "h2d",
                         size / 2 ** 20)
        self.expr, self.value = src.expr, src.value
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
    shape, dt = _shape(size), dtype or float32
    n = 1
    for s in shape:
        n *= s
    value = np.random.default_rng(seed).standard_normal(shape).astype(dt.np) if n <= SMALL else None
    i = _index(device)
    if i is not None:
        _h().run(i, 0.0, "any")
    return Tensor(shape, dt, i, ("randn", seed, shape), value=value)


def empty(*size: Any, dtype: _DType | None = None, device: Any = None) -> Tensor:
    return Tensor(_shape(size), dtype or float32, _index(device), ("empty", next(_ids)))


def empty_like(t: Tensor, device: Any = None) -> Tensor:
    return Tensor(t.shape, t.dtype, _index(device) if device is not None else t.dev, ("empty", next(_ids)))


def allclose(a: Tensor, b: Tensor, rtol: float = 1e-5, atol: float = 1e-8) -> bool:
    if a.value is not None and b.value is not None:
        return bool(np.allclose(a.value.astype(np.float64), b.value.astype(np.float64), rtol=rtol, atol=atol))
    return bool(a.expr == b.expr)


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        self.dev: int | None = None
        self.at: float | None = None

    def record(self, stream: Any = None) -> None:
        cur = _h().current
        if self.dev is not None and self.dev != cur:
            raise RuntimeError(f"Event device {self.dev} does not match recording stream's device {cur}.")
        host = _h()
        if host.broken[cur]:
            raise RuntimeError(host.broken[cur])
        others = set(range(len(host.devices))) - {cur}
        if host.since[cur]:  # two records with nothing queued anywhere between: as it was
            host.together[cur] = bool(others) and others <= host.since[cur]
        host.since[cur] = set()
        self.dev, self.at = cur, host.clock[cur]

    def synchronize(self) -> None:
        if self.at is None:
            return

    def query(self) -> bool:
        return True

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
        if _h().broken[_h().current]:  # a sticky error fails every later call
            raise RuntimeError(_h().broken[_h().current])

    def mem_get_info(self, dev: Any = None) -> tuple[int, int]:
        total = int(self._dev(None)["total_memory"])
        return total - (1 << 30), total

    def can_device_access_peer(self, i: int, j: int) -> bool:
        return bool(_h().doc.get("p2p", True))


cuda = _Cuda()


from ._precision import backends  # noqa: E402  (torch's own names, from its submodule)
from ._precision import get_float32_matmul_precision as get_float32_matmul_precision  # noqa: E402
from ._precision import set_float32_matmul_precision as set_float32_matmul_precision  # noqa: E402


class distributed:  # noqa: N801
    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_nccl_available() -> bool:
        return bool(_h().doc.get("nccl", False))
