"""doctor on real error texts from public threads (tests/fixtures/errors, sources in SOURCES.md):
each text gives its entry, every entry is seen in at least two wordings, healthy output stays
silent, and the normaliser makes kernel-log, wrapped and typographic variants match."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from provision.doctor.match import diagnose, load_knowledge, normalise
from provision.facts.host import HostFacts
from provision.facts.nvidia import GpuProcess

FIX = Path(__file__).resolve().parent.parent / "fixtures"
ERRORS = FIX / "errors"

# file (under tests/fixtures) -> the entries doctor must name, and nothing else
EXPECTED = {
    "errors/fabric-manager/fm-version-mismatch-530-gpu-operator-544.txt": "fabric-manager-version",
    "errors/fabric-manager/fm-version-mismatch-550-typographic-nvtrust-55.txt":
        "fabric-manager-version",
    "errors/fabric-manager/fm-version-mismatch-580-wrapped-gpu-driver-container-735.txt":
        "fabric-manager-version",
    "errors/fabric-manager/fm-version-mismatch-460-microk8s-2119.txt": "fabric-manager-version",
    "errors/fabric-manager/err802-userwarning-lisa-2823.txt": "fabric-manager-not-running",
    "errors/fabric-manager/err802-runtimeerror-h200-hf-hub-4134.txt": "fabric-manager-not-running",
    "errors/fabric-manager/err802-thcgeneral-pytorch-35710.txt": "fabric-manager-not-running",
    "errors/fabric-manager/err802-bandwidthtest-pytorch-35710.txt": "fabric-manager-not-running",
    "errors/gpu-hardware/xid79-dmesg-T-akash-support-209.txt": "gpu-fallen-off-bus",
    "errors/gpu-hardware/xid79-rtx5080-open-gpu-kernel-modules-1151.txt": "gpu-fallen-off-bus",
    "errors/gpu-hardware/fallen-off-bus-wrapped-no-xid-nvsentinel-155.txt": "gpu-fallen-off-bus",
    "errors/gpu-hardware/xid48-dbe-syslog-gpu-operator-1146.txt": "gpu-ecc-error",
    "errors/gpu-hardware/xid63-row-remapper-ml-engineering.txt": "gpu-ecc-error",
    "errors/gpu-hardware/cuda-ecc-uncorrectable-accelerate-1192.txt": "gpu-ecc-error",
    "errors/gpu-hardware/cuda-ecc-uncorrectable-tensorflow-deepfacelab-89.txt": "gpu-ecc-error",
    "errors/gpu-hardware/cuda-ecc-uncorrectable-thc-39-semantic-segmentation-33.txt":
        "gpu-ecc-error",
    "errors/gpu-hardware/cuda-ecc-uncorrectable-runpod-ai-toolkit-470.txt": "gpu-ecc-error",
    "errors/kernel-log/api-mismatch-rsyslog-012-ansible-slurm-appliance-287.txt": "nvml-mismatch",
    "errors/kernel-log/api-mismatch-named-client-dmesg-nvidia-all-394.txt": "nvml-mismatch",
    "errors/kernel-log/api-mismatch-named-client-journal-open-gpu-kernel-modules-829.txt":
        "nvml-mismatch",
    "errors/kernel-log/api-mismatch-journalctl-nvidia-docker-182.txt": "nvml-mismatch",
    "errors/kernel-log/api-mismatch-dmesg-vgpu-guest-index-1.txt": "nvml-mismatch",
    "errors/kernel-log/nouveau-probe-not-called-ironhide-41.txt": "nouveau-holds-gpu",
    "misc/dmesg-nvrm-nouveau-conflict-3gpus.txt": "nouveau-holds-gpu",
    "errors/container/libcuda-missing-docker-no-gpus-stable-diffusion-cpp-1352.txt":
        "libcuda-missing",
    "errors/container/libcuda-missing-tensorflow-dso-loader-4931.txt": "libcuda-missing",
    "errors/container/libcuda-missing-via-cudnn-herro-76.txt": "libcuda-missing",
    "errors/container/libcuda-missing-cupy-hugectr-367.txt": "libcuda-missing",
    "errors/container/docker-no-gpu-runtime-xagent-273.txt": "docker-no-gpu-runtime",
    "errors/container/docker-no-gpu-runtime-no-quotes-nvidia-docker-1642.txt":
        "docker-no-gpu-runtime",
    "errors/container/docker-no-gpu-runtime-compose-nvidia-ragflow-9573.txt":
        "docker-no-gpu-runtime",
    "errors/container/nvml-unknown-after-daemon-reload-nvidia-docker-1671.txt":
        "nvml-unknown-error",
    "errors/container/nvml-unknown-typographic-nvidia-container-toolkit-115.txt":
        "nvml-unknown-error",
    "errors/container/nvml-unknown-listing-nvidia-container-toolkit-1227.txt":
        "nvml-unknown-error",
    "errors/container/err804-docker-rtx3090-icra2024-sim2real-5.txt": "cuda-forward-compat",
    "errors/container/err804-vllm-engine-gpustack-1540.txt": "cuda-forward-compat",
    "errors/container/err804-onnxruntime-cuda-failure-21435.txt": "cuda-forward-compat",
    "errors/container/err804-wrapped-taskmatrix-379.txt": "cuda-forward-compat",
    "errors/libraries/libcudnn8-import-torch-pytorch-104259.txt": "cuda-lib-missing",
    "errors/libraries/libcudnn9-lib64-split-pytorch-165812.txt": "cuda-lib-missing",
    "errors/libraries/libcudart-tensorflow-dlerror-dreamtalk-32.txt": "cuda-lib-missing",
    "errors/libraries/libc10-cuda-pytorch-54827.txt": "cuda-lib-missing",
    "errors/libraries/undefined-symbol-c10-error-flash-attention-1832.txt": "torch-extension-abi",
    "errors/libraries/undefined-symbol-at-ops-flash-attention-784.txt": "torch-extension-abi",
    "errors/libraries/undefined-symbol-rank-prefix-transformer-engine-sglang-851.txt":
        "torch-extension-abi",
    "errors/libraries/cudnn-mismatch-rich-wrapped-kohya-ss-1096.txt": "cudnn-version-mismatch",
    "errors/libraries/cudnn-mismatch-ld-library-path-gladia-928.txt": "cudnn-version-mismatch",
    "errors/libraries/cudnn-mismatch-linked-against-pytorch-80637.txt": "cudnn-version-mismatch",
    "errors/libraries/cudnn-mismatch-old-numbers-centernet-119.txt": "cudnn-version-mismatch",
    "errors/libraries/glibc-2.28-ldd-libtorch-pytorch-129555.txt": "glibc-too-old",
    "errors/libraries/glibc-2.27-import-torch-centos7-pytorch-150724.txt": "glibc-too-old",
    "errors/libraries/glibc-2.33-oserror-pyg-lib-548.txt": "glibc-too-old",
    "errors/install/pip-no-match-py312-imagebind-139.txt": "pip-no-matching-distribution",
    "errors/install/pip-no-match-py313-cu121-index-spag4d-1.txt": "pip-no-matching-distribution",
    "errors/install/pip-no-match-old-pip-opennre-213.txt": "pip-no-matching-distribution",
    "errors/install/pip-resolution-impossible-torchvision-lora-scripts-375.txt":
        "pip-resolution-impossible",
    "errors/install/pip-resolution-impossible-requirements-tabular-transfer-1.txt":
        "pip-resolution-impossible",
    "errors/install/pip-killed-after-progress-bar-pytorch-1022.txt": "pip-killed",
    "errors/install/pip-oom-kill-dmesg-pytorch-1022.txt": "pip-killed",
    "errors/install/pip-killed-mirror-gqlalchemy-230.txt": "pip-killed",
    "errors/install/conda-tos-ansible-miniconda-38.txt": "conda-tos",
    "errors/install/conda-tos-newer-wording-clio-core-77.txt": "conda-tos",
    "errors/install/conda-tos-ci-timestamps-cudf-spark-13114.txt": "conda-tos",
    "errors/install/conda-python-3.7-not-found-conda-12615.txt": "conda-python-not-found",
    "errors/install/conda-python-3.6.15-osx-arm64-conda-12925.txt": "conda-python-not-found",
    "errors/install/conda-python-3.6-one-channel-anaconda-issues-10011.txt":
        "conda-python-not-found",
    "errors/runtime/cuda-oom-old-wording-mmsegmentation-944.txt": "cuda-oom",
    "errors/runtime/cuda-oom-cached-wording-pytorch-examples-621.txt": "cuda-oom",
    "errors/runtime/cuda-oom-new-wording-pytorch-16417.txt": "cuda-oom",
    "errors/runtime/cuda-oom-other-process-wrapped-pytorch-99699.txt": "cuda-oom",
    "errors/runtime/cuda-error-out-of-memory-iim-28.txt": "cuda-oom",
    "errors/runtime/cublas-not-initialized-windows-llama2c-279.txt": "cublas-not-initialized",
    "errors/runtime/cublas-not-initialized-prose-tianchi-10.txt": "cublas-not-initialized",
    "errors/runtime/cublas-library-not-initialized-thc-diracnets-7.txt": "cublas-not-initialized",
    "errors/runtime/illegal-memory-access-old-wording-tegnas-19.txt": "illegal-memory-access",
    "errors/runtime/illegal-memory-access-rich-wrapped-sdnext-1574.txt": "illegal-memory-access",
    "errors/runtime/illegal-memory-access-logger-regtr-33.txt": "illegal-memory-access",
    "errors/runtime/nccl-shm-failed-extend-nccl-tests-166.txt": "shm-too-small",
    "errors/runtime/nccl-shm-posix-fallocate-nccl-342.txt": "shm-too-small",
    "errors/runtime/nccl-shm-no-space-28-pytorch-ci-infra-490.txt": "shm-too-small",
    "errors/runtime/dataloader-shm-bus-error-pipedream-28.txt": "shm-too-small",
    "errors/runtime/dataloader-shm-after-progress-bar-smp-172.txt": "shm-too-small",
    "errors/runtime/nccl-unhandled-system-error-cogvlm2-178.txt": "nccl-error",
    "errors/runtime/nccl-unhandled-system-error-thd-pytorch-4921.txt": "nccl-error",
    "errors/runtime/nccl-watchdog-timeout-old-ofa-271.txt": "nccl-timeout",
    "errors/runtime/nccl-watchdog-timeout-rank-prefix-basicsr-737.txt": "nccl-timeout",
}

# The entries added for these texts: each must be named by at least two texts that differ.
NEW_ENTRIES = {
    "nouveau-holds-gpu", "gpu-fallen-off-bus", "gpu-ecc-error", "fabric-manager-version",
    "fabric-manager-not-running", "docker-no-gpu-runtime", "nvml-unknown-error",
    "cuda-forward-compat", "libcuda-missing", "cuda-lib-missing", "torch-extension-abi",
    "cudnn-version-mismatch", "glibc-too-old", "pip-no-matching-distribution",
    "pip-resolution-impossible", "pip-killed", "conda-tos", "conda-python-not-found", "cuda-oom",
    "cublas-not-initialized", "illegal-memory-access", "shm-too-small", "nccl-error",
    "nccl-timeout",
}

# Healthy output that must stay silent: the collected no-error texts, every nvidia-smi capture
# that is not a failure, and the torch checks of working installs.
SILENT = sorted(str(p.relative_to(FIX)) for p in (ERRORS / "silent").glob("*.txt")) + sorted(
    str(p.relative_to(FIX)) for p in (FIX / "nvidia-smi").iterdir()
    if not p.name.startswith("fail-")) + sorted(
    str(p.relative_to(FIX)) for p in (FIX / "torch").glob("check-*"))


def _read(rel: str) -> str:
    return (FIX / rel).read_text(encoding="utf-8")


@pytest.mark.parametrize("fixture,entry", sorted(EXPECTED.items()))
def test_each_collected_text_gets_its_entry(fixture: str, entry: str) -> None:
    findings = diagnose({fixture: _read(fixture)})
    assert [f.id for f in findings] == [entry]
    assert findings[0].evidence.startswith(fixture + ": ")
    assert "{" not in findings[0].diagnosis + findings[0].fix  # every placeholder was filled


def test_every_collected_text_is_in_the_table() -> None:
    collected = {str(p.relative_to(FIX)) for p in ERRORS.rglob("*.txt")
                 if p.parent.name != "silent"}
    assert collected == {f for f in EXPECTED if f.startswith("errors/")}


def test_each_new_entry_is_seen_in_two_wordings() -> None:
    known = {e.id for e in load_knowledge()}
    assert NEW_ENTRIES <= known
    for entry in NEW_ENTRIES:
        texts = [f for f, e in EXPECTED.items() if e == entry]
        wordings = {normalise(_read(f)) for f in texts}
        assert len(texts) >= 2 and len(wordings) >= 2, entry


@pytest.mark.parametrize("fixture", SILENT)
def test_healthy_output_stays_silent(fixture: str) -> None:
    assert diagnose({fixture: _read(fixture)}) == []


# -- the normaliser ---------------------------------------------------------------------------

def test_normalise_strips_log_prefixes_and_nvrm_continuations() -> None:
    text = ("Apr 19 12:34:42 Kyrios kernel: NVRM: API mismatch: the client 'nvidia-powerd' (pid 849)\n"
            "                               NVRM: has the version 570.133.07, but this kernel\n"
            "[ 8957.099615] NVRM: module has\n"
            "[Fri Apr  5 21:29:39 2024] NVRM: Xid (PCI:0000:a1:00): 79, GPU has fallen off the bus.\n"
            "2025-01-01T10:00:00.123+0000 gpu1 kernel: x\n"
            "[rank0]:   File \"a.py\"\n"
            "> quoted\n")
    assert normalise(text).splitlines() == [
        "API mismatch: the client 'nvidia-powerd' (pid 849)",
        "has the version 570.133.07, but this kernel", "module has",
        "Xid (PCI:0000:a1:00): 79, GPU has fallen off the bus.", "x", 'File "a.py"', "quoted"]


def test_normalise_quotes_entities_escaped_newlines_and_spaces() -> None:
    assert normalise("don\u2019t \u201cx\u201d `GLIBC_2.28' &quot;a&quot;  b\u00a0c\n\n\n") == \
        "don't \"x\" 'GLIBC_2.28' \"a\" b c"
    assert normalise("but#012NVRM: this kernel module") == "but\nthis kernel module"
    assert normalise("   \n\t\n") == ""


def test_normalise_keeps_one_message_per_line_so_joined_offsets_match() -> None:
    text = normalise(_read("errors/kernel-log/api-mismatch-dmesg-vgpu-guest-index-1.txt"))
    joined = text.replace("\n", " ")
    m = re.search(r"client has the version (\S+), but this kernel module has the version (\S+)\.",
                  joined)
    assert m and m.groups() == ("570.148.08", "570.148.06")
    assert len(joined) == len(text)


@pytest.mark.parametrize("fixture,entry", [
    ("errors/kernel-log/api-mismatch-rsyslog-012-ansible-slurm-appliance-287.txt", "nvml-mismatch"),
    ("errors/kernel-log/api-mismatch-named-client-dmesg-nvidia-all-394.txt", "nvml-mismatch"),
    ("errors/fabric-manager/fm-version-mismatch-550-typographic-nvtrust-55.txt",
     "fabric-manager-version"),
    ("errors/libraries/cudnn-mismatch-rich-wrapped-kohya-ss-1096.txt", "cudnn-version-mismatch"),
    ("errors/install/conda-python-3.7-not-found-conda-12615.txt", "conda-python-not-found"),
])
def test_signatures_need_the_normaliser(fixture: str, entry: str) -> None:
    """These texts are wrapped, prefixed or typographic: the entry's own patterns miss the raw
    text and find the normalised one."""
    [e] = [e for e in load_knowledge() if e.id == entry]
    raw = _read(fixture)
    assert not any(p.search(raw) for p in e.match)
    assert [f.id for f in diagnose({"log": raw})] == [entry]


# -- what the fixes say -----------------------------------------------------------------------

def test_fallen_off_the_bus_is_one_finding_naming_the_gpu() -> None:
    [f] = diagnose({"dmesg": _read("errors/gpu-hardware/xid79-dmesg-T-akash-support-209.txt")})
    assert f.id == "gpu-fallen-off-bus" and "GPU 0000:a1:00 fell off the PCIe bus" in f.diagnosis
    assert "reboot" in f.fix  # and not also device-handle-unknown: one group
    [wrapped] = diagnose({"dmesg": _read(
        "errors/gpu-hardware/fallen-off-bus-wrapped-no-xid-nvsentinel-155.txt")})
    assert "GPU 0000:b3:00.0 fell off" in wrapped.diagnosis  # from the message's three lines


def test_ecc_wording_follows_the_xid() -> None:
    [f48] = diagnose({"s": _read("errors/gpu-hardware/xid48-dbe-syslog-gpu-operator-1146.txt")})
    [f63] = diagnose({"s": _read("errors/gpu-hardware/xid63-row-remapper-ml-engineering.txt")})
    assert "double-bit ECC error" in f48.diagnosis and "GPU 0000:07:00" in f48.diagnosis
    assert "marked for remapping (Xid 63)" in f63.diagnosis
    assert "nvidia-smi -q -d ECC,ROW_REMAPPER" in f63.fix


def test_fabric_manager_fix_names_the_exact_package() -> None:
    [f] = diagnose({"j": _read(
        "errors/fabric-manager/fm-version-mismatch-530-gpu-operator-544.txt")})
    assert "(530.30.02) is not the driver's version (530.41.03)" in f.diagnosis
    assert "`apt-get install nvidia-fabricmanager-530=530.41.03-1`" in f.fix
    [new] = diagnose({"j": _read(
        "errors/fabric-manager/fm-version-mismatch-580-wrapped-gpu-driver-container-735.txt")})
    assert "`apt-get install nvidia-fabricmanager=580.126.09-1`" in new.fix


def test_fabric_manager_not_running_uses_the_hosts_driver(cpu_host: HostFacts) -> None:
    facts = replace(cpu_host, driver="550.54.15")
    [f] = diagnose({"log": _read("errors/fabric-manager/err802-userwarning-lisa-2823.txt")}, facts)
    assert "The driver here is 550.54.15" in f.fix
    assert "nvidia-fabricmanager-550=550.54.15-1" in f.fix
    [bare] = diagnose({"log": _read("errors/fabric-manager/err802-userwarning-lisa-2823.txt")})
    assert "<branch>=<driver>-1" in bare.fix


def test_oom_names_who_holds_the_memory(cpu_host: HostFacts) -> None:
    text = _read("errors/runtime/cuda-oom-new-wording-pytorch-16417.txt")
    [alone] = diagnose({"log": text})
    assert alone.diagnosis == "The GPU ran out of memory."
    busy = replace(cpu_host, gpu_processes=(GpuProcess(4242, "python", 20480),
                                        GpuProcess(77, "jupyter", 1024)))
    found = diagnose({"log": text}, busy)
    assert [x.id for x in found] == ["cuda-oom", "gpu-busy"]
    f = found[0]
    assert "On the host now: 2 process(es) already run on it: python (pid 4242, 20480 MiB), " \
           "jupyter (pid 77, 1024 MiB)." in f.diagnosis
    [named] = diagnose({"log": _read("errors/runtime/cuda-oom-other-process-wrapped-pytorch-99699.txt")})
    assert "pid 1246069 (577.00 MiB)" in named.diagnosis


def test_missing_library_fix_depends_on_the_library() -> None:
    def fix(rel: str) -> str:
        return diagnose({"l": _read(f"errors/libraries/{rel}")})[0].fix
    assert "nvidia-cuda-runtime-cu11" in fix("libcudart-tensorflow-dlerror-dreamtalk-32.txt")
    assert "Reinstall torch with its dependencies" in fix("libcudnn8-import-torch-pytorch-104259.txt")
    assert "in its build for exactly that torch" in fix("libc10-cuda-pytorch-54827.txt")


def test_glibc_names_the_newest_torch_that_runs(cpu_host: HostFacts) -> None:
    text = _read("errors/libraries/glibc-2.27-import-torch-centos7-pytorch-150724.txt")
    [f] = diagnose({"log": text}, replace(cpu_host, glibc="2.17"))
    assert "glibc 2.27" in f.diagnosis and "this host has glibc 2.17" in f.diagnosis
    assert "the newest torch whose wheels run there is 2.6.0 (glibc 2.17)" in f.fix


def test_pip_no_match_says_which_pythons_the_release_has() -> None:
    [f] = diagnose({"l": _read("errors/install/pip-no-match-py313-cu121-index-spag4d-1.txt")})
    assert "the newest torch on the cu121 index, 2.5.1, has wheels for Python 3.9 to 3.12" \
        in f.diagnosis and "the Python in this log is 3.13" in f.diagnosis


def test_long_lines_do_not_stall_matching() -> None:
    """A pattern that backtracks over a whole line is quadratic: 100k characters of a
    library-like token took minutes before the signatures began with literal words."""
    text = "\n".join([f"Collecting pkg{i}==1.0" for i in range(2000)]
                     + ["x.so" * 25000, "A" * 100000, "lib" + "cudnn" * 20000])
    started = time.perf_counter()
    assert diagnose({"big": text}) == []
    assert time.perf_counter() - started < 10


def test_shm_errors_are_not_taken_for_a_full_disk() -> None:
    text = _read("errors/runtime/nccl-shm-posix-fallocate-nccl-342.txt")
    assert "No space left on device" in text
    assert [f.id for f in diagnose({"log": text})] == ["shm-too-small"]
