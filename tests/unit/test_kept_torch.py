"""What is kept passes the same rule as what is installed: the torch already on a host (ours or
the platform's) against the host's GPUs and driver, and what the plan then does with it."""

from __future__ import annotations

import pytest

from provision.config.inventory import Target, settings_for
from provision.config.recipes import load_platform
from provision.facts.host import HostFacts
from provision.setup.plan import Plan, make_plan
from provision.wheels.installed import check_installed, installed_choice
from provision.wheels.rule import torch_candidates
from tests.cases import captured

RTX5090 = ("index, name, driver_version, memory.total [MiB], memory.used [MiB], compute_cap, "
           "utilization.gpu [%], pci.bus_id, uuid\n"
           "0, NVIDIA GeForce RTX 5090, 580.65.06, 32607 MiB, 1 MiB, 12.0, 0 %, [N/A], [N/A]")
CPU_TORCH = "__version__=2.13.0+cpu cuda:Optional[str]=None "
OLD_CUDA_TORCH = "__version__=2.2.1+cu121 cuda:Optional[str]=12.1 "  # tests/fixtures/torch/version-py-2.2.1-cu121.txt


@pytest.mark.parametrize("version,cuda,driver,driver_cuda,gpus,ok,reason", [
    ("2.1.0+cu121", "12.1", "570.26", "12.8", [("NVIDIA GeForce RTX 5090", "12.0")], False,
     "torch 2.1.0+cu121 has no sm_120 kernels; RTX 5090 needs cu128 or later"),
    ("2.13.0+cpu", None, "580.82.09", "13.0", [("NVIDIA GeForce RTX 3090", "8.6")] * 2, False,
     "torch 2.13.0+cpu is a CPU build; 2x RTX 3090 need a CUDA build"),
    ("1.13.1+cu117", "11.7", "590.48.01", "13.1", [("NVIDIA H200", "9.0")], False,
     "torch 1.13.1+cu117 has no sm_90 kernels; H200 needs cu118 or later"),
    ("2.7.1+cu128", "12.8", "550.54.14", "12.4", [("NVIDIA GeForce RTX 4090", "8.9")], False,
     "torch 2.7.1+cu128 needs CUDA 12.8; driver 550.54.14 supports CUDA <= 12.4"),
    # sm_86 SASS runs on sm_89; a PyPI-named CUDA build is judged by torch.version.cuda
    ("2.5.1", "12.4", "550.54.14", "12.4", [("NVIDIA GeForce RTX 4090", "8.9")], True,
     "CUDA 12.4 within the driver's, kernels for sm_89"),
    ("2.2.1+cu121.with.pypi.cudnn", "12.1", "550.54.14", "12.4",
     [("NVIDIA GeForce RTX 4090", "8.9")], True, "CUDA 12.1 within the driver's, kernels for sm_89"),
    # newer than the data: judged by the nearest release's list for its variant, and says so
    ("2.15.0+cu130", "13.0", "590.48.01", "13.1", [("NVIDIA H200", "9.0")], True,
     "CUDA 13.0 within the driver's, kernels for sm_90 (not in the data: judged by torch "
     "2.14.1+cu130's arch list)"),
    # a variant the data does not know cannot be judged: it is not kept
    ("1.8.1+cu111", "11.1", "590.48.01", "13.1", [("NVIDIA H200", "9.0")], False,
     "torch 1.8.1+cu111 is not in gpu-provision's compatibility data (1.11.0 .. 2.14.1): its "
     "kernels for sm_90 cannot be checked"),
    ("2.13.0+cpu", None, None, None, [], True, "no NVIDIA GPU: any build runs"),
    ("2.14.1+cu130", "13.0", None, None, [], True, "no NVIDIA GPU: any build runs"),
])
def test_installed_build_against_the_rule(version: str, cuda: str | None, driver: str | None,
                                          driver_cuda: str | None, gpus: list[tuple[str, str]],
                                          ok: bool, reason: str) -> None:
    check = check_installed(version, cuda, driver, driver_cuda, gpus)
    assert (check.ok, check.reason) == (ok, reason)


def test_minor_compat_keeps_a_newer_cuda_build_the_driver_runs() -> None:
    gpus = [("NVIDIA GeForce RTX 4090", "8.9")]
    assert not check_installed("2.6.0+cu126", "12.6", "550.54.14", "12.4", gpus).ok
    assert check_installed("2.6.0+cu126", "12.6", "550.54.14", "12.4", gpus, "minor").ok


def test_candidates_are_every_allowed_build_best_first() -> None:
    cands = torch_candidates(driver="590.48.01", compute_caps=["9.0"], python="3.11")
    labels = [c.label for c in cands]
    assert labels[:4] == ["torch 2.14.1+cu130", "torch 2.14.1+cu126", "torch 2.14.0+cu130",
                          "torch 2.14.0+cu126"]
    assert "torch 2.14.1+cu132" not in labels  # CUDA 13.2 is above the driver's 13.1
    cpu = torch_candidates(python="3.11")
    assert [c.label for c in cpu[:3]] == ["torch 2.14.1+cpu", "torch 2.14.0+cpu", "torch 2.13.0+cpu"]


def test_an_installed_build_becomes_what_validation_expects() -> None:
    kept = installed_choice("2.2.1+cu121", "12.1")
    assert (kept.torch, kept.cuda, kept.cuda_version) == ("2.2.1", "cu121", "12.1")
    conda = installed_choice("2.1.0", "12.2")  # a conda build: CUDA 12.2 is no wheel variant
    assert (conda.cuda, conda.cuda_version) == ("cu122", "12.2")
    assert installed_choice("2.13.0+cpu", None).cuda_version is None



