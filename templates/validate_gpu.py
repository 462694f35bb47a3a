"""gpu-provision validation, run in the provisioned env with torch only; prints ONE JSON object.

Schema: {"verdict": "PASS"|"WARN"|"FAIL", "mode": "gpu"|"cpu", "torch": str, "cuda": str|null,
"checks": [{"name": str, "status": "pass"|"warn"|"fail", "reason": str}], "devices": [...]}.
Argument 1: the number of GPUs nvidia-smi reported (0 for a host without one).
"""

import ctypes
import json
import sys
import time


def main() -> dict:
    expected = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    checks = []

    def check(name, ok, reason, warn=False):
        checks.append({"name": name, "status": "pass" if ok else ("warn" if warn else "fail"),
                       "reason": reason})

    out = {"mode": "gpu" if expected else "cpu", "checks": checks, "devices": []}
    try:
        import torch
    except Exception as exc:  # the env has no usable torch: nothing else can be checked
        check("torch import", False, f"import torch failed: {exc!r}")
        out.update(torch=None, cuda=None)
        return out
    out.update(torch=torch.__version__, cuda=torch.version.cuda)
    check("torch import", True, f"torch {torch.__version__} (CUDA {torch.version.cuda})")
    a = torch.randn(256, 256, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    ref = a @ a
    if not expected:
        t0 = time.perf_counter()
        ok = torch.allclose(ref, (a.double() @ a.double()).float(), rtol=1e-3, atol=1e-3)
        check("cpu matmul", ok, f"256x256 matmul matches float64 ({time.perf_counter() - t0:.3f}s)")
        check("cuda build", torch.version.cuda is None, "CPU build on a host without an NVIDIA GPU"
              if torch.version.cuda is None else "a CUDA build on a host without a GPU", warn=True)
        return out
    if torch.version.cuda is None:
        check("cuda build", False, "Torch not compiled with CUDA enabled: the CPU wheel is installed")
        return out
    try:  # the driver's user-space library: without it CUDA cannot start, whatever nvidia-smi says
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        check("cuda available", False, "no libcuda.so.1 on this host: the NVIDIA driver's "
              "user-space library is missing, so CUDA cannot start")
        return out
    available = torch.cuda.is_available()
    check("cuda available", available, "torch.cuda.is_available()" if available else
          "torch.cuda.is_available() is False (driver too old for this wheel, or not loaded)")
    if not available:
        return out
    count = torch.cuda.device_count()
    check("gpu count", count == expected, f"torch sees {count} GPU(s), nvidia-smi {expected}")
    arches = torch.cuda.get_arch_list()
    for i in range(count):
        cap = torch.cuda.get_device_capability(i)
        dev = {"index": i, "name": torch.cuda.get_device_name(i), "capability": f"{cap[0]}.{cap[1]}"}
        out["devices"].append(dev)
        sm = f"sm_{cap[0]}{cap[1]}"
        has = any(x.startswith(f"sm_{cap[0]}") and int(x[3 + len(str(cap[0])):] or 0) <= cap[1]
                  for x in arches if x.startswith("sm_"))
        check(f"gpu {i} kernels", has, f"{dev['name']} is {sm}; wheel has {' '.join(arches)}")
        if not has:
            continue
        try:
            got = (a.cuda(i) @ a.cuda(i)).cpu()
            ok = torch.allclose(ref, got, rtol=1e-2, atol=1e-2)
            check(f"gpu {i} matmul", ok, "matches the CPU result" if ok else "differs from the CPU")
        except Exception as exc:
            check(f"gpu {i} matmul", False, f"{type(exc).__name__}: {exc}")
    return out


if __name__ == "__main__":
    result = main()
    statuses = {c["status"] for c in result["checks"]}
    result["verdict"] = "FAIL" if "fail" in statuses else "WARN" if "warn" in statuses else "PASS"
    print("VALIDATE_JSON " + json.dumps(result))
