"""Every parser on the captured real outputs in tests/fixtures (see tests/fixtures/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.facts.cuda import parse_nvcc
from provision.facts.nvidia import (
    QUERY_FIELDS,
    nvml_library_version,
    parse_driver_version,
    parse_failure,
    parse_header,
    parse_list,
    parse_q,
    parse_q_xml,
    parse_query_gpu,
    parse_table,
)
from provision.facts.osinfo import parse_os_release
from provision.facts.pci import parse_lspci

FIX = Path(__file__).resolve().parent.parent / "fixtures"


def text(path: str) -> str:
    return (FIX / path).read_text(encoding="utf-8", errors="replace")


OS_RELEASE = [
    ("alibaba-cloud-linux-3-soaring-falcon.txt", "alinux", "3", "yum"),
    ("alibaba-cloud-linux-3-update-9.1.txt", "alinux", "3", "yum"),
    ("alibaba-cloud-linux-3.2104-u10-openanolis.txt", "alinux", "3", "yum"),
    ("almalinux-10.0.txt", "almalinux", "10.0", "yum"),
    ("almalinux-8.10.txt", "almalinux", "8.10", "yum"),
    ("almalinux-9.4.txt", "almalinux", "9.4", "yum"),
    ("almalinux-9.6.txt", "almalinux", "9.6", "yum"),
    ("amazon-linux-2.txt", "amzn", "2", "yum"),
    ("amazon-linux-2023.txt", "amzn", "2023", "yum"),
    ("centos-7.1-etc-centos-release.txt", "centos", "7.1.1503", "yum"),
    ("centos-7.txt", "centos", "7", "yum"),
    ("centos-stream-9.txt", "centos", "9", "yum"),
    ("debian-10.txt", "debian", "10", "apt"),
    ("debian-11.txt", "debian", "11", "apt"),
    ("debian-12.txt", "debian", "12", "apt"),
    ("debian-13.txt", "debian", "13", "apt"),
    ("openeuler-24.03.txt", "openeuler", "24.03", "yum"),
    ("oracle-linux-7.5.txt", "ol", "7.5", "yum"),
    ("rhel-7.0.txt", "rhel", "7.0", "yum"),
    ("rhel-9.6.txt", "rhel", "9.6", "yum"),
    ("rocky-8.10.txt", "rocky", "8.10", "yum"),
    ("rocky-8.4.txt", "rocky", "8.4", "yum"),
    ("rocky-9.3.txt", "rocky", "9.3", "yum"),
    ("rocky-9.5.txt", "rocky", "9.5", "yum"),
    ("tencentos-4.2.txt", "tencentos", "4.2", "yum"),
    ("ubuntu-18.04.txt", "ubuntu", "18.04", "apt"),
    ("ubuntu-20.04.1-rented-vm.txt", "ubuntu", "20.04", "apt"),
    ("ubuntu-20.04.txt", "ubuntu", "20.04", "apt"),
    ("ubuntu-22.04.txt", "ubuntu", "22.04", "apt"),
    ("ubuntu-24.04.3.txt", "ubuntu", "24.04", "apt"),
    ("ubuntu-24.04.txt", "ubuntu", "24.04", "apt"),
]


def test_every_os_release_fixture_is_covered() -> None:
    assert {r[0] for r in OS_RELEASE} == {p.name for p in (FIX / "os-release").iterdir()}


@pytest.mark.parametrize("name,os_id,version,family", OS_RELEASE, ids=[r[0] for r in OS_RELEASE])
def test_os_release(name: str, os_id: str, version: str, family: str) -> None:
    osr = parse_os_release(text(f"os-release/{name}"))
    assert (osr.id, osr.version_id, osr.family) == (os_id, version, family)
    assert osr.pretty_name


# fixture, driver, max CUDA, GPU count, first GPU name (as printed, tables truncate), MiB
SMI_OUTPUTS = [
    ("q-2xh100-nvl-550.54.14.txt", "550.54.14", "12.4", 2, "NVIDIA H100 NVL", 95830),
    ("q-2xrtx3090-560.35.03.txt", "560.35.03", "12.6", 2, "NVIDIA GeForce RTX 3090", 24576),
    ("q-4xa100-sxm4-80gb-555.42.02.txt", "555.42.02", "12.5", 4, "NVIDIA A100-SXM4-80GB", 81920),
    ("q-8xh100-80gb-hbm3-565.57.01.txt", "565.57.01", "12.7", 8, "NVIDIA H100 80GB HBM3", 81559),
    ("q-8xrtx4090-550.127.05.txt", "550.127.05", "12.4", 8, "NVIDIA GeForce RTX 4090", 24564),
    ("q-h100-80gb-hbm3-590.48.01.txt", "590.48.01", "13.1", 1, "NVIDIA H100 80GB HBM3", 81559),
    ("q-h100-mig-590.48.01.txt", "590.48.01", "13.1", 1, "NVIDIA H100 80GB HBM3", 81559),
    ("q-h200-590.48.01.txt", "590.48.01", "13.1", 1, "NVIDIA H200", 143771),
    ("q-h200-mig-590.48.01.txt", "590.48.01", "13.1", 1, "NVIDIA H200", 143771),
    ("q-i0-h800-of-8-525.105.17.txt", "525.105.17", "12.0", 1, "NVIDIA H800", 81559),
    ("q-l4-550.90.07.txt", "550.90.07", "12.4", 1, "NVIDIA L4", 23034),
    ("q-l40s-595.80.txt", "595.80", "13.2", 1, "NVIDIA L40S", 46068),
    ("q-rtx2080super-595.71.05.txt", "595.71.05", "13.2", 1, "NVIDIA GeForce RTX 2080 SUPER", 8192),
    ("q-rtx2080super-610.57.04.txt", "610.57.04", "13.3", 1, "NVIDIA GeForce RTX 2080 SUPER", 8192),
    ("q-rtx4080super-595.71.05.txt", "595.71.05", "13.2", 1, "NVIDIA GeForce RTX 4080 SUPER", 16376),
    ("q-x-4xa100-sxm4-80gb-535.54.03.xml", "535.54.03", "12.2", 1, "NVIDIA A100-SXM4-80GB", 81920),
    ("q-x-a10g-515.105.01.xml", "515.105.01", "11.7", 1, "NVIDIA A10G", 23028),
    ("q-x-quadro-p2000-525.125.06.xml", "525.125.06", "12.0", 1, "Quadro P2000", 5120),
    ("q-x-rtx3060-570.124.04.xml", "570.124.04", "12.8", 1, "NVIDIA GeForce RTX 3060", 12288),
    ("q-x-rtx3090-525.147.05.xml", "525.147.05", "12.0", 1, "NVIDIA GeForce RTX 3090", 24576),
    ("q-x-tesla-t4-515.105.01.xml", "515.105.01", "11.7", 1, "Tesla T4", 15360),
    ("table-10xa40-550.127.05.txt", "550.127.05", "12.4", 10, "NVIDIA A40", 46068),
    ("table-2xh100-nvl-550.54.14.txt", "550.54.14", "12.4", 2, "NVIDIA H100 NVL", 95830),
    ("table-2xrtx3090-560.35.03.txt", "560.35.03", "12.6", 2, "NVIDIA GeForce RTX 3090", 24576),
    ("table-2xrtx4060ti-550.54.14.txt", "550.54.14", "12.4", 2, "NVIDIA GeForce RTX 4060 Ti", 16380),
    ("table-2xtesla-t4-450.51.05.txt", "450.51.05", "11.0", 2, "Tesla T4", 15109),
    ("table-4xa10-535.183.01.txt", "535.183.01", "12.2", 4, "NVIDIA A10", 23028),
    ("table-4xa100-sxm4-40gb-470.161.03-docker.txt", "470.161.03", "11.4", 4, "NVIDIA A100-SXM...", 40536),
    ("table-4xa100-sxm4-80gb-555.42.02.txt", "555.42.02", "12.5", 4, "NVIDIA A100-SXM4-80GB", 81920),
    ("table-8xh100-80gb-hbm3-565.57.01.txt", "565.57.01", "12.7", 8, "NVIDIA H100 80GB HBM3", 81559),
    ("table-8xh800-525.105.17-training.txt", "525.105.17", "12.0", 8, "NVIDIA H800", 81559),
    ("table-8xrtx4090-550.127.05.txt", "550.127.05", "12.4", 8, "NVIDIA GeForce RTX 4090", 24564),
    ("table-8xrtx6000ada-550.127.05.txt", "550.127.05", "12.4", 8, "NVIDIA RTX 6000 Ada Gene...", 49140),
    ("table-a10g-535.183.01-docker.txt", "535.183.01", "12.2", 1, "NVIDIA A10G", 23028),
    ("table-gtx960-580.82.09.txt", "580.82.09", "13.0", 1, "NVIDIA GeForce GTX 960", 2048),
    ("table-h100-80gb-hbm3-590.48.01.txt", "590.48.01", "13.1", 1, "NVIDIA H100 80GB HBM3", 81559),
    ("table-h100-mig-590.48.01.txt", "590.48.01", "13.1", 1, "NVIDIA H100 80GB HBM3", 81559),
    ("table-h200-590.48.01.txt", "590.48.01", "13.1", 1, "NVIDIA H200", 143771),
    ("table-h200-mig-590.48.01.txt", "590.48.01", "13.1", 1, "NVIDIA H200", 143771),
    ("table-i7-h800-525.105.17-single-process.txt", "525.105.17", "12.0", 1, "NVIDIA H800", 81559),
    ("table-l4-550.90.07.txt", "550.90.07", "12.4", 1, "NVIDIA L4", 23034),
    ("table-l40s-550.127.05.txt", "550.127.05", "12.4", 1, "NVIDIA L40S", 46068),
    ("table-l40s-595.80.txt", "595.80", "13.2", 1, "NVIDIA L40S", 46068),
    ("table-laptop-geforce-16gb-470.63.01.txt", "470.63.01", "11.4", 1, "NVIDIA GeForce ...", 16116),
    ("table-rtx2000ada-550.54.15.txt", "550.54.15", "12.4", 1, "NVIDIA RTX 2000 Ada Gene...", 16380),
    ("table-rtx2070-laptop-440.100.txt", "440.100", "10.2", 1, "GeForce RTX 207...", 7973),
    ("table-rtx2070-laptop-460.39.txt", "460.39", "11.2", 1, "GeForce RTX 2070", 7973),
    ("table-rtx2080super-595.71.05.txt", "595.71.05", "13.2", 1, "NVIDIA GeForce RTX 2080 ...", 8192),
    ("table-rtx2080super-610.57.04-kmd-umd-header.txt", "610.57.04", "13.3", 1, "NVIDIA GeForce RTX 2080 ...", 8192),
    ("table-rtx3070-laptop-530.41.03.txt", "530.41.03", "12.1", 1, "NVIDIA GeForce RTX 3070 L...", 8192),
    ("table-rtx3070-wsl-530.47-531.68.txt", "531.68", "12.1", 1, "NVIDIA GeForce RTX 3070", 8192),
    ("table-rtx3090-vm-575.57.08.txt", "575.57.08", "12.9", 1, "NVIDIA GeForce RTX 3090", 24576),
    ("table-rtx4000ada-550.90.07.txt", "550.90.07", "12.4", 1, "NVIDIA RTX 4000 Ada Gene...", 20475),
    ("table-rtx4070-550.40.07.txt", "550.40.07", "12.4", 1, "NVIDIA GeForce RTX 4070", 12282),
    ("table-rtx4080super-595.71.05.txt", "595.71.05", "13.2", 1, "NVIDIA GeForce RTX 4080 ...", 16376),
    ("table-rtx4090-580.65.06.txt", "580.65.06", "13.0", 1, "NVIDIA GeForce RTX 4090", 24564),
    ("table-rtx5090-570.195.03.txt", "570.195.03", "12.8", 1, "NVIDIA GeForce RTX 5090", 32607),
    ("table-rtx6000ada-do-droplet-575.57.08-vllm.txt", "575.57.08", "12.9", 1, "NVIDIA RTX 6000 Ada Gene...", 49140),
    ("table-tesla-t4-470.57.02-eks-pod.txt", "470.57.02", "11.4", 1, "Tesla T4", 15109),
    ("table-titanv-515.65.01.txt", "515.65.01", "11.7", 1, "NVIDIA TITAN V", 12288),
    ("table-titanxp-450.57.txt", "450.57", "11.0", 1, "TITAN Xp", 12196),
    ("table-v100-sxm2-32gb-525.105.17.txt", "525.105.17", "12.0", 1, "Tesla V100-SXM2...", 32768),
]


def test_every_table_and_q_fixture_is_covered() -> None:
    names = {p.name for p in (FIX / "nvidia-smi").iterdir() if p.name.startswith(("table-", "q-"))}
    assert {r[0] for r in SMI_OUTPUTS} == names


@pytest.mark.parametrize("name,driver,cuda,count,first,mib", SMI_OUTPUTS,
                         ids=[r[0] for r in SMI_OUTPUTS])
def test_smi_outputs(name: str, driver: str, cuda: str, count: int, first: str, mib: int) -> None:
    parse = parse_q_xml if name.startswith("q-x-") else parse_q if name.startswith("q-") \
        else parse_table
    header, gpus = parse(text(f"nvidia-smi/{name}"))
    assert (header.driver, header.cuda) == (driver, cuda)
    assert len(gpus) == count
    assert (gpus[0].name, gpus[0].memory_total_mib) == (first, mib)


def test_610_header_uses_kmd_and_umd_names() -> None:
    # 610+ keeps the deprecated names in -q with a suffix; the new ones are read.
    h = parse_header(text("nvidia-smi/q-rtx2080super-610.57.04.txt"))
    assert (h.driver, h.cuda) == ("610.57.04", "13.3")
    h = parse_header(text("nvidia-smi/table-rtx2080super-610.57.04-kmd-umd-header.txt"))
    assert (h.driver, h.cuda) == ("610.57.04", "13.3")


@pytest.mark.parametrize("name,driver,cuda", [
    ("version-h100-80gb-hbm3-590.48.01.txt", "590.48.01", "13.1"),
    ("version-h100-mig-590.48.01.txt", "590.48.01", "13.1"),
    ("version-h200-590.48.01.txt", "590.48.01", "13.1"),
    ("version-h200-mig-590.48.01.txt", "590.48.01", "13.1"),
    ("version-l40s-595.80.txt", "595.80", "13.2"),
    ("version-rtx2080super-595.71.05.txt", "595.71.05", "13.2"),
    ("version-rtx2080super-610.57.04.txt", "610.57.04", "13.3"),
    ("version-rtx4080super-595.71.05.txt", "595.71.05", "13.2"),
])
def test_smi_version(name: str, driver: str, cuda: str) -> None:
    h = parse_header(text(f"nvidia-smi/{name}"))
    assert (h.driver, h.cuda) == (driver, cuda)


QUERY = [
    # fixture, fields when the capture has no header, count, (name, driver, total, used, cc, util)
    ("query-gpu-compute-cap-ada-525.89.02.csv", None, 1,
     ("unknown GPU", None, None, None, "8.9", None)),
    ("query-gpu-compute-cap-noheader-4x-sm86.csv", ("compute_cap",), 4,
     ("unknown GPU", None, None, None, "8.6", None)),
    ("query-gpu-computecap-mode-driver-name-index-titanv-rtx5880ada-570.86.15.csv", None, 2,
     ("NVIDIA TITAN V", "570.86.15", None, None, "7.0", None)),
    ("query-gpu-full-h100-80gb-hbm3-590.48.01.csv", None, 1,
     ("NVIDIA H100 80GB HBM3", "590.48.01", 81559, 0, "9.0", 0)),
    ("query-gpu-full-h100-mig-590.48.01.csv", None, 1,
     ("NVIDIA H100 80GB HBM3", "590.48.01", 81559, 59, "9.0", None)),
    ("query-gpu-full-h200-590.48.01.csv", None, 1,
     ("NVIDIA H200", "590.48.01", 143771, 0, "9.0", 0)),
    ("query-gpu-full-h200-mig-590.48.01.csv", None, 1,
     ("NVIDIA H200", "590.48.01", 143771, 55, "9.0", None)),
    ("query-gpu-full-l40s-595.80.csv", None, 1,
     ("NVIDIA L40S", "595.80", 46068, 0, "8.9", 100)),
    ("query-gpu-full-rtx2080super-595.71.05.csv", None, 1,
     ("NVIDIA GeForce RTX 2080 SUPER", "595.71.05", 8192, 214, "7.5", 0)),
    ("query-gpu-full-rtx4080super-595.71.05.csv", None, 1,
     ("NVIDIA GeForce RTX 4080 SUPER", "595.71.05", 16376, 596, "8.9", 0)),
    ("query-gpu-name-deviceid-noheader-h100nvl.csv", ("name", "pci.device_id"), 1,
     ("NVIDIA H100 NVL", None, None, None, None, None)),
    ("query-gpu-name-memtotal-deviceid-noheader-v100-pg500.csv",
     ("name", "memory.total", "pci.device_id"), 1,
     ("Tesla PG500-216", None, 32768, None, None, None)),
    ("query-gpu-name-cc-driver-memtotal-gtx960-570.195.03.csv", None, 1,
     ("NVIDIA GeForce GTX 960", "570.195.03", 4096, None, "5.2", None)),
    ("query-gpu-name-cc-driver-memtotal-noheader-rtx3090-580.126.09.csv",
     ("name", "compute_cap", "driver_version", "memory.total"), 1,
     ("NVIDIA GeForce RTX 3090", "580.126.09", 24576, None, "8.6", None)),
    ("query-gpu-name-cc-memfree-memused-memtotal-pstate-noheader-rtx4090.csv",
     ("name", "compute_cap", "memory.free", "memory.used", "memory.total", "pstate"), 1,
     ("NVIDIA GeForce RTX 4090", None, 24564, 1338, "8.9", None)),
    ("query-gpu-noheader-4xrtx3090-580.126.20.csv",
     ("index", "name", "driver_version", "memory.total"), 4,
     ("NVIDIA GeForce RTX 3090", "580.126.20", 24576, None, None, None)),
    ("query-gpu-index-uuid-memused-memtotal-util-8xh200-after.csv", None, 8,
     ("unknown GPU", None, 143771, 130013, None, 100)),
]


def test_every_query_fixture_is_covered() -> None:
    names = {p.name for p in (FIX / "nvidia-smi").iterdir() if p.name.startswith("query-gpu")}
    assert {r[0] for r in QUERY} == names


@pytest.mark.parametrize("name,fields,count,first", QUERY, ids=[r[0] for r in QUERY])
def test_query_gpu(name: str, fields: tuple[str, ...] | None, count: int,
                   first: tuple[object, ...]) -> None:
    gpus = parse_query_gpu(text(f"nvidia-smi/{name}"), fields)
    assert len(gpus) == count
    g = gpus[0]
    assert (g.name, g.driver, g.memory_total_mib, g.memory_used_mib, g.compute_cap,
            g.utilization_pct) == first
    assert [x.index for x in gpus] == list(range(count))


def test_na_and_deprecated_cells_are_none() -> None:
    g = parse_query_gpu(text("nvidia-smi/query-gpu-full-h100-mig-590.48.01.csv"))[0]
    assert g.utilization_pct is None  # "[N/A]" under MIG
    assert "compute_cap" in QUERY_FIELDS


# fixture, exit code nvidia-smi gave (NVML return codes; 127 from the shell), named state
FAILURES = [
    ("fail-command-not-found-ubuntu20.04-es.txt", 127, "no_driver"),
    ("fail-couldnt-communicate-docker-mattshma-108.txt", 9, "not_loaded"),
    ("fail-couldnt-communicate-gcp-debian11.txt", 9, "not_loaded"),
    ("fail-device-handle-unknown-error-a-i0.txt", 255, "unknown_error"),
    ("fail-device-handle-unknown-error-tesla-p4.txt", 255, "unknown_error"),
    ("fail-gpu-lost.txt", 15, "gpu_lost"),
    ("fail-no-devices-rtx5090.txt", 6, "no_devices"),
    ("fail-nvml-mismatch-535.154-vs-550.78-gtx1070.txt", 18, "nvml_mismatch"),
    ("fail-nvml-mismatch-550.144.txt", 18, "nvml_mismatch"),
    ("fail-nvml-mismatch-570.124.txt", 18, "nvml_mismatch"),
    ("fail-nvml-mismatch-580.178-truenas.txt", 18, "nvml_mismatch"),
    ("fail-nvml-mismatch-legacy.txt", 18, "nvml_mismatch"),
    ("fail-query-compute-cap-invalid-field.txt", 2, "unknown_error"),
]


def test_every_failure_fixture_is_covered() -> None:
    names = {p.name for p in (FIX / "nvidia-smi").iterdir() if p.name.startswith("fail-")}
    assert {r[0] for r in FAILURES} == names


@pytest.mark.parametrize("name,rc,state", FAILURES, ids=[r[0] for r in FAILURES])
def test_failures(name: str, rc: int, state: str) -> None:
    assert parse_failure(text(f"nvidia-smi/{name}"), rc) == state


def test_success_is_no_failure() -> None:
    assert parse_failure(text("nvidia-smi/table-h200-590.48.01.txt"), 0) is None


def test_nvml_mismatch_names_the_library() -> None:
    assert nvml_library_version(text("nvidia-smi/fail-nvml-mismatch-550.144.txt")) == "550.144"
    assert nvml_library_version(text("nvidia-smi/fail-nvml-mismatch-legacy.txt")) is None


@pytest.mark.parametrize("name,count,first,mig", [
    ("list-L-2xquadro-rtx4000-535.129.03.txt", 2, "Quadro RTX 4000", 0),
    ("list-L-h100-80gb-hbm3-590.48.01.txt", 1, "NVIDIA H100 80GB HBM3", 0),
    ("list-L-h100-mig-590.48.01.txt", 1, "NVIDIA H100 80GB HBM3", 4),
    ("list-L-h200-590.48.01.txt", 1, "NVIDIA H200", 0),
    ("list-L-h200-mig-590.48.01.txt", 1, "NVIDIA H200", 5),
    ("list-L-l40s-595.80.txt", 1, "NVIDIA L40S", 0),
    ("list-L-rtx2080super-595.71.05.txt", 1, "NVIDIA GeForce RTX 2080 SUPER", 0),
    ("list-L-rtx4080super-595.71.05.txt", 1, "NVIDIA GeForce RTX 4080 SUPER", 0),
    ("list-L-titanv-rtx5880ada-570.86.15.txt", 2, "NVIDIA TITAN V", 0),
])
def test_list(name: str, count: int, first: str, mig: int) -> None:
    gpus = parse_list(text(f"nvidia-smi/{name}"))
    assert (len(gpus), gpus[0].name, gpus[0].mig_devices) == (count, first, mig)


NVCC = [
    ("nvcc-10.1.txt", "10.1.243"),
    ("nvcc-10.2.txt", "10.2.89"),
    ("nvcc-11.0.194.txt", "11.0.194"),
    ("nvcc-11.0.221.txt", "11.0.221"),
    ("nvcc-11.1.105.txt", "11.1.105"),
    ("nvcc-11.3.109.txt", "11.3.109"),
    ("nvcc-11.5.119.txt", "11.5.119"),
    ("nvcc-11.7.64.txt", "11.7.64"),
    ("nvcc-11.8.89.txt", "11.8.89"),
    ("nvcc-12.1.105.txt", "12.1.105"),
    ("nvcc-12.4.99.txt", "12.4.99"),
    ("nvcc-12.5.40.txt", "12.5.40"),
    ("nvcc-12.5.82.txt", "12.5.82"),
    ("nvcc-12.6.68-jetson-orin-nano.txt", "12.6.68"),
    ("nvcc-12.6.85.txt", "12.6.85"),
    ("nvcc-12.8.93-conda-wsl.txt", "12.8.93"),
    ("nvcc-13.0.48.txt", "13.0.48"),
    ("nvcc-13.0.88.txt", "13.0.88"),
]


@pytest.mark.parametrize("name,version", NVCC, ids=[r[0] for r in NVCC])
def test_nvcc(name: str, version: str) -> None:
    assert parse_nvcc(text(f"nvcc/{name}")) == version


def test_nvcc_missing_is_none() -> None:
    assert parse_nvcc("bash: line 1: nvcc: command not found") is None


@pytest.mark.parametrize("name,version,is_open", [
    ("proc-driver-nvidia-version-384.98-ubuntu17.10.txt", "384.98", False),
    ("proc-driver-nvidia-version-525.60.11-open-arch.txt", "525.60.11", True),
    ("proc-driver-nvidia-version-535.146.02-ubuntu20.04.txt", "535.146.02", False),
    ("proc-driver-nvidia-version-550.78-runfile-ubuntu24.04.txt", "550.78", False),
    ("proc-driver-nvidia-version-565.57.01-open-ubuntu24.04.txt", "565.57.01", True),
    ("proc-driver-nvidia-version-580.173.02-truenas.txt", "580.173.02", False),
    ("proc-driver-nvidia-version-jetson-orin-nx-35.3.1.txt", "35.3.1", True),
    ("sys-module-nvidia-version-535.146.02.txt", "535.146.02", False),
    ("sys-module-nvidia-version-550.78.txt", "550.78", False),
])
def test_driver_version_files(name: str, version: str, is_open: bool) -> None:
    module = parse_driver_version(text(f"misc/{name}"))
    assert module is not None and (module.version, module.open) == (version, is_open)


def test_modinfo_not_found_is_no_module() -> None:
    assert parse_driver_version(text("misc/modinfo-F-version-nvidia-not-found.txt")) is None


LSPCI = [
    ("lspci-d-03xx-rtx3080ti.txt", ["GA102 [GeForce RTX 3080 Ti]"], [None]),
    ("lspci-grep-3d-gt750m-optimus.txt", ["GK107M [GeForce GT 750M]"], [None]),
    ("lspci-grep-microsoft-wsl2-gpu.txt", [], []),
    ("lspci-grep-nvidia-gtx1070.txt", ["GP104 [GeForce GTX 1070]"], [None]),
    ("lspci-grep-nvidia-gtx960-nvs310.txt", ["GF119 [NVS 310]", "GM206 [GeForce GTX 960]"],
     [None, None]),
    ("lspci-grep-vga-3d-mx250-laptop.txt", ["GP108M [GeForce MX250]"], [None]),
    ("lspci-nn-8xh200-sxm.txt", ["GH100 [H200 SXM 141GB]"] * 8, ["2335"] * 8),
    ("lspci-nn-grep-vga-3d-mx130-gtx970-egpu.txt",
     ["GM108M [GeForce MX130]", "GM204 [GeForce GTX 970]"], ["174d", "13c2"]),
    ("lspci-nnk-grep-A3-nvidia-2xrtx3090.txt", ["GA102 [GeForce RTX 3090]"] * 2, ["2204"] * 2),
    # NVSwitch boards: the switches (class 0680) are no GPUs (tests/unit/test_fabric.py)
    ("lspci-Dnn-egrep-nvidia-vga-8xh100-sxm5-4xnvswitch.txt", ["GH100 [H100 SXM5 80GB]"] * 8,
     ["2330"] * 8),
    ("lspci-nn-grep-nvidia-8xa100-sxm4-80gb-6xnvswitch.txt", ["GA100 [A100 SXM4 80GB]"] * 8,
     ["20b2"] * 8),
    ("lspci-nn-vm-1xa10-no-nvswitch.txt", ["GA102GL [A10]"], ["2236"]),
    ("lspci-PP-nn-hgx-b200-cx7-bridge.txt", ["Device"] * 8, ["2901"] * 8),
    ("lspci-nn-grep-nvidia-k80.txt", ["GK210GL [Tesla K80]"], ["102d"]),
]


def test_every_lspci_fixture_is_covered() -> None:
    assert {r[0] for r in LSPCI} == {p.name for p in (FIX / "lspci").iterdir()}


@pytest.mark.parametrize("name,names,ids", LSPCI, ids=[r[0] for r in LSPCI])
def test_lspci(name: str, names: list[str], ids: list[str | None]) -> None:
    gpus = parse_lspci(text(f"lspci/{name}"))
    assert [g.name for g in gpus] == names  # audio functions and other vendors dropped
    assert [g.device_id for g in gpus] == ids