def _plan(facts: HostFacts, platform: str = "autodl", cli: dict[str, str] | None = None,
          inventory: dict[str, object] | None = None) -> Plan:
    settings = settings_for(Target(name="box", host="h", settings=inventory or {}), platform, cli)
    return make_plan("box", facts, settings, load_platform(settings.platform))


def _why(plan: Plan, step: str) -> tuple[str | None, str]:
    d = next(d for d in plan.decisions if d.step == step)
    return d.action, d.reason


def test_platform_cpu_torch_on_a_gpu_box_goes_to_an_env_of_ours() -> None:
    facts = captured("autodl", {"envs": f"/root/miniconda3|/root/miniconda3|python3.11|{CPU_TORCH}"})
    plan = _plan(facts)
    action, reason = _why(plan, "env")
    assert action == "create 'torch'"
    assert reason.startswith("the platform's env 'base' keeps its torch 2.13.0+cpu, unchanged "
                             "(torch 2.13.0+cpu is a CPU build; RTX 4090 needs a CUDA build); ")
    action, reason = _why(plan, "torch")
    assert action == "install torch 2.14.1+cu130"
    assert "torch 2.13.0+cpu is a CPU build; RTX 4090 needs a CUDA build" in reason
    assert plan.layout is not None and plan.layout.env_prefix == "/root/miniconda3/envs/torch"
    assert not plan.layout.adopted and plan.blocked is None


def test_platform_torch_without_the_gpus_arch_is_replaced_with_the_reason() -> None:
    facts = captured("autodl", {"smi_query": RTX5090, "envs":
                                f"/root/miniconda3|/root/miniconda3|python3.11|{OLD_CUDA_TORCH}"})
    plan = _plan(facts)
    action, reason = _why(plan, "torch")
    assert action == "install torch 2.14.1+cu130"
    assert reason.startswith("the platform's env 'base' keeps its torch 2.2.1+cu121, unchanged "
                             "(torch 2.2.1+cu121 has no sm_120 kernels; RTX 5090 needs cu128 or "
                             "later); ")


def test_platform_torch_that_passes_is_kept_and_expected_by_validation() -> None:
    facts = captured("autodl", {"envs": f"/root/miniconda3|/root/miniconda3|python3.11|"
                                        f"{OLD_CUDA_TORCH}"})
    plan = _plan(facts)  # an RTX 4090 runs the cu121 build's sm_86 kernels
    action, reason = _why(plan, "torch")
    assert action is None
    assert reason.startswith("keep torch 2.2.1+cu121: CUDA 12.1 within the driver's, kernels for "
                             "sm_89 (the newest the rule allows here is torch 2.14.1+cu130; set "
                             "torch: to change it)")
    assert plan.layout is not None and plan.layout.adopted
    assert plan.torch is not None and (plan.torch.torch, plan.torch.cuda_version) == ("2.2.1", "12.1")


def test_a_pin_the_platform_torch_is_not_goes_to_an_env_of_ours() -> None:
    facts = captured("autodl", {"envs": f"/root/miniconda3|/root/miniconda3|python3.11|"
                                        f"{OLD_CUDA_TORCH}"})
    plan = _plan(facts, inventory={"torch": "2.5"})
    action, reason = _why(plan, "torch")
    assert action == "install torch 2.5.1+cu124"
    assert "(torch 2.2.1+cu121 is not the torch 2.5 asked (torch: in box))" in reason


def test_our_env_keeps_a_torch_that_passes_and_replaces_one_that_fails() -> None:
    base = captured("cpu-only-bootstrapped")
    assert _why(_plan(base, "generic-vm"), "torch") == (
        None, "keep torch 2.13.0+cpu: no NVIDIA GPU: any build runs (the newest the rule allows "
              "here is torch 2.14.1+cpu; set torch: to change it)")
    gpu = captured("autodl", {"envs": "/root/miniconda3|/root/miniconda3|python3.11|\n"
                                      "/root/miniconda3|/root/miniconda3/envs/torch|python3.11|"
                                      f"{CPU_TORCH}"})
    plan = _plan(gpu, inventory={"env_name": "torch"})
    action, reason = _why(plan, "torch")
    assert action == "install torch 2.14.1+cu130"
    assert reason.startswith("replace: torch 2.13.0+cpu is a CPU build; RTX 4090 needs a CUDA "
                             "build; ")


def test_a_pinned_torch_that_fails_the_rule_is_an_error_naming_the_fix() -> None:
    facts = captured("autodl", {"smi_query": RTX5090})
    plan = _plan(facts, cli={"torch": "2.2"})
    assert plan.blocked == ("the torch 2.2 asked (--torch) fails the rule: no torch release "
                            "matching '2.2' ships kernels for sm_120; torch 2.14.1+cu130 does: "
                            "use torch spec 2.14.1")
    assert not any(s.changes for s in plan.steps if s.name in ("torch", "driver"))


def test_a_pin_no_driver_can_save_is_not_a_driver_upgrade() -> None:
    vm = captured("h200", {"smi_query": RTX5090.replace("580.65.06", "590.48.01")})
    plan = _plan(vm, "generic-vm", inventory={"torch": "2.2"})
    assert plan.blocked is not None and plan.blocked.startswith(
        "the torch 2.2 asked (torch: in box) fails the rule: no torch release matching '2.2' "
        "ships kernels for sm_120")
    assert _why(plan, "driver")[0] is None
