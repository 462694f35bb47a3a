"""The driver step on sandbox hosts: install with the distro's tools, reboot only when the module
cannot load, a NEW boot id, nvidia-smi verified, packages held; containers never touched."""

from __future__ import annotations

import pytest

from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox


def test_ubuntu_install_reboot_verify_hold(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    info = hosts.fresh("ubuntu-20.04-nodriver")
    try:
        boot = facts_json(info, gp_home)["boot_id"]
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path,
                          env={"GPU_SANDBOX_REBOOT_DELAY": "2"})
        assert r.returncode == 0, r.stdout + r.stderr
        assert "rebooting (the module cannot load without it)" in r.stdout
        assert "driver 580.82.09 loaded (CUDA <= 13.0)" in r.stdout
        f = facts_json(info, gp_home)
        assert f["boot_id"] != boot and f["nvidia_state"] == "ok" and not f["nouveau_loaded"]
        calls = [(c["tool"], c["argv"]) for c in info.calls()]
        assert ("ubuntu-drivers", ["install", "--gpgpu", "nvidia:580-server-open"]) in calls
        assert ("reboot", []) in calls
        assert info.state()["held"] == ["nvidia-driver-580-server-open"]
        assert info.state()["boots"] == 1
        blacklist = info.path("/etc/modprobe.d/blacklist-nouveau.conf").read_text()
        assert "blacklist nouveau" in blacklist
        # a second run finds the driver in place and does nothing
        again = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert again.returncode == 0 and "driver: nothing to do" in again.stdout
        assert info.state()["boots"] == 1
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
        assert ("yum", ["install", "-y", "kmod-nvidia", "nvidia-x11-drv"]) in calls
        assert info.state()["held"] == ["kmod-nvidia"]
        assert info.state()["boots"] == 0
    finally:
        harness.stop(info.id)


def test_rocky_dnf_module_stream(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    info = hosts.fresh("rocky-9-h100", driver=None, lspci="lspci/lspci-nn-8xh200-sxm.txt",
                       lspci_lines=1)
    try:
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        calls = [(c["tool"], c["argv"]) for c in info.calls()]
        assert ("dnf", ["module", "enable", "-y", "nvidia-driver:580-open"]) in calls
        assert ("dnf", ["install", "-y", "nvidia-open"]) in calls
        assert info.state()["held"] == ["nvidia-open"]
        assert "driver 580.82.09 loaded" in r.stdout
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
        assert not tools & {"apt-get", "ubuntu-drivers", "modprobe", "reboot"}
    finally:
        harness.stop(info.id)
