"""doctor: each captured failure text gives its diagnosis and fix; fact checks on HostFacts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from provision.doctor.match import diagnose, load_knowledge
from provision.facts.host import Disk, HostFacts
from provision.facts.nvidia import Gpu, GpuProcess
from provision.facts.platform import Virtualization

FIX = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.mark.parametrize("fixture,entry,words", [
    ("nvidia-smi/fail-couldnt-communicate-gcp-debian11.txt", "driver-not-loaded", "driver"),
    ("nvidia-smi/fail-couldnt-communicate-docker-mattshma-108.txt", "driver-not-loaded", "driver"),
    ("nvidia-smi/fail-nvml-mismatch-550.144.txt", "nvml-mismatch", "Reboot"),
    ("nvidia-smi/fail-nvml-mismatch-535.154-vs-550.78-gtx1070.txt", "nvml-mismatch", "Reboot"),
    ("nvidia-smi/fail-command-not-found-ubuntu20.04-es.txt", "no-driver", "driver`: it picks the branch"),
    ("nvidia-smi/fail-device-handle-unknown-error-a-i0.txt", "device-handle-unknown", "naming GPU 0000:09:00.0"),
    ("nvidia-smi/fail-nvml-mismatch-570.124.txt", "nvml-mismatch", "Reboot"),
    ("nvidia-smi/fail-nvml-mismatch-legacy.txt", "nvml-mismatch", "Reboot"),
    ("nvidia-smi/fail-nvml-mismatch-580.178-truenas.txt", "nvml-mismatch", "Reboot"),
    ("nvidia-smi/fail-no-devices-rtx5090.txt", "no-devices", "ask the provider"),
    ("nvidia-smi/fail-gpu-lost.txt", "gpu-lost", "open a ticket"),
    ("nvidia-smi/fail-device-handle-unknown-error-tesla-p4.txt", "device-handle-unknown",
     "naming GPU 0000:07:00.0"),
    ("torch/err-not-compiled-cuda-detectron2-linux.txt", "torch-cpu-build", "--index-url"),
    ("torch/err-not-compiled-cuda-windows.txt", "torch-cpu-build", "--index-url"),
    ("torch/err-driver-too-old-11040.txt", "driver-too-old", "gpu-provision pick --driver"),
    ("torch/warn-driver-too-old-11000-cuda-init.txt", "driver-too-old", "upgrade the driver"),
    ("torch/err-cuda-driver-insufficient-oneline.txt", "driver-too-old", "upgrade the driver"),
    ("torch/err-cuda-driver-insufficient-thcudacheck.txt", "driver-too-old", "upgrade the driver"),
    ("torch/err-no-kernel-image.txt", "no-kernel-image", "gpu-provision -H <host> torch"),
    ("torch/warn-sm120-rtx5090-docker.txt", "arch-not-compatible",
     "torch 2.7.0+cu128 is the first build with sm_120 (it needs driver >= 570.26)"),
    ("torch/warn-sm120-rtx5090-torch2.0.1-cu118.txt", "arch-not-compatible",
     "torch 2.7.0+cu128 is the first build with sm_120"),
    ("torch/warn-sm90-h800-torch1.13.1-cu117.txt", "arch-not-compatible",
     "torch 2.0.0+cu118 is the first build with sm_90 (it needs driver >= 520.61.05)"),
])
def test_each_captured_failure_gets_its_diagnosis(fixture: str, entry: str, words: str) -> None:
    findings = diagnose({fixture: (FIX / fixture).read_text()})
    assert [f.id for f in findings] == [entry]
    assert findings[0].level == "error"
    assert words in findings[0].fix
    assert findings[0].evidence.startswith(fixture + ": ")


def test_an_old_driver_is_explained_not_an_error() -> None:
    [f] = diagnose({"smi": (FIX / "nvidia-smi/fail-query-compute-cap-invalid-field.txt").read_text()})
    assert (f.id, f.level) == ("old-driver-no-compute-cap", "info")


def test_driver_too_old_names_the_drivers_cuda() -> None:
    [f] = diagnose({"log": (FIX / "torch/err-driver-too-old-11040.txt").read_text()})
    assert "(the driver supports CUDA 11.4)" in f.diagnosis


def test_both_arch_texts_in_one_log_give_both_findings() -> None:
    text = (FIX / "torch/warn-sm120-and-no-kernel-image-rtx5090-journald.txt").read_text() + \
        (FIX / "torch/err-no-kernel-image-rtx5090-journald.txt").read_text()
    assert {f.id for f in diagnose({"journal": text})} == {"arch-not-compatible", "no-kernel-image"}


@pytest.fixture(scope="module")
def healthy(cpu_host: HostFacts) -> HostFacts:
    """A provisioned RTX 4090 VM with nothing wrong."""
    return replace(cpu_host, gpus=(Gpu(0, "NVIDIA GeForce RTX 4090", "550.54.14", 24564, 1, "8.9"),),
                   nvidia_state="ok", driver="550.54.14", driver_cuda="12.4", nvcc=None,
                   gpu_processes=(), nouveau_loaded=False, secure_boot=False,
                   nvidia_ko_for_kernel=True, driver_packages=("nvidia-driver-550 550.54.14-0",),
                   torch_installers={"/root/miniconda3/envs/torch": ("pip",)},
                   virtualization=Virtualization("vm", "kvm", "test"), home="/root",
                   disks=(Disk("/root", "/", 80.0, 100.0),))


def test_a_healthy_host_gives_no_finding(healthy: HostFacts) -> None:
    assert diagnose({}, healthy) == []


def _ids(facts: HostFacts, texts: dict[str, str] | None = None) -> list[str]:
    return [f.id for f in diagnose(texts or {}, facts, host="my-4090")]


SMI_NOT_LOADED = (FIX / "nvidia-smi/fail-couldnt-communicate-gcp-debian11.txt").read_text()


@pytest.mark.parametrize("change,cause", [
    ({"nouveau_loaded": True}, "driver-not-loaded-nouveau"),
    ({"secure_boot": True}, "driver-not-loaded-secure-boot"),
    ({"nvidia_ko_for_kernel": False}, "driver-not-loaded-kernel-changed"),
    ({"virtualization": Virtualization("container", "docker", "test")}, "driver-not-loaded-container"),
    ({}, "driver-not-loaded"),
])
def test_driver_not_loaded_names_the_cause(healthy: HostFacts, change: dict[str, object],
                                           cause: str) -> None:
    facts = replace(healthy, nvidia_state="not_communicating", nvidia_output=SMI_NOT_LOADED,
                    gpus=(), **change)  # type: ignore[arg-type]
    assert _ids(facts, {"nvidia-smi": facts.nvidia_output}) == [cause]


def test_a_gpu_without_a_driver(healthy: HostFacts) -> None:
    from provision.facts.pci import PciGpu
    bare = replace(healthy, nvidia_state="no_driver", gpus=(), driver=None,
                   pci_gpus=(PciGpu("01:00.0", "AD102 [GeForce RTX 4090]", "2684"),))
    [f] = diagnose({}, bare, host="my-4090")
    assert f.id == "no-driver-gpu-present" and "AD102 [GeForce RTX 4090]" in f.diagnosis
    assert "gpu-provision -H my-4090 driver" in f.fix


def test_fact_findings(healthy: HostFacts) -> None:
    busy = replace(healthy, gpu_processes=(GpuProcess(4242, "python", 20480),))
    [f] = diagnose({}, busy)
    assert f.id == "gpu-busy" and "python (pid 4242, 20480 MiB)" in f.diagnosis
    assert _ids(replace(healthy, gpus=(replace(healthy.gpus[0], memory_used_mib=18000),))) == ["gpu-busy"]
    assert _ids(replace(healthy, driver_packages=("nvidia-driver-535 535.183.01-0",
                                                  "nvidia-driver-550 550.54.14-0"))) == \
        ["several-driver-packages"]
    assert _ids(replace(healthy, torch_installers={"/opt/conda": ("conda", "pip")})) == \
        ["torch-conda-and-pip"]
    # the torch step installs with uv where it can: its INSTALLER file says "uv"
    [mixed] = diagnose({}, replace(healthy, torch_installers={"/opt/conda": ("conda", "uv")}))
    assert mixed.id == "torch-conda-and-pip" and "by both conda and uv" in mixed.diagnosis
    assert _ids(replace(healthy, torch_installers={"/opt/conda": ("uv",)})) == []
    [full] = diagnose({}, replace(healthy, disks=(Disk("/root", "/", 1.2, 100.0),)))
    assert full.id == "disk-nearly-full" and "1.2 GB free of 100.0 GB" in full.diagnosis
    [small] = diagnose({}, replace(healthy, disks=(Disk("/root", "/", 20.0, 30.0),
                                                   Disk("/root/autodl-tmp", "/root/autodl-tmp",
                                                        190.0, 200.0))))
    assert small.id == "home-small-beside-data" and "HF_HOME=/root/autodl-tmp" in small.fix
    [nvcc] = diagnose({}, replace(healthy, nvcc="11.8"))
    assert nvcc.level == "info" and "CUDA 11.8" in nvcc.diagnosis and "CUDA 12.4" in nvcc.diagnosis


def test_fact_entries_need_a_host() -> None:
    assert all(e.match or e.when for e in load_knowledge())
    assert diagnose({"x": "nothing known here"}) == []
