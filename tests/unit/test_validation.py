"""The verdict rules of templates/gpu/validate_gpu.py, judged on validation measurements (the files
in tests/fixtures/validation say how each was made) and on the provisioner's config."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from provision.config.inventory import Target, merge_settings
from provision.config.recipes import load_platform, load_recipe
from provision.config.shipped import templates_dir
from provision.facts.host import HostFacts
from provision.facts.nvidia import Gpu
from provision.ops.validate import (
    gpu_reference,
    parse_gpu_claim,
    read_validation,
    validation_config,
)

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "validation"


@pytest.fixture(scope="module")
def vg() -> ModuleType:
    """validate_gpu.py as a module: it imports torch only inside measure()."""
    spec = importlib.util.spec_from_file_location("validate_gpu", templates_dir() / "gpu/validate_gpu.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def judged(vg: ModuleType, name: str) -> tuple[str, dict[str, tuple[str, str]]]:
    case = json.loads((FIX / f"{name}.json").read_text())
    report = vg.report(case["measurements"], case["config"])
    json.dumps(report)  # what the host prints must be JSON
    return report["verdict"], {c["name"]: (c["status"], c["reason"]) for c in report["checks"]}


def test_healthy_card_passes(vg: ModuleType) -> None:
    verdict, checks = judged(vg, "rtx4090-healthy")
    assert verdict == "PASS", checks
    assert set(checks) == {"driver", "torch import", "cuda available", "gpu count", "gpu 0 matmul",
                           "gpu 0 speed", "gpu 0 bandwidth", "gpu busy", "advertised gpu"}
    assert "fp16 150.2/165.2 (0.91)" in checks["gpu 0 speed"][1]


def test_throttled_card_warns_with_its_clocks(vg: ModuleType) -> None:
    verdict, checks = judged(vg, "rtx4090-throttled")
    assert verdict == "WARN"
    status, reason = checks["gpu 0 speed"]
    assert status == "warn"
    assert reason.startswith("fp32, tf32, bf16, fp16 below 0.5 of NVIDIA GeForce RTX 4090's "
                             "datasheet peak: throttled, power-capped or not the card")
    assert "SM clock 1155/2520 MHz, power limit 200.00 W, 87 C" in reason


def test_busy_card_warns_naming_the_process(vg: ModuleType) -> None:
    verdict, checks = judged(vg, "rtx4090-busy")
    assert verdict == "WARN"
    assert checks["gpu busy"] == ("warn", "in use before validation started: python3 (pid 30211, "
                                          "18330 MiB); GPU 0 had 18342 MiB in use (a shared or "
                                          "dirty instance)")


def test_wrong_model_fails(vg: ModuleType) -> None:
    verdict, checks = judged(vg, "a100-advertised-as-h100")
    assert verdict == "FAIL"
    assert checks["advertised gpu"] == ("fail", "H100 x1 was advertised, the host has 1: "
                                                "NVIDIA A100-SXM4-40GB")
    assert checks["gpu 0 speed"][0] == "pass"  # a healthy A100 - just not what was paid for


def test_missing_gpu_fails(vg: ModuleType) -> None:
    verdict, checks = judged(vg, "rtx4090-x2-torch-sees-one")
    assert verdict == "FAIL"
    assert checks["gpu count"] == ("fail", "torch sees 1 GPU(s), nvidia-smi 2")
    assert checks["advertised gpu"][0] == "pass"  # nvidia-smi does list both


def test_fewer_gpus_than_advertised_fails(vg: ModuleType) -> None:
    case = json.loads((FIX / "rtx4090-healthy.json").read_text())
    case["config"]["advertised"] = {"model": "RTX 4090", "count": 4}
    checks = {c["name"]: c for c in vg.judge(case["measurements"], case["config"])}
    assert checks["advertised gpu"]["status"] == "fail"
    assert checks["advertised gpu"]["reason"].startswith("RTX 4090 x4 was advertised, the host has 1")


@pytest.mark.parametrize("change,name,status,words", [
    ({"torch": {"version": "2.5.1+cpu", "cuda": None, "error": None}}, "cuda build", "fail",
     "Torch not compiled with CUDA enabled"),
    ({"libcuda": False}, "cuda available", "fail", "no libcuda.so.1 on this host"),
    ({"smi": {"gpus": [], "processes": [], "error": "Failed to initialize NVML: Driver/library "
              "version mismatch\nNVML library version: 550.144"}}, "driver", "fail",
     "nvidia-smi failed: Failed to initialize NVML: Driver/library version mismatch"),
])
def test_gpu_host_failures(vg: ModuleType, change: dict[str, Any], name: str, status: str,
                           words: str) -> None:
    case = json.loads((FIX / "rtx4090-healthy.json").read_text())
    case["measurements"].update(change)
    report = vg.report(case["measurements"], case["config"])
    check = next(c for c in report["checks"] if c["name"] == name)
    assert (report["verdict"], check["status"]) == ("FAIL", status) and words in check["reason"]


def test_kernels_rule(vg: ModuleType) -> None:
    arches = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
    assert vg._has_kernels(arches, "8.9")  # sm_86 runs on 8.9
    assert not vg._has_kernels(arches, "12.0")
    assert vg._has_kernels(arches + ["sm_100", "sm_120"], "12.0")
    assert vg._has_kernels(["sm_90a"], "9.0") and not vg._has_kernels(["sm_90"], "8.6")


def test_cpu_mode(vg: ModuleType) -> None:
    m = {"smi": None, "host": {"cpu_cores": 2, "memory_gb": 23.4, "disks": []},
         "torch": {"version": "2.13.0+cpu", "cuda": None, "error": None, "cpu_matmul_ok": True},
         "gpus": [], "cpu_gflops": 80.0, "libcuda": None}
    report = vg.report(m, {"expected_gpus": 0, "thresholds": {"min_cpu_cores": 4}})
    assert report["mode"] == "cpu" and report["verdict"] == "PASS"
    assert [c["name"] for c in report["checks"]] == ["torch import", "cpu matmul", "cuda build"]
    # the recipe's minimums are judged on what the host measured, by the rule plan applies
    read = read_validation(report, {"min_cpu_cores": 4, "min_memory_gb": 16})
    assert read.verdict == "WARN" and read.report is not None
    assert read.report["checks"][-2:] == [
        {"name": "cpu cores", "status": "warn", "reason": "2, the recipe wants at least 4"},
        {"name": "memory", "status": "pass", "reason": "23.4 GB, the recipe wants at least 16 GB"}]


def test_healthy_card_with_the_recipes_minimums(vg: ModuleType) -> None:
    case = json.loads((FIX / "rtx4090-healthy.json").read_text())
    need = {k: v for k, v in case["config"]["thresholds"].items() if k.startswith("min_")
            and k not in ("min_tflops_ratio", "min_bandwidth_ratio")}
    read = read_validation(vg.report(case["measurements"], case["config"]),
                           {**need, "min_gpu_memory_gb": 15})
    assert read.verdict == "PASS" and read.report is not None
    names = {c["name"]: c["status"] for c in read.report["checks"]}
    assert {k: names[k] for k in ("cpu cores", "memory", "free disk /root",
                                  "GPU memory (GPU 0)")} == dict.fromkeys(
        ("cpu cores", "memory", "free disk /root", "GPU memory (GPU 0)"), "pass")
    short = read_validation(vg.report(case["measurements"], case["config"]),
                            {"min_gpu_memory_gb": 40})
    assert short.verdict == "WARN"


def test_reference_lookup_and_claims() -> None:
    assert gpu_reference("NVIDIA H100 PCIe")["fp16"] == 756.0  # type: ignore[index]
    assert gpu_reference("NVIDIA H100 80GB HBM3")["fp16"] == 989.4  # type: ignore[index]
    assert gpu_reference("NVIDIA A100-SXM4-80GB")["tf32"] == 156.0  # type: ignore[index]
    assert gpu_reference("NVIDIA A10")["tf32"] == 62.5  # type: ignore[index]
    assert gpu_reference("Tesla T4")["bf16"] is None  # type: ignore[index]
    assert gpu_reference("NVIDIA GeForce GTX 1080") is None
    assert parse_gpu_claim("RTX 4090 x2") == {"model": "RTX 4090", "count": 2}
    assert parse_gpu_claim("H100") == {"model": "H100", "count": 1}
    assert parse_gpu_claim(None) is None


def test_config_carries_claim_thresholds_and_references(cpu_host: HostFacts) -> None:
    target = Target(name="box", host="h", settings={"gpu": "RTX 4090 x1", "data_dir": "/data"})
    settings = merge_settings(target, load_platform("generic-vm"), load_recipe("pytorch"))
    gpus = (Gpu(0, "NVIDIA GeForce RTX 4090", compute_cap="8.9"),
            Gpu(1, "NVIDIA GeForce GTX 1080", compute_cap="6.1"))
    cfg = validation_config(replace(cpu_host, gpus=gpus), settings)
    assert cfg["expected_gpus"] == 2 and cfg["data_dir"] == "/data"
    assert cfg["advertised"] == {"model": "RTX 4090", "count": 1}
    assert cfg["thresholds"]["min_tflops_ratio"] == 0.5
    assert list(cfg["reference"]) == ["NVIDIA GeForce RTX 4090"]


def test_revalidation_only_when_something_it_checks_changed(cpu_host: HostFacts) -> None:
    from provision.ops.layout import Layout
    from provision.ops.validate import REVALIDATE_AFTER, validate_step
    settings = merge_settings(Target(name="box", host="h"), load_platform("generic-vm"),
                              load_recipe("pytorch"))
    lay = Layout("/root/miniconda3", "torch", False)
    facts = replace(cpu_host, boot_id="b1", now=1_000_000.0)
    first = validate_step(facts, lay, settings, always=False)
    assert first.changes  # never validated here yet

    def after(verdict: str, age: float, **change: Any) -> str | None:
        f = replace(facts, journal={"verdict": {"step": "verdict", "inputs": first.inputs,
                                                "result": verdict, "at": facts.now - age}})
        return validate_step(replace(f, **change), lay, settings, always=False).action

    assert after("PASS", 60) is None
    assert after("WARN", 60) is not None  # only a PASS is taken as it was
    assert after("PASS", REVALIDATE_AFTER + 1) is not None
    assert after("PASS", 60, boot_id="b2") is not None  # rebooted
    assert after("PASS", 60, gpus=(Gpu(0, "NVIDIA GeForce RTX 4090", compute_cap="8.9"),)) is not None
    assert validate_step(replace(facts, journal={"verdict": {"inputs": first.inputs, "result": "PASS",
                                                             "at": facts.now}}),
                         lay, settings, always=True).changes


def test_a_home_relative_data_dir_is_the_host_users_home(cpu_host: HostFacts) -> None:
    """``data_dir: ~/data`` means the remote user's home (from the facts), not a folder '~'."""
    from provision.config.recipes import Platform
    from provision.ops.layout import layout
    target = Target(name="box", host="h", settings={"data_dir": "~/data"})
    settings = merge_settings(target, load_platform("generic-vm"), load_recipe("pytorch"))
    facts = replace(cpu_host, home="/home/ubuntu")
    assert validation_config(facts, settings)["data_dir"] == "/home/ubuntu/data"
    lay = layout(facts, settings, Platform(name="p", conda_prefix="~/miniconda3"))
    assert lay.conda_root == "/home/ubuntu/miniconda3"
    assert lay.python_bin == "/home/ubuntu/miniconda3/envs/torch/bin/python"
