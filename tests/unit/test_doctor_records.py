"""doctor reads the tool's own records first (the steps whose last run failed, the last
verdict that was not PASS) and checks a diagnosis against what the host has: a "no kernel
image" where the env's torch has the GPU's kernels blames an extension or another Python."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from provision.doctor.match import diagnose
from provision.doctor.records import decisive_line, recorded
from provision.facts.host import CondaEnv, HostFacts
from provision.facts.nvidia import Gpu

FIX = Path(__file__).resolve().parents[1] / "fixtures"
NO_KERNEL_IMAGE = (FIX / "torch/err-no-kernel-image.txt").read_text()


@pytest.fixture(scope="module")
def rented(cpu_host: HostFacts) -> HostFacts:
    """A bootstrapped RTX 4090 host whose env has torch 2.5.1+cu124 (sm_89 kernels)."""
    env = CondaEnv("/root/miniconda3", "/root/miniconda3/envs/torch", "torch", "3.11",
                   "2.5.1+cu124", "12.4")
    return replace(cpu_host, gpus=(Gpu(0, "NVIDIA GeForce RTX 4090", "550.54.14", 24564, 1, "8.9"),),
                   nvidia_state="ok", driver="550.54.14", driver_cuda="12.4", envs=(env,))


def test_a_recorded_fail_is_always_an_error_finding_first(rented: HostFacts) -> None:
    """Right after a bootstrap whose validation said FAIL ("no libcuda.so.1"), doctor names that
    verdict and its failing check first, as an error: never "nothing found"."""
    f = replace(rented, journal={"verdict": {"step": "verdict", "result": "FAIL", "at": 10}})
    report = {"verdict": "FAIL", "checks": [
        {"name": "torch", "status": "pass", "reason": "torch 2.5.1+cu124 imports"},
        {"name": "cuda available", "status": "fail", "reason": "no libcuda.so.1 on this host"}]}
    [found] = recorded(f, report, "my-4090")
    assert (found.id, found.level) == ("recorded-verdict", "error")
    assert found.diagnosis == ("The last validation on this host says FAIL: cuda available: no "
                               "libcuda.so.1 on this host.")
    assert "gpu-provision -H my-4090 validate" in found.fix


def test_a_failed_step_is_named_with_its_decisive_line(rented: HostFacts) -> None:
    log = ("Reading package lists...\nGet:1 http://archive.ubuntu.com jammy InRelease\n"
           "E: You don't have enough free space in /var/cache/apt/archives/.\n"
           "step driver: exit code 100\n")
    f = replace(rented, journal={
        "conda": {"step": "conda", "result": "ok", "exit": 0, "at": 1, "run": "r1"},
        "driver": {"step": "driver", "result": "failed", "exit": 100, "at": 2, "run": "r1"}},
        step_logs={"driver": log})
    [found] = recorded(f, None, "box")
    assert found.level == "error"
    assert found.diagnosis.startswith("The last driver step on this host failed (exit 100, run r1)")
    assert "step driver: exit code 100" in found.diagnosis or "free space" in found.diagnosis
    assert decisive_line("ok\nall good\n") == "all good"


def test_nothing_recorded_nothing_said(rented: HostFacts) -> None:
    f = replace(rented, journal={"verdict": {"result": "PASS"},
                                 "torch": {"step": "torch", "result": "ok", "exit": 0}})
    assert recorded(f, None, "box") == []
    assert recorded(None, None, "box") == []


def test_no_kernel_image_where_the_envs_torch_has_the_kernels_blames_an_extension(
        rented: HostFacts) -> None:
    [found] = [x for x in diagnose({"job": NO_KERNEL_IMAGE}, rented, host="my-4090")
               if x.id == "no-kernel-image"]
    assert "the env's torch 2.5.1+cu124 ships kernels for it" in found.diagnosis
    assert "extension" in found.diagnosis
    assert 'TORCH_CUDA_ARCH_LIST="8.9"' in found.fix
    assert "which python" in found.fix


def test_no_kernel_image_where_the_envs_torch_lacks_them_still_blames_torch(
        rented: HostFacts) -> None:
    f = replace(rented, gpus=(Gpu(0, "NVIDIA GeForce RTX 5090", "570.124.04", 32607, 1, "12.0"),),
                driver="570.124.04", driver_cuda="12.8")
    [found] = [x for x in diagnose({"job": NO_KERNEL_IMAGE}, f, host="box")
               if x.id == "no-kernel-image"]
    assert found.diagnosis.startswith("The torch build has no kernels for this GPU's architecture")
    assert "cu128" in found.fix
