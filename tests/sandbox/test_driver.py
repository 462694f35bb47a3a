"""The driver step on sandbox hosts: install with the distro's tools, reboot only when the module
cannot load, a NEW boot id, nvidia-smi verified, packages held; containers never touched."""

from __future__ import annotations

import pytest

from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox

APT = ["-o", "DPkg::Lock::Timeout=600"]
BLACKLIST = "blacklist nouveau\noptions nouveau modeset=0\n"


def test_ubuntu_install_reboot_verify_hold(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Ubuntu 20.04 without ubuntu-drivers: the running kernel's headers (so DKMS builds the
    module) and nvidia-driver-580-server-open from the release's packages; nouveau holds the GPU,
    so the blacklist goes into the initramfs and the host reboots into the driver."""
    info = hosts.fresh("ubuntu-20.04-nodriver", ubuntu_drivers=None, reboot_delay=2)
    try:
        boot = facts_json(info, gp_home)["boot_id"]
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "rebooting (the module cannot load without it)" in r.stdout
        assert "driver 580.126.20 loaded (CUDA <= 13.0)" in r.stdout
        f = facts_json(info, gp_home)
        assert f["boot_id"] != boot and f["nvidia_state"] == "ok" and not f["nouveau_loaded"]
        assert f["driver"] == "580.126.20"
        calls = [(c["tool"], c["argv"]) for c in info.calls()]
        changes = [c for c in calls if c[0] in ("apt-get", "ubuntu-drivers", "update-initramfs",
                                                "modprobe", "reboot", "apt-mark")]
        assert changes == [
            ("apt-get", [*APT, "update", "-q"]),
            ("apt-get", [*APT, "install", "-y", "-q", "linux-headers-5.4.0-216-generic"]),
            ("apt-get", [*APT, "install", "-y", "-q", "nvidia-driver-580-server-open"]),
            ("update-initramfs", ["-u"]),
            ("modprobe", ["nvidia"]),  # nouveau holds the GPU: No such device
            ("reboot", []),
            ("apt-mark", ["hold", "libnvidia-compute-580-server", "nvidia-dkms-580-server-open",
                          "nvidia-driver-580-server-open", "nvidia-kernel-common-580-server",
                          "nvidia-kernel-source-580-server-open", "nvidia-utils-580-server"]),
        ]
        assert info.state()["held"] == ["libnvidia-compute-580-server", "nvidia-dkms-580-server-open",
                                        "nvidia-driver-580-server-open",
                                        "nvidia-kernel-common-580-server",
                                        "nvidia-kernel-source-580-server-open",
                                        "nvidia-utils-580-server"]
        assert info.state()["boots"] == 1
        assert info.path("/etc/modprobe.d/blacklist-nouveau.conf").read_text() == BLACKLIST
        # a second run finds the driver in place and does nothing
        again = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert again.returncode == 0 and "driver: nothing to do" in again.stdout
        assert info.state()["boots"] == 1
    finally:
        harness.stop(info.id)


def test_with_ubuntu_drivers_the_branch_package_is_installed_and_booted_into(  # type: ignore[no-untyped-def]
        hosts: Hosts, gp_home, tmp_path) -> None:
    info = hosts.fresh("ubuntu-20.04-nodriver", reboot_delay=1)
    try:
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        calls = [(c["tool"], c["argv"]) for c in info.calls()]
        # this host's ubuntu-drivers offers branches up to 570 only: it is not asked at all
        assert not [c for c in calls if c[0] == "ubuntu-drivers" and "install" in c[1]]
        assert ("apt-get", [*APT, "install", "-y", "-q", "nvidia-driver-580-server-open"]) in calls
        loaded = r.returncode == 0 and facts_json(info, gp_home)["nvidia_state"] == "ok"
        assert loaded and "rebooting (the module cannot load without it)" in r.stdout, \
            r.stdout + r.stderr
    finally:
        harness.stop(info.id)


def test_centos7_elrepo_without_reboot(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    info = hosts.fresh("centos-7")
    try:
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "rebooting" not in r.stdout  # nothing held the GPU: modprobe loaded it
        assert "driver 550.144.03 loaded (CUDA <= 12.4)" in r.stdout
        calls = [(c["tool"], c["argv"]) for c in info.calls()]
        changes = [c for c in calls if c[0] in ("rpm", "yum", "dracut", "modprobe", "reboot")]
        assert changes == [
            ("rpm", ["--import", "https://www.elrepo.org/RPM-GPG-KEY-elrepo.org"]),
            ("yum", ["install", "-y", "https://www.elrepo.org/elrepo-release-7.el7.elrepo.noarch.rpm",
                     "yum-plugin-versionlock"]),
            ("yum", ["install", "-y", "kmod-nvidia", "nvidia-x11-drv"]),
            ("dracut", ["-f"]),
            ("modprobe", ["nvidia"]),
            ("yum", ["versionlock", "add", "kmod-nvidia"]),
        ]
        # the repos now live on the vault (the stock mirrorlist no longer answers)
        repo = info.path("/etc/yum.repos.d/CentOS-Base.repo").read_text()
        assert "baseurl=https://vault.centos.org/7.9.2009/os/$basearch/" in repo
        assert "\nmirrorlist=" not in repo
        assert info.state()["held"] == ["kmod-nvidia"]
        assert info.state()["boots"] == 0
        f = facts_json(info, gp_home)
        assert (f["nvidia_state"], f["driver"], f["driver_cuda"]) == ("ok", "550.144.03", "12.4")
    finally:
        harness.stop(info.id)


def test_rocky_dnf_module_stream(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    info = hosts.fresh("rocky-9-h100", driver=None, lspci="lspci/lspci-nn-8xh200-sxm.txt",
                       lspci_lines=1)
    try:
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        calls = [(c["tool"], c["argv"]) for c in info.calls()]
        changes = [c for c in calls if c[0] in ("dnf", "yum", "dracut", "modprobe", "reboot")]
        assert changes == [
            ("dnf", ["install", "-y", "epel-release", "dnf-plugins-core",
                     "python3-dnf-plugin-versionlock"]),
            ("dnf", ["config-manager", "--add-repo", "https://developer.download.nvidia.com/"
                     "compute/cuda/repos/rhel9/x86_64/cuda-rhel9.repo"]),
            ("dnf", ["install", "-y", "kernel-devel-5.14.0-503.40.1.el9_5.x86_64",
                     "kernel-headers", "dkms"]),
            ("dnf", ["module", "enable", "-y", "nvidia-driver:580-open"]),
            ("dnf", ["install", "-y", "nvidia-open"]),
            ("dracut", ["-f"]),
            ("modprobe", ["nvidia"]),
            ("yum", ["versionlock", "add", "nvidia-open"]),
        ]
        assert info.state()["held"] == ["nvidia-open"]
        assert "driver 580.126.20 loaded (CUDA <= 13.0)" in r.stdout
        # DKMS built the open module for the running kernel: kernel-devel and dkms were there
        assert harness.in_host(info, "test", "-e", "/lib/modules/5.14.0-503.40.1.el9_5.x86_64/extra/"
                               "nvidia.ko.xz", check=False).returncode == 0
    finally:
        harness.stop(info.id)


def test_container_driver_is_never_touched(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    info = hosts.fresh("autodl", failure="not_loaded",
                       failure_fixture="nvidia-smi/fail-couldnt-communicate-gcp-debian11.txt")
    try:
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 1
        assert "driver belongs to the platform: never touched" in r.stdout
        tools = {c["tool"] for c in info.calls()}
        assert not tools & {"apt-get", "ubuntu-drivers", "modprobe", "reboot", "apt-mark",
                            "update-initramfs"}
    finally:
        harness.stop(info.id)
