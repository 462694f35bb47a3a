"""The stand-ins answer as the real tools do on the profile's release (its captured outputs and
package data, tests/fixtures/SOURCES.md), fail as they fail, record what was asked of them and
simulate its effect, over real SSH."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness
from tests.sandbox.remote import ssh, wait_for_boot

pytestmark = pytest.mark.sandbox

HEADERS = "linux-headers-5.4.0-216-generic"  # the kernel of the profile's uname capture


def test_apt_driver_install_needs_reboot_past_nouveau(hosts: Hosts) -> None:
    info = hosts.fresh("ubuntu-20.04-nodriver", reboot_delay=1)
    try:
        rc, out = ssh(info, "nvidia-smi")
        assert rc == 127 and "command not found" in out
        assert ssh(info, "uname -r") == (0, "5.4.0-216-generic\n")
        rc, out = ssh(info, f"apt-get install -y {HEADERS} nvidia-driver-550-server")
        assert rc == 0, out
        assert "Setting up nvidia-utils-550-server (550.163.01-0ubuntu0.20.04.1) ..." in out
        rc, out = ssh(info, "nvidia-smi")
        assert rc == 9 and "couldn't communicate with the NVIDIA driver" in out
        rc, out = ssh(info, "modprobe nvidia")
        assert rc == 1 and "No such device" in out  # nouveau holds the GPU
        # lspci -k shows who holds it: nouveau, with nvidia's modules now installed
        lspci = ssh(info, "lspci -nnk")[1]
        assert "\tKernel driver in use: nouveau\n" in lspci
        assert "\tKernel modules: nvidiafb, nouveau, nvidia_drm, nvidia\n" in lspci
        assert ssh(info, "printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' > "
                         "/etc/modprobe.d/blacklist-nouveau.conf")[0] == 0
        # the blacklist reaches the early boot only through the initramfs
        ssh(info, "reboot")
        wait_for_boot(info, 1)
        assert "nouveau" in ssh(info, "lsmod")[1]
        assert ssh(info, "update-initramfs -u") == (
            0, "update-initramfs: Generating /boot/initrd.img-5.4.0-216-generic\n")
        boot_before = ssh(info, "cat /proc/sys/kernel/random/boot_id")[1]
        ssh(info, "reboot")
        wait_for_boot(info, 2)
        assert ssh(info, "cat /proc/sys/kernel/random/boot_id")[1] != boot_before
        rc, out = ssh(info, "nvidia-smi --query-gpu=driver_version,name,compute_cap --format=csv,noheader")
        assert rc == 0
        assert out.splitlines() == ["550.163.01, NVIDIA GeForce RTX 3090, 8.6"] * 2
        rc, out = ssh(info, "nvidia-smi")
        assert "Driver Version: 550.163.01" in out and "CUDA Version: 12.4" in out
        lsmod = ssh(info, "lsmod")[1]
        assert "nvidia " in lsmod and "nouveau" not in lsmod
        assert "\tKernel driver in use: nvidia\n" in ssh(info, "lspci -nnk")[1]
        assert ssh(info, "apt-mark hold nvidia-driver-550-server")[0] == 0
        assert ssh(info, "apt-mark showhold")[1].split() == ["nvidia-driver-550-server"]

        calls = [(c["tool"], c["argv"]) for c in info.calls()]
        install = ("apt-get", ["install", "-y", HEADERS, "nvidia-driver-550-server"])
        assert install in calls and ("modprobe", ["nvidia"]) in calls
        assert calls.index(install) < calls.index(("reboot", []))
    finally:
        harness.stop(info.id)


def test_lspci_shows_no_driver_where_there_is_none(hosts: Hosts) -> None:
    info = hosts.fresh("ubuntu-20.04-nodriver", nouveau=False)
    try:
        out = ssh(info, "lspci -nnk")[1]
        capture = (harness.FIXTURES / "lspci/lspci-nnk-grep-A3-nvidia-2xrtx3090.txt").read_text()
        # the capture's lines, less nvidia's "in use" and modules (nothing installed) and grep's --
        expected = [ln.replace("nvidiafb, nouveau, nvidia_drm, nvidia", "nvidiafb, nouveau")
                    for ln in capture.splitlines()
                    if ln != "--" and ln != "\tKernel driver in use: nvidia"]
        assert out.splitlines() == expected
        # without -k, lspci prints no per-device lines at all
        assert ssh(info, "lspci -nn")[1].splitlines() == [
            ln for ln in capture.splitlines() if not ln.startswith("\t") and ln != "--"]
    finally:
        harness.stop(info.id)


def test_modprobe_loads_without_reboot_when_nothing_blocks(hosts: Hosts) -> None:
    info = hosts.fresh("ubuntu-20.04-nodriver", nouveau=False)
    try:
        # nvidia-driver-530 is a transitional package on 20.04: it brings the 535 driver
        rc, out = ssh(info, f"apt-get install -y {HEADERS} nvidia-driver-530")
        assert rc == 0, out
        assert "Setting up nvidia-driver-535 (535.247.01-0ubuntu0.20.04.1) ..." in out
        assert ssh(info, "modprobe nvidia")[0] == 0
        assert info.state()["driver"]["loaded"] == "535.247.01"
    finally:
        harness.stop(info.id)


def test_dkms_builds_nothing_without_the_kernel_headers(hosts: Hosts) -> None:
    info = hosts.fresh("ubuntu-20.04-nodriver", nouveau=False)
    try:
        assert ssh(info, "apt-get install -y nvidia-driver-550-server")[0] == 0
        rc, out = ssh(info, "modprobe nvidia")
        assert (rc, out) == (1, "modprobe: FATAL: Module nvidia not found in directory "
                                "/lib/modules/5.4.0-216-generic\n")
        assert ssh(info, f"apt-get install -y {HEADERS}")[0] == 0  # dkms builds it now
        assert ssh(info, "modprobe nvidia")[0] == 0
    finally:
        harness.stop(info.id)


def test_apt_knows_the_release_and_fails_like_apt(hosts: Hosts) -> None:
    info = hosts.get("ubuntu-20.04-nodriver")
    rc, out = ssh(info, "apt-get install -y nvidia-driver-999-server nvidia-utils-550-server")
    assert (rc, out.splitlines()[-1]) == (100, "E: Unable to locate package nvidia-driver-999-server")
    # branch 580 is in jammy's archive and later, not in focal's (packages.ubuntu.com)
    rc, out = ssh(info, "apt-get install -y nvidia-driver-580-server-open")
    assert (rc, out.splitlines()[-1]) == (
        100, "E: Unable to locate package nvidia-driver-580-server-open")
    assert ssh(info, "apt-cache policy nvidia-driver-580-server-open") == (
        0, "N: Unable to locate package nvidia-driver-580-server-open\n")
    assert ssh(info, "apt-cache policy nvidia-driver-550-server")[1].splitlines()[:3] == [
        "nvidia-driver-550-server:", "  Installed: (none)",
        "  Candidate: 550.163.01-0ubuntu0.20.04.1"]
    assert ssh(info, "dpkg-query -W nvidia-utils-550-server") == (
        1, "dpkg-query: no packages found matching nvidia-utils-550-server\n")  # nothing installed
    assert ssh(info, "apt-get install -y linux-headers-6.8.0-31-generic")[0] == 100  # not 20.04's
    assert ssh(info, "apt-get frobnicate") == (100, "E: Invalid operation frobnicate\n")
    assert ssh(info, "apt-mark hold nvidia-driver-999") == (
        100, "E: Unable to locate package nvidia-driver-999\nE: No packages found\n")
    assert ssh(info, "ubuntu-drivers frobnicate")[0] == 2


def test_dpkg_query_honours_its_patterns(hosts: Hosts) -> None:
    info = hosts.fresh("ubuntu-20.04-nodriver")
    try:
        assert ssh(info, "apt-get install -y nvidia-headless-no-dkms-550-server")[0] == 0
        rc, out = ssh(info, "dpkg-query -W -f '${Package} ${Version}\\n' 'nvidia-driver-*' "
                            "'libnvidia-compute-*'")
        assert (rc, out) == (1, "libnvidia-compute-550-server 550.163.01-0ubuntu0.20.04.1\n"
                                "dpkg-query: no packages found matching nvidia-driver-*\n")
        rc, out = ssh(info, "dpkg-query -W -f '${Package}\\n' 'nvidia-*'")
        assert (rc, out.split()) == (0, ["nvidia-compute-utils-550-server",
                                         "nvidia-firmware-550-server-550.163.01",
                                         "nvidia-headless-no-dkms-550-server",
                                         "nvidia-kernel-common-550-server",
                                         "nvidia-kernel-source-550-server"])
    finally:
        harness.stop(info.id)


def test_ubuntu_drivers_replays_its_capture_and_installs_as_it_does(hosts: Hosts) -> None:
    info = hosts.fresh("ubuntu-20.04-nodriver")
    try:
        capture = (harness.FIXTURES / "misc/ubuntu-drivers-devices-2xrtx3090-550.txt").read_text()
        rc, out = ssh(info, "{ ubuntu-drivers devices 2>/dev/null; }")
        assert (rc, out) == (0, capture.split("\n", 1)[1])  # its first line is stderr
        # nothing of branch 580 for this GPU here: ubuntu-drivers says so, and exits 0
        rc, out = ssh(info, "ubuntu-drivers install --gpgpu nvidia:580-server-open")
        assert (rc, out) == (0, "No drivers found for installation.\n")
        # a listed branch: its headless no-DKMS metapackage, no kernel module package for this
        # kernel, and no nvidia-smi
        rc, out = ssh(info, "ubuntu-drivers install --gpgpu nvidia:535-server-open")
        assert rc == 0
        assert out.startswith("nvidia-headless-no-dkms-535-server-open\nNone\n")
        calls = [(c["tool"], c["argv"]) for c in info.calls()]
        assert ("apt-get", ["install", "-o", "DPkg::options::=--force-confnew",
                            "--no-install-recommends", "-y",
                            "nvidia-headless-no-dkms-535-server-open"]) in calls
        assert ssh(info, "command -v nvidia-smi")[0] == 1
        rc, out = ssh(info, "dpkg-query -W -f '${Package}\\n' 'nvidia-headless-*'")
        assert out.split() == ["nvidia-headless-no-dkms-535-server-open"]
    finally:
        harness.stop(info.id)


def test_centos7_yum_from_eol_repos_to_elrepo(hosts: Hosts, gp_home: Path) -> None:
    info = hosts.fresh("centos-7")
    try:
        # the stock repo file: mirrorlist.centos.org is gone
        rc, out = ssh(info, "yum install -y kmod-nvidia")
        assert rc == 1 and out == (harness.FIXTURES / "misc/yum-centos7-eol-mirrorlist-unreachable.txt"
                                   ).read_text()
        assert ssh(info, "sed -e 's|^mirrorlist=|#mirrorlist=|' -e 's|^#baseurl=http://mirror."
                         "centos.org/centos/\\$releasever|baseurl=https://vault.centos.org/7.9.2009|'"
                         " -i /etc/yum.repos.d/CentOS-Base.repo")[0] == 0
        # ELRepo is not configured yet
        rc, out = ssh(info, "yum install -y nvidia-detect kmod-nvidia nvidia-x11-drv")
        assert (rc, out) == (1, "No package nvidia-detect available.\nNo package kmod-nvidia "
                                "available.\nNo package nvidia-x11-drv available.\nError: Nothing to do\n")
        assert ssh(info, "yum module enable nvidia-driver:580")[1] == \
            "No such command: module. Please use /usr/bin/yum --help\n"
        assert ssh(info, "dnf --version")[0] == 127  # CentOS 7 has no dnf
        assert ssh(info, "yum install -y https://www.elrepo.org/elrepo-release-7.el7.elrepo.noarch.rpm "
                         "yum-plugin-versionlock")[0] == 0
        assert ssh(info, "yum install -y nvidia-detect kmod-nvidia nvidia-x11-drv")[0] == 0
        rc, out = ssh(info, "yum versionlock add kmod-nvidia nvidia-x11-drv")
        assert rc == 0 and "versionlock added: 2" in out
        rc, out = ssh(info, "rpm -q kmod-nvidia nvidia-x11-drv nvidia")
        assert (rc, out) == (1, "kmod-nvidia-550.144.03-1.el7_9.elrepo.x86_64\n"
                                "nvidia-x11-drv-550.144.03-1.el7_9.elrepo.x86_64\n"
                                "package nvidia is not installed\n")
        ssh(info, "reboot")
        wait_for_boot(info, 1)
        f = facts_json(info, gp_home)
        assert (f["nvidia_state"], f["driver"], f["driver_cuda"]) == ("ok", "550.144.03", "12.4")
        assert [g["name"] for g in f["gpus"]] == ["NVIDIA GeForce RTX 3090"] * 2
        assert [g["compute_cap"] for g in f["gpus"]] == ["8.6"] * 2
        assert info.state()["held"] == ["kmod-nvidia", "nvidia-x11-drv"]
        assert [c["tool"] for c in info.calls()].count("yum") == 6
    finally:
        harness.stop(info.id)


def test_dnf_on_rocky_9(hosts: Hosts) -> None:
    info = hosts.fresh("rocky-9-h100", driver=None)
    try:
        # NVIDIA's packages are not there before its repository is
        rc, out = ssh(info, "dnf install -y nvidia-open nosuchpackage")
        assert (rc, out) == (1, "No match for argument: nvidia-open\nNo match for argument: "
                                "nosuchpackage\nError: Unable to find a match: nvidia-open "
                                "nosuchpackage\n")
        assert ssh(info, "dnf frobnicate") == (
            1, "No such command: frobnicate. Please use /usr/bin/dnf --help\n"
               "It could be a DNF plugin command, try: \"dnf install 'dnf-command(frobnicate)'\"\n")
        # the CUDA repository is not there yet: its module stream neither
        assert ssh(info, "dnf module enable -y nvidia-driver:580-open") == (
            1, "Error: Problems in request:\nmissing groups or modules: nvidia-driver:580-open\n")
        assert ssh(info, "dnf install -y dnf-plugins-core")[0] == 0
        assert ssh(info, "dnf config-manager --add-repo https://developer.download.nvidia.com/"
                         "compute/cuda/repos/rhel9/x86_64/cuda-rhel9.repo")[0] == 0
        assert ssh(info, "dnf module enable -y nvidia-driver:580-open")[0] == 0
        # dkms comes from EPEL, which is not enabled: nothing provides it
        rc, out = ssh(info, "dnf install -y nvidia-open")
        assert rc == 1 and "nothing provides dkms needed by kmod-nvidia-open-dkms-3:580.126.20-1.el9" \
            ".noarch" in out
        assert ssh(info, "yum install -y epel-release")[0] == 0  # yum is dnf on EL 9
        assert ssh(info, "dnf install -y nvidia-open")[0] == 0
        rc, out = ssh(info, "rpm -qa --qf '%{NAME} %{VERSION}-%{RELEASE}\\n' 'nvidia-*' 'kmod-nvidia*'")
        assert (rc, out) == (0, "kmod-nvidia-open-dkms 580.126.20-1.el9\nnvidia-driver 580.126.20-1.el9\n"
                                "nvidia-driver-cuda 580.126.20-1.el9\nnvidia-open 580.126.20-1.el9\n")
        assert ssh(info, "dnf module enable -y nvidia-driver:590-open")[0] == 1
        # no kernel-devel for the running kernel: DKMS built nothing
        assert ssh(info, "modprobe nvidia")[0] == 1
    finally:
        harness.stop(info.id)


# a lost GPU blocks the plan (nothing installed onto a GPU that cannot run it): exit 2, as a
# blocked plan exits; a reboot or a driver install is a plan that would run: exit 0
@pytest.mark.parametrize("failure,fixture,action,finding,plan_exit", [
    ("nvml_mismatch", "nvidia-smi/fail-nvml-mismatch-550.144.txt", "reboot", "nvml-mismatch", 0),
    ("gpu_lost", "nvidia-smi/fail-gpu-lost.txt", "none", "gpu-lost", 2),
    # the profile's lspci capture is empty and nvidia-smi sees no GPU: the model is unknown, so
    # the proprietary modules (the open ones need Turing or newer)
    ("no_devices", "nvidia-smi/fail-no-devices-rtx5090.txt", "install branch 580 from Ubuntu's archive",
     "no-devices", 0),
])
def test_failure_states_reach_facts_plan_and_doctor(hosts: Hosts, gp_home: Path, failure: str,
                                                    fixture: str, action: str,
                                                    finding: str, plan_exit: int) -> None:
    info = hosts.fresh("ubuntu-22.04-rtx4090", failure=failure, failure_fixture=fixture)
    try:
        f = facts_json(info, gp_home)
        assert f["nvidia_state"] == failure
        r = gpu_provision("-H", info.inventory, "plan", "--json", home=gp_home)
        assert r.returncode == plan_exit, r.stdout + r.stderr
        plan = json.loads(r.stdout)
        assert bool(plan["blocked"]) == (plan_exit == 2)
        driver = next(d for d in plan["decisions"] if d["step"] == "driver")
        assert driver["action"] == action
        assert any(c["tool"] == "nvidia-smi" for c in info.calls())
        d = gpu_provision("-H", info.inventory, "doctor", "--json", home=gp_home)
        assert d.returncode == 1, d.stderr
        found = json.loads(d.stdout)
        assert [x["id"] for x in found] == [finding]
        assert found[0]["evidence"].startswith("nvidia-smi: ")
    finally:
        harness.stop(info.id)
