"""The GPU payload (templates/gpu: validate_gpu.py, gpu_verdict.py, ...) as modules for the tests,
and the stand-in CUDA layer (tests/fakecuda) they measure on."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from provision.config.shipped import templates_dir

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FIX = FIXTURES / "validation"
HOSTS = FIX / "hosts"
FAKE = Path(__file__).resolve().parent.parent / "fakecuda"
GPU = templates_dir() / "gpu"


def payload(name: str) -> ModuleType:
    """A payload module as the host imports it: its folder on sys.path (they import each other)."""
    if str(GPU) not in sys.path:
        sys.path.insert(0, str(GPU))
    return importlib.import_module(name)


def judged(name: str) -> tuple[str, dict[str, tuple[str, str]]]:
    case = json.loads((FIX / f"{name}.json").read_text())
    report = payload("gpu_verdict").report(case["measurements"], case["config"])
    json.dumps(report)  # what the host prints must be JSON
    return report["verdict"], {c["name"]: (c["status"], c["reason"]) for c in report["checks"]}


def libcuda(tmp: Path) -> Path:
    """A folder with an empty libcuda.so.1: what validate_gpu.py dlopens to see the driver's
    library is there (the real one cannot be on this machine). Built once per test run."""
    global _LIB
    if _LIB is None or not (_LIB / "libcuda.so.1").exists():
        lib = tmp / "lib"
        lib.mkdir(exist_ok=True)
        src = lib / "empty.c"
        src.write_text("int gp_stand_in_for_libcuda;\n")
        subprocess.run([shutil.which("gcc") or "cc", "-shared", "-fPIC", "-o", str(lib / "libcuda.so.1"),
                        str(src)], check=True, capture_output=True)
        _LIB = lib
    return _LIB


_LIB: Path | None = None


def run_payload(script: str, host: str, tmp: Path, config: dict[str, Any],
                **env: str) -> dict[str, Any]:
    """A payload script run as the step runs it, on the stand-in CUDA host ``host``
    (tests/fixtures/validation/hosts/HOST: host.json for torch, the nvidia-smi captures)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "NCCL_"))}
    full.update(PATH=f"{FAKE / 'bin'}:{full['PATH']}", PYTHONPATH=str(FAKE),
                FAKE_CUDA_HOST=str(HOSTS / host / "host.json"), FAKE_SMI_DIR=str(HOSTS / host),
                LD_LIBRARY_PATH=str(libcuda(tmp)), HOME=str(tmp), **env)
    r = subprocess.run([sys.executable, str(GPU / script), json.dumps(config)], capture_output=True,
                       text=True, env=full, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out
