"""The multi-GPU tier of templates/gpu/validate_gpu.py: its pure rules (``judge``) on measurement
files (tests/fixtures/validation/*-x*: CONSTRUCTED, see SOURCES.md), the topology parser on a
captured `nvidia-smi topo -m`, and the fix a check names for `run` to apply."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from provision.config.shipped import templates_dir
from provision.jobs.spec import validation_env

FIX = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture(scope="module")
def vg() -> ModuleType:
    spec = importlib.util.spec_from_file_location("validate_gpu", templates_dir() / "gpu/validate_gpu.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def judged(vg: ModuleType, name: str) -> tuple[dict, dict[str, dict]]:
    case = json.loads((FIX / "validation" / f"{name}.json").read_text())
    assert case["_note"].startswith("CONSTRUCTED")
    report = vg.report(case["measurements"], case["config"])
    json.dumps(report)
    return report, {c["name"]: c for c in report["checks"]}


def test_topology_of_a_captured_8x_a800(vg: ModuleType) -> None:
    links = vg.parse_topology((FIX / "nvidia-smi" / "topo-matrix-8xa800-nvlink-4nic.txt").read_text())
    assert len(links) == 56 and set(links.values()) == {"NV8"}  # NICs are not GPUs
    assert links["0,7"] == links["7,0"] == "NV8"


def test_rtx4090_that_reports_p2p_and_hangs_gets_nccl_p2p_disable(vg: ModuleType) -> None:
    report, checks = judged(vg, "8xrtx4090-p2p-reported-allreduce-hangs")
    assert report["verdict"] == "WARN"
    c = checks["nccl all-reduce"]
    assert c["status"] == "warn" and c["env"] == {"NCCL_P2P_DISABLE": "1"}
    assert c["reason"].startswith("with peer-to-peer on it hung (no answer within 90s); with "
                                  "NCCL_P2P_DISABLE=1 it works (9.4 GB/s): NVIDIA GeForce RTX 4090: "
                                  "NVIDIA does not support peer-to-peer on GeForce RTX 40/50 cards")
    # what `run` then applies, and says why
    env, why = validation_env(report)
    assert env == {"NCCL_P2P_DISABLE": "1"} and why[0].startswith("NCCL_P2P_DISABLE=1 (nccl all-reduce: ")
    # 9.4 GB/s through host memory is what 8 GPUs on PCIe 4.0 x16 without P2P allow
    assert checks["multi-gpu bandwidth"]["status"] == "pass"
    assert "(0.60; PCIe 31.5 GB/s per GPU, through host memory (no peer-to-peer))" in \
        checks["multi-gpu bandwidth"]["reason"]


def test_nvlink_a100_passes_against_its_links(vg: ModuleType) -> None:
    report, checks = judged(vg, "4xa100-nvlink-healthy")
    assert report["verdict"] == "PASS", checks
    assert checks["multi-gpu bandwidth"]["reason"] == (
        "all-reduce bus bandwidth 231.0 GB/s of about 300 the topology allows (0.77; NVLink between "
        "every pair: 12 link(s) of 25 GB/s)")
    assert checks["p2p"]["reason"] == "peer access between all 6 GPU pair(s)"
    assert validation_env(report) == ({}, [])


def test_vm_iommu_is_named_as_the_cause(vg: ModuleType) -> None:
    report, checks = judged(vg, "2xh100-pcie-vm-iommu")
    assert report["verdict"] == "WARN"
    c = checks["nccl all-reduce"]
    assert c["env"] == {"NCCL_P2P_DISABLE": "1"}
    assert "IOMMU/ACS redirect peer-to-peer traffic through the root complex (a VM: the " \
        "hypervisor's IOMMU)" in c["reason"]


def test_small_shm_in_a_container_warns_with_its_fix(vg: ModuleType) -> None:
    report, checks = judged(vg, "2xrtx3090-nvlink-container-small-shm")
    assert report["verdict"] == "WARN"
    assert checks["/dev/shm"]["env"] == {"NCCL_SHM_DISABLE": "1"}
    assert checks["/dev/shm"]["reason"].startswith("/dev/shm is 64 MiB (a container's default)")
    assert checks["nccl all-reduce"]["status"] == "pass"
    assert "4 link(s) of 14.0625 GB/s" in checks["multi-gpu bandwidth"]["reason"]  # the 3090 bridge


def test_slow_nvswitch_all_reduce_warns(vg: ModuleType) -> None:
    report, checks = judged(vg, "8xh100-nvlink-slow")
    assert report["verdict"] == "WARN"
    assert checks["multi-gpu bandwidth"]["status"] == "warn"
    assert "112.5 GB/s of about 450 the topology allows (0.25;" in checks["multi-gpu bandwidth"]["reason"]


def test_all_reduce_that_fails_either_way_fails(vg: ModuleType) -> None:
    report, checks = judged(vg, "2xa6000-allreduce-fails")
    assert report["verdict"] == "FAIL"
    assert checks["nccl all-reduce"]["status"] == "fail" and "env" not in checks["nccl all-reduce"]
    assert checks["p2p"]["reason"].startswith("no peer access between any of the 1 GPU pair(s)")
    assert "multi-gpu bandwidth" not in checks


def test_one_gpu_has_no_multi_tier(vg: ModuleType) -> None:
    report, checks = judged_single(vg)
    assert not {"p2p", "nccl all-reduce", "multi-gpu bandwidth", "/dev/shm"} & set(checks)


def judged_single(vg: ModuleType) -> tuple[dict, dict[str, dict]]:
    case = json.loads((FIX / "validation" / "rtx4090-healthy.json").read_text())
    report = vg.report(case["measurements"], case["config"])
    return report, {c["name"]: c for c in report["checks"]}
