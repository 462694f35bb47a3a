"""The stand-ins record what was asked of them and simulate its effect, over real SSH."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness
from tests.sandbox.remote import ssh, wait_for_boot

pytestmark = pytest.mark.sandbox


def test_apt_driver_install_needs_reboot_past_nouveau(hosts: Hosts) -> None:
    info = hosts.fresh("ubuntu-20.04-nodriver")
    try:
        rc, out = ssh(info, "nvidia-smi")
        assert rc == 127 and "command not found" in out
        assert ssh(info, "apt-get install -y nvidia-driver-580-server-open")[0] == 0
        rc, out = ssh(info, "nvidia-smi")
        assert rc == 9 and "couldn't communicate with the NVIDIA driver" in out
        rc, out = ssh(info, "modprobe nvidia")
        assert rc == 1 and "No such device" in out  # nouveau holds the GPU
        assert ssh(info, "printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' > "
                         "/etc/modprobe.d/blacklist-nouveau.conf")[0] == 0
        boot_before = ssh(info, "cat /proc/sys/kernel/random/boot_id")[1]
        ssh(info, "reboot")
        wait_for_boot(info, 1)
        assert ssh(info, "cat /proc/sys/kernel/random/boot_id")[1] != boot_before
        rc, out = ssh(info, "nvidia-smi --query-gpu=driver_version,name --format=csv,noheader")
        assert rc == 0
        assert out.splitlines() == ["580.82.09, NVIDIA GeForce RTX 3090"] * 2
        rc, out = ssh(info, "nvidia-smi")
        assert "Driver Version: 580.82.09" in out and "CUDA Version: 13.0" in out
        lsmod = ssh(info, "lsmod")[1]
        assert "nvidia " in lsmod and "nouveau" not in lsmod
        assert ssh(info, "apt-mark hold nvidia-driver-580-server-open")[0] == 0
        assert ssh(info, "apt-mark showhold")[1].split() == ["nvidia-driver-580-server-open"]

        calls = [(c["tool"], c["argv"]) for c in info.calls()]
        assert ("apt-get", ["install", "-y", "nvidia-driver-580-server-open"]) in calls
        assert ("modprobe", ["nvidia"]) in calls
        assert ("reboot", []) in calls
        assert calls.index(("apt-get", ["install", "-y", "nvidia-driver-580-server-open"])) < \
            calls.index(("reboot", []))
    finally:
        harness.stop(info.id)


def test_modprobe_loads_without_reboot_when_nothing_blocks(hosts: Hosts) -> None:
    info = hosts.fresh("cpu-only", lspci="lspci/lspci-d-03xx-rtx3080ti.txt")
    try:
        assert ssh(info, "apt-get install -y nvidia-driver-570")[0] == 0
        assert ssh(info, "modprobe nvidia")[0] == 0
        # no captured nvidia-smi for this GPU: the driver answers, the tool says so plainly
        assert info.state()["driver"]["loaded"] == "570.195.03"
    finally:
        harness.stop(info.id)


def test_centos7_elrepo_kmod(hosts: Hosts, gp_home: Path) -> None:
    info = hosts.fresh("centos-7")
    try:
        assert ssh(info, "yum install -y nvidia-detect kmod-nvidia nvidia-x11-drv")[0] == 0
        assert ssh(info, "yum versionlock add kmod-nvidia nvidia-x11-drv")[0] == 0
        rc, out = ssh(info, "rpm -q kmod-nvidia")
        assert rc == 0 and "kmod-nvidia-550.144.03" in out
        ssh(info, "reboot")
        wait_for_boot(info, 1)
        f = facts_json(info, gp_home)
        assert (f["nvidia_state"], f["driver"], f["driver_cuda"]) == ("ok", "550.144.03", "12.4")
        assert [g["name"] for g in f["gpus"]] == ["NVIDIA GeForce RTX 3090"] * 2
        assert info.state()["held"] == ["kmod-nvidia", "nvidia-x11-drv"]
        assert [c["tool"] for c in info.calls()].count("yum") == 2
    finally:
        harness.stop(info.id)


@pytest.mark.parametrize("failure,fixture,action,finding", [
    ("nvml_mismatch", "nvidia-smi/fail-nvml-mismatch-550.144.txt", "reboot", "nvml-mismatch"),
    ("gpu_lost", "nvidia-smi/fail-gpu-lost.txt", "none", "gpu-lost"),
    ("no_devices", "nvidia-smi/fail-no-devices-rtx5090.txt",
     "install branch 580 (open modules) with apt", "no-devices"),
])
def test_failure_states_reach_facts_plan_and_doctor(hosts: Hosts, gp_home: Path, failure: str,
                                                    fixture: str, action: str,
                                                    finding: str) -> None:
    info = hosts.fresh("ubuntu-22.04-rtx4090", failure=failure, failure_fixture=fixture)
    try:
        f = facts_json(info, gp_home)
        assert f["nvidia_state"] == failure
        r = gpu_provision("-H", info.inventory, "plan", "--json", home=gp_home)
        plan = json.loads(r.stdout)
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
