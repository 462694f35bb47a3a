"""The multi-GPU tier's verdict rules (templates/gpu/gpu_verdict_multi.py) on measurement files
(tests/fixtures/validation/*-x*: CONSTRUCTED, see SOURCES.md), the topology parser on a captured
`nvidia-smi topo -m`, and the one fix a check names for `run` to apply."""

from __future__ import annotations

import json
from typing import Any

from provision.jobs.spec import validation_env
from tests.unit.gpu_payload import FIX, FIXTURES, payload


def judged(name: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    case = json.loads((FIX / f"{name}.json").read_text())
    assert case["_note"].startswith("CONSTRUCTED")
    report = payload("gpu_verdict").report(case["measurements"], case["config"])
    json.dumps(report)
    return report, {c["name"]: c for c in report["checks"]}


def test_topology_of_a_captured_8x_a800() -> None:
    links = payload("gpu_verdict_multi").parse_topology(
        (FIXTURES / "nvidia-smi" / "topo-matrix-8xa800-nvlink-4nic.txt").read_text())
    assert len(links) == 56 and set(links.values()) == {"NV8"}  # NICs are not GPUs
    assert links["0,7"] == links["7,0"] == "NV8"


def test_rtx4090_that_reports_p2p_and_hangs_gets_only_nccl_p2p_disable() -> None:
    report, checks = judged("8xrtx4090-p2p-reported-allreduce-hangs")
    assert report["verdict"] == "WARN"
    c = checks["nccl all-reduce"]
    assert c["status"] == "warn" and c["env"] == {"NCCL_P2P_DISABLE": "1"}
    assert c["reason"].startswith("as it is, the all-reduce over 8 GPUs hung (no answer within 90s) "
                                  "(twice); not fixed by NCCL_SHM_DISABLE=1, NCCL_CUMEM_ENABLE=0; with "
                                  "NCCL_P2P_DISABLE=1 alone it works (9.4 GB/s): NVIDIA "
                                  "GeForce RTX 4090: NVIDIA does not support peer-to-peer on GeForce "
                                  "RTX 40/50 cards")
    env, why = validation_env(report)  # what `run` then applies, and says why
    assert env == {"NCCL_P2P_DISABLE": "1"} and why[0].startswith("NCCL_P2P_DISABLE=1 (nccl all-reduce: ")
    # 9.4 GB/s through host memory is what 8 GPUs on PCIe 4.0 x16 without P2P allow
    assert checks["multi-gpu bandwidth"]["status"] == "pass"
    assert "(0.60; PCIe 31.5 GB/s per GPU, through host memory (no peer-to-peer))" in \
        checks["multi-gpu bandwidth"]["reason"]


def test_nvlink_a100_passes_against_its_links() -> None:
    report, checks = judged("4xa100-nvlink-healthy")
    assert report["verdict"] == "PASS", checks
    assert checks["multi-gpu bandwidth"]["reason"] == (
        "all-reduce bus bandwidth 231.0 GB/s of about 300 the topology allows (0.77; NVLink between "
        "every pair: 12 link(s) of 25 GB/s)")
    assert checks["p2p"]["reason"] == "peer access between all 6 GPU pair(s)"
    assert validation_env(report) == ({}, [])


def test_vm_iommu_is_named_as_the_cause() -> None:
    report, checks = judged("2xh100-pcie-vm-iommu")
    assert report["verdict"] == "WARN"
    c = checks["nccl all-reduce"]
    assert c["env"] == {"NCCL_P2P_DISABLE": "1"}
    assert "IOMMU/ACS redirect peer-to-peer traffic through the root complex (a VM: the " \
        "hypervisor's IOMMU)" in c["reason"]


def test_small_shm_that_broke_nothing_warns_without_a_setting() -> None:
    report, checks = judged("2xrtx3090-nvlink-container-small-shm")
    assert report["verdict"] == "WARN"
    assert "env" not in checks["/dev/shm"]
    assert checks["/dev/shm"]["reason"].startswith("/dev/shm is 64 MiB (a container's default)")
    assert checks["nccl all-reduce"]["status"] == "pass"
    assert validation_env(report) == ({}, [])  # NVLink all-reduce is not slowed for nothing
    assert "4 link(s) of 14.0625 GB/s" in checks["multi-gpu bandwidth"]["reason"]  # the 3090 bridge


def test_small_shm_that_broke_nccl_gets_only_shm_disable_and_is_named() -> None:
    report, checks = judged("2xrtx3090-container-shm-breaks-nccl")
    c = checks["nccl all-reduce"]
    assert c["env"] == {"NCCL_SHM_DISABLE": "1"}
    assert "NCCL said: transport/shm.cc:" in c["reason"]  # NCCL's own line, quoted
    assert "/dev/shm is 64 MiB (a container's default), too small for NCCL's shared-memory " \
           "buffers" in c["reason"]
    assert "/dev/shm" not in checks  # said once, in the finding that needed it
    assert validation_env(report)[0] == {"NCCL_SHM_DISABLE": "1"}


def test_a_slow_first_start_that_passes_again_needs_no_setting() -> None:
    report, checks = judged("4xl4-first-start-slow")
    c = checks["nccl all-reduce"]
    assert c["status"] == "pass" and "env" not in c
    assert c["reason"].startswith("4 GPUs: the first start hung (no answer within 90s) during "
                                  "start-up (spawning the workers); the same run again passed")
    assert validation_env(report) == ({}, [])


def test_slow_nvswitch_all_reduce_warns() -> None:
    report, checks = judged("8xh100-nvlink-slow")
    assert report["verdict"] == "WARN"
    assert checks["multi-gpu bandwidth"]["status"] == "warn"
    assert "112.5 GB/s of about 450 the topology allows (0.25;" in checks["multi-gpu bandwidth"]["reason"]


def test_all_reduce_that_fails_every_way_fails_with_each_setting_named() -> None:
    report, checks = judged("2xa6000-allreduce-fails")
    assert report["verdict"] == "FAIL"
    c = checks["nccl all-reduce"]
    assert c["status"] == "fail" and "env" not in c
    assert "it failed again with each of NCCL_CUMEM_ENABLE, NCCL_P2P_DISABLE, NCCL_SHM_DISABLE set" \
        in c["reason"]
    assert checks["p2p"]["reason"].startswith("no peer access between any of the 1 GPU pair(s)")
    assert "multi-gpu bandwidth" not in checks


def test_exclusive_process_mode_is_named() -> None:
    report, checks = judged("2xh100-pcie-exclusive-process")
    assert checks["compute mode"]["status"] == "warn"
    assert checks["compute mode"]["reason"].startswith("GPU 0, 1 in Exclusive_Process compute mode")
    assert checks["nccl all-reduce"]["status"] == "pass"  # it ran before validation held a GPU


def test_one_gpu_has_no_multi_tier() -> None:
    case = json.loads((FIX / "rtx4090-healthy.json").read_text())
    report = payload("gpu_verdict").report(case["measurements"], case["config"])
    names = {c["name"] for c in report["checks"]}
    assert not {"p2p", "nccl all-reduce", "multi-gpu bandwidth", "/dev/shm"} & names
