"""An HGX H100 VM with its NVSwitches on the PCI bus and the driver loaded but no fabric
manager: facts, plan and doctor say so; the driver task installs nvidia-fabricmanager of
exactly the driver's version from the repository, holds and starts it; a stopped one is started
and one of another version replaced. The fabric manager's tools are stand-ins replaying
captured outputs (tests/sandbox/standin_fabric.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox

BOARD = "NVSwitch board (4 NVSwitches on the PCI bus)"
ERR = "until it runs, CUDA fails on every GPU with error 802 \"system not yet initialized\""


def fabric(info: harness.HostInfo, home: Path) -> tuple[Any, set[tuple[str, str]]]:
    f = facts_json(info, home)
    return f["fabric_manager"], {(s["state"], s["status"]) for s in f["fabric"]}


def fabric_decision(info: harness.HostInfo, home: Path) -> dict[str, str]:
    r = gpu_provision("-H", info.inventory, "plan", "--json", home=home)
    assert r.returncode == 0, r.stderr
    return next(d for d in json.loads(r.stdout)["decisions"] if d["step"] == "fabric-manager")


def doctor(info: harness.HostInfo, home: Path, cwd: Path) -> list[dict[str, str]]:
    r = gpu_provision("-H", info.inventory, "doctor", "--json", home=home, cwd=cwd)
    return [f for f in json.loads(r.stdout) if f["id"].startswith("fabric-manager")]


def test_the_driver_task_brings_the_drivers_fabric_manager(hosts: Hosts, gp_home: Path,
                                                            tmp_path: Path) -> None:
    info = hosts.fresh("hgx-h100")
    try:
        f = facts_json(info, gp_home)
        assert f["nvswitches"] == ["0000:07:00.0", "0000:08:00.0", "0000:09:00.0", "0000:0a:00.0"]
        assert f["fabric_manager"]["version"] is None and f["driver"] == "550.90.07"
        assert {s["state"] for s in f["fabric"]} == {"In Progress"} and len(f["fabric"]) == 8
        [found] = doctor(info, gp_home, tmp_path)
        assert found["id"] == "fabric-manager-down"
        assert "nvidia-fabricmanager is not installed" in found["diagnosis"]
        assert "apt-get install nvidia-fabricmanager-550=550.90.07-1" in found["fix"]
        assert fabric_decision(info, gp_home) == {
            "step": "fabric-manager",
            "action": "install nvidia-fabricmanager 550.90.07, hold it and start it",
            "reason": f"{BOARD}: nvidia-fabricmanager is not installed; {ERR}"}

        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        installs = [c["argv"] for c in info.calls("apt-get") if "install" in c["argv"]]
        # asked first as it is installed, without leave to change the driver's held packages
        assert installs == [["-o", "DPkg::Lock::Timeout=600", "install", "-s", "-y", "-q",
                             "--allow-downgrades", "nvidia-fabricmanager-550=550.90.07-1"],
                            ["-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q",
                             "--allow-downgrades", "nvidia-fabricmanager-550=550.90.07-1"]]
        assert "nvidia-fabricmanager-550" in info.state()["held"]
        assert not {c["tool"] for c in info.calls()} & {"ubuntu-drivers", "modprobe", "reboot"}
        assert fabric(info, gp_home) == ({"version": "550.90.07", "active": "active",
                                          "enabled": "enabled"}, {("Completed", "Success")})
        log = info.path("/root/.gpu-provision/logs/fabric-manager.log").read_text()
        assert "nvidia-fabricmanager active" in log and "fabric: 8 Completed" in log

        again = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert again.returncode == 0
        assert (f"fabric-manager: nothing to do - {BOARD}: nvidia-fabricmanager 550.90.07 running "
                "(the driver's version); fabric Completed on 8 GPUs") in again.stdout
        assert doctor(info, gp_home, tmp_path) == []

        # stopped (by hand, or by a package upgrade): doctor and the plan say so, driver starts it
        harness.in_host(info, "systemctl", "stop", "nvidia-fabricmanager")
        [found] = doctor(info, gp_home, tmp_path)
        assert "nvidia-fabricmanager 550.90.07 is inactive" in found["diagnosis"]
        assert fabric_decision(info, gp_home)["action"] == "enable and start nvidia-fabricmanager"
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert fabric(info, gp_home)[0]["active"] == "active"
        assert len([c for c in info.calls("apt-get") if "install" in c["argv"]]) == 2
    finally:
        harness.stop(info.id)


def test_a_fabric_manager_of_another_version_is_replaced(hosts: Hosts, gp_home: Path,
                                                         tmp_path: Path) -> None:
    info = hosts.fresh("hgx-h100")
    try:
        # the repository's other 550 build, installed by hand: it refuses to start
        harness.in_host(info, "apt-get", "install", "-y", "nvidia-fabricmanager-550=550.54.15-1")
        refused = harness.in_host(info, "systemctl", "restart", "nvidia-fabricmanager",
                                  check=False)
        assert refused.returncode == 1
        assert "Job for nvidia-fabricmanager.service failed" in refused.stderr
        assert fabric_decision(info, gp_home) == {
            "step": "fabric-manager",
            "action": "install nvidia-fabricmanager 550.90.07, hold it and start it",
            "reason": f"{BOARD}: nvidia-fabricmanager is 550.54.15, not the driver's 550.90.07 "
                      f"(it refuses to start); {ERR}"}
        [found] = doctor(info, gp_home, tmp_path)
        assert "nvidia-fabricmanager is 550.54.15, not the driver's 550.90.07" in found["diagnosis"]

        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert fabric(info, gp_home) == ({"version": "550.90.07", "active": "active",
                                          "enabled": "enabled"}, {("Completed", "Success")})
    finally:
        harness.stop(info.id)
