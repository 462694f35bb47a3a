"""The verdict rules of the validation payload (templates/gpu/gpu_verdict.py), judged on
measurement files (tests/fixtures/validation, SOURCES.md says where each figure comes from) and
on the provisioner's config; the model table's name matching."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from provision.config.inventory import Target, merge_settings
from provision.config.recipes import load_platform, load_recipe
from provision.facts.host import HostFacts
from provision.facts.nvidia import Gpu
from provision.ops.validate import (
    gpu_model,
    gpu_reference,
    parse_gpu_claim,
    read_validation,
    validation_config,
)
from tests.unit.gpu_payload import FIX, judged, payload


def test_healthy_card_passes() -> None:
    verdict, checks = judged("rtx4090-healthy")
    assert verdict == "PASS", checks
    assert set(checks) == {"driver", "torch import", "cuda available", "gpu count", "gpu 0 matmul",
                           "gpu 0 speed", "gpu 0 bandwidth", "gpu busy", "advertised gpu"}
    assert "fp16 150.2 (floor 115.6 of peak 165.2)" in checks["gpu 0 speed"][1]


def test_throttled_card_warns_with_its_clocks_under_load() -> None:
    verdict, checks = judged("rtx4090-throttled")
    assert verdict == "WARN"
    status, reason = checks["gpu 0 speed"]
    assert status == "warn"
    assert reason.startswith("NVIDIA GeForce RTX 4090: fp32, tf32, bf16, fp16 below the healthy "
                             "floor for this model: throttled, power-capped, shared or not the card")
    assert reason.endswith("under load: SM clock 1155/2520 MHz, power limit 200.00 W, 87 C")


def test_a_t4_at_its_70w_cap_is_healthy() -> None:
    """A T4 sustains about 24 of its 65 fp16 TFLOPS (NVIDIA: power capping, expected): 0.37 of
    peak, which the old fixed 0.5 x datasheet floor called throttled."""
    verdict, checks = judged("t4-published")
    # the captured T4 had 1 GB in use by a process its container could not see: the only warning
    assert [n for n, (s, _) in checks.items() if s != "pass"] == ["gpu busy"], checks
    assert checks["gpu 0 speed"][1] == (
        "Tesla T4: every figure at or above the healthy floor (fp16 24.0 (floor 16.8 of peak 65.0); "
        "fp32 4.35 (floor 3.0 of peak 8.1))")


def test_an_l4_at_its_72w_cap_is_healthy() -> None:
    verdict, checks = judged("l4-published")
    assert verdict == "PASS", checks
    assert "fp32 10.66 (floor 7.5 of peak 30.3)" in checks["gpu 0 speed"][1]


def test_one_throttled_card_of_eight_is_named_by_its_own_clocks() -> None:
    verdict, checks = judged("8xh100-one-throttled")
    assert verdict == "WARN"
    slow = [n for n, (s, _) in checks.items() if n.endswith(" speed") and s == "warn"]
    assert slow == ["gpu 5 speed"]
    reason = checks["gpu 5 speed"][1]
    assert "fp16 442.3 (floor 530.7 of peak 989.4)" in reason
    assert reason.endswith("under load: SM clock 1155/1980 MHz, power 402.77/700.00 W, 88 C, clocks "
                           "held by hw_thermal_slowdown, sw_thermal_slowdown")
    assert "SM clock 1980/1980 MHz" in checks["gpu 4 speed"][1]


def test_a_mig_instance_is_reported_as_mig_and_judged_by_its_share() -> None:
    verdict, checks = judged("h100-mig-3g40gb")
    assert checks["gpu count"] == ("pass", "torch sees 1 GPU(s), nvidia-smi 1 (0 whole GPU(s) and 4 MIG "
                                           "instance(s) on GPU 0, of which a process uses one)")
    status, reason = checks["gpu 0 speed"]
    assert status == "pass" and reason.startswith("NVIDIA H100 80GB HBM3 MIG 3g.40gb, a MIG instance "
                                                  "with 0.45 of the GPU: every figure")
    assert "fp16 344.6 (floor 241.2 of peak 449.7)" in reason
    assert verdict == "PASS", checks


def test_a_figure_above_peak_is_a_measurement_error() -> None:
    case = json.loads((FIX / "rtx4090-healthy.json").read_text())
    case["measurements"]["gpus"][0]["tflops"]["fp16"] = 1523.0  # events that timed only launches
    checks = {c["name"]: c for c in payload("gpu_verdict").judge(case["measurements"], case["config"])}
    assert checks["gpu 0 speed"]["status"] == "warn"
    assert "fp16 1523.0 is 9.22x the datasheet peak: a measurement error (the timing did not cover " \
           "the work), not a faster card" in checks["gpu 0 speed"]["reason"]


def test_busy_gpu_is_named_with_its_process_and_the_free_ones() -> None:
    verdict, checks = judged("8xh100-gpu3-busy")
    assert verdict == "WARN"
    assert checks["gpu busy"] == ("warn", "GPU 3: 20.7 GB held by pid 1187424 (python), 97% busy; "
                                          "GPUs 0-2, 4-7 are free: run with --gpus 0,1,2,4,5,6,7")


def test_health_evidence_unknown_stays_unknown() -> None:
    gv = payload("gpu_verdict")
    assert gv.num("[N/A]") is None and gv.num("[Not Supported]") is None and gv.num("") is None
    assert gv.num("0") == 0.0 and gv.num("345 MHz") == 345.0
    case = json.loads((FIX / "h100-mig-3g40gb.json").read_text())
    checks = {c["name"]: c for c in gv.judge(case["measurements"], case["config"])}
    assert checks["gpu health"]["status"] == "pass"  # remapped rows [N/A] on this capture: unknown
    rows = case["measurements"]["health"]["remapped"]
    rows[0].update({"remapped_rows.pending": "Yes"})
    checks = {c["name"]: c for c in gv.judge(case["measurements"], case["config"])}
    assert checks["gpu health"] == {"name": "gpu health", "status": "warn", "reason":
                                    "GPU 0: a remapped row is pending: reset the GPU to apply it"}


def test_the_link_under_load_is_what_host_to_device_is_judged_by() -> None:
    case = json.loads((FIX / "rtx4090-healthy.json").read_text())
    g = case["measurements"]["gpus"][0]
    g["link"] = {"pcie.link.gen.current": "3", "pcie.link.width.current": "8",
                 "pcie.link.gen.max": "4", "pcie.link.width.max": "16"}
    g["h2d_gbs"] = 6.1
    checks = {c["name"]: c for c in payload("gpu_verdict").judge(case["measurements"], case["config"])}
    assert checks["gpu 0 bandwidth"] == {
        "name": "gpu 0 bandwidth", "status": "warn", "reason":
        "host-to-device 6.1 GB/s on PCIe gen 3 x8 (about 6 expected); the GPU can do gen 4 x16: "
        "the slot, riser or BIOS gives it less"}


def test_busy_card_warns_naming_the_process() -> None:
    verdict, checks = judged("rtx4090-busy")
    assert verdict == "WARN"
    assert checks["gpu busy"] == ("warn", "GPU 0: 17.9 GB held by pid 30211 (python3), 0% busy; no GPU "
                                          "is free (a shared or dirty instance)")


def test_wrong_model_fails() -> None:
    verdict, checks = judged("a100-advertised-as-h100")
    assert verdict == "FAIL"
    assert checks["advertised gpu"] == ("fail", "H100 x1 was advertised, the host has 1: "
                                                "NVIDIA A100-SXM4-40GB (the model is A100)")
    assert checks["gpu 0 speed"][0] == "pass"  # a healthy A100 - just not what was paid for


def test_an_l40_is_not_an_advertised_l4() -> None:
    gv = payload("gpu_verdict")
    assert not gv.claim_matches("L4", "NVIDIA L40") and gv.claim_matches("L4", "NVIDIA L4")
    assert gv.claim_matches("H100", "NVIDIA H100 80GB HBM3") and not gv.claim_matches("A10", "NVIDIA A10G")


def test_missing_gpu_fails() -> None:
    verdict, checks = judged("rtx4090-x2-torch-sees-one")
    assert verdict == "FAIL"
    assert checks["gpu count"] == ("fail", "torch sees 1 GPU(s), nvidia-smi 2")
    assert checks["advertised gpu"][0] == "pass"  # nvidia-smi does list both


def test_cuda_visible_devices_is_counted() -> None:
    case = json.loads((FIX / "rtx4090-x2-torch-sees-one.json").read_text())
    case["measurements"]["env"] = {"CUDA_VISIBLE_DEVICES": "1"}
    checks = {c["name"]: c for c in payload("gpu_verdict").judge(case["measurements"], case["config"])}
    assert checks["gpu count"] == {"name": "gpu count", "status": "pass", "reason":
                                   "torch sees 1 GPU(s), nvidia-smi 2; CUDA_VISIBLE_DEVICES=1 shows "
                                   "this process 1"}


def test_fewer_gpus_than_advertised_fails() -> None:
    case = json.loads((FIX / "rtx4090-healthy.json").read_text())
    case["config"]["advertised"] = {"model": "RTX 4090", "count": 4}
    checks = {c["name"]: c for c in payload("gpu_verdict").judge(case["measurements"], case["config"])}
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
def test_gpu_host_failures(change: dict[str, Any], name: str, status: str, words: str) -> None:
    case = json.loads((FIX / "rtx4090-healthy.json").read_text())
    case["measurements"].update(change)
    report = payload("gpu_verdict").report(case["measurements"], case["config"])
    check = next(c for c in report["checks"] if c["name"] == name)
    assert (report["verdict"], check["status"]) == ("FAIL", status) and words in check["reason"]


def test_kernels_rule() -> None:
    gv = payload("gpu_verdict")
    arches = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
    assert gv.has_kernels(arches, "8.9")  # sm_86 runs on 8.9
    assert not gv.has_kernels(arches, "12.0")
    assert gv.has_kernels(arches + ["sm_100", "sm_120"], "12.0")
    assert gv.has_kernels(["sm_90a"], "9.0") and not gv.has_kernels(["sm_90"], "8.6")


def test_cpu_mode() -> None:
    m = {"smi": None, "host": {"cpu_cores": 2, "memory_gb": 23.4, "disks": []},
         "torch": {"version": "2.13.0+cpu", "cuda": None, "error": None, "cpu_matmul_ok": True},
         "gpus": [], "cpu_gflops": 80.0, "libcuda": None}
    report = payload("gpu_verdict").report(m, {"expected_gpus": 0, "thresholds": {"min_cpu_cores": 4}})
    assert report["mode"] == "cpu" and report["verdict"] == "PASS"
    assert [c["name"] for c in report["checks"]] == ["torch import", "cpu matmul", "cuda build"]
    # the recipe's minimums are judged on what the host measured, by the rule plan applies
    read = read_validation(report, {"min_cpu_cores": 4, "min_memory_gb": 16})
    assert read.verdict == "WARN" and read.report is not None
    assert read.report["checks"][-2:] == [
        {"name": "cpu cores", "status": "warn", "reason": "2, the recipe wants at least 4"},
        {"name": "memory", "status": "pass", "reason": "23.4 GB, the recipe wants at least 16 GB"}]


def test_healthy_card_with_the_recipes_minimums() -> None:
    gv = payload("gpu_verdict")
    case = json.loads((FIX / "rtx4090-healthy.json").read_text())
    need = {k: v for k, v in case["config"]["thresholds"].items() if k.startswith("min_")
            and k not in ("min_tflops_ratio", "min_bandwidth_ratio")}
    read = read_validation(gv.report(case["measurements"], case["config"]),
                           {**need, "min_gpu_memory_gb": 15})
    assert read.verdict == "PASS" and read.report is not None
    names = {c["name"]: c["status"] for c in read.report["checks"]}
    assert {k: names[k] for k in ("cpu cores", "memory", "free disk /root",
                                  "GPU memory (GPU 0)")} == dict.fromkeys(
        ("cpu cores", "memory", "free disk /root", "GPU memory (GPU 0)"), "pass")
    short = read_validation(gv.report(case["measurements"], case["config"]),
                            {"min_gpu_memory_gb": 40})
    assert short.verdict == "WARN"


@pytest.mark.parametrize("name,model", [
    ("NVIDIA L4", "L4"), ("NVIDIA L40", "L40"), ("NVIDIA L40S", "L40S"), ("Tesla T4", "T4"),
    ("NVIDIA A10", "A10"), ("NVIDIA A10G", "A10G"), ("NVIDIA A40", "A40"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"), ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"), ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200"), ("NVIDIA H200 NVL", "H200 NVL"), ("NVIDIA H800", "H800"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"), ("NVIDIA RTX A6000", "RTX A6000"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("Tesla V100-SXM2-32GB", "V100"),
    ("Tesla V100-PCIE-16GB", "V100 PCIe"), ("Quadro RTX 6000", None), ("NVIDIA GeForce GTX 1080", None),
])
def test_models_match_by_whole_words(name: str, model: str | None) -> None:
    assert gpu_model(name) == model


def test_reference_figures_and_their_floors() -> None:
    t4 = gpu_reference("Tesla T4")
    assert t4 is not None and t4["peak"]["fp16"] == 65.0 and t4["peak"]["bf16"] is None
    assert t4["floor"] == {"fp16": 16.8, "fp32": 3.0}  # 0.7 x the published sustained figures
    assert "forums.developer.nvidia.com" in t4["sustained_source"]
    h100 = gpu_reference("NVIDIA H100 80GB HBM3")
    assert h100 is not None and h100["floor"]["bf16"] == 556.1 and h100["mem_gbs"] == 3350
    assert gpu_reference("NVIDIA GeForce GTX 1080") is None
    assert parse_gpu_claim("RTX 4090 x2") == {"model": "RTX 4090", "count": 2}
    assert parse_gpu_claim("H100") == {"model": "H100", "count": 1}
    assert parse_gpu_claim(None) is None


def test_every_model_row_has_its_sources() -> None:
    from provision.ops.validate import _perf_table
    share, table = _perf_table()
    assert share == 0.7
    for key, row in table.items():
        assert row["source"] and row["mem_gbs"] and row["sms"], key
        assert set(row["peak"]) == {"fp32", "tf32", "fp16", "bf16"}, key
        if row.get("sustained"):
            assert row["sustained_source"], key
            for dtype, value in row["sustained"].items():  # a published figure never beats the peak by
                peak = row["peak"].get(dtype)  # more than the measurement error validation flags
                assert peak is None or value <= payload("gpu_verdict").MEASUREMENT_ERROR * peak, (key, dtype)


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
    assert cfg["reference"]["NVIDIA GeForce RTX 4090"]["floor"]["fp16"] == 115.6


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
