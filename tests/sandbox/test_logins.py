"""Logins that are not root, on sandbox hosts with Debian's real sudo: a cloud image's default
user with passwordless sudo (cloud-init's rule) gets the driver installed through `sudo -n`, its
files in its own home staying its own; an account without sudo gets every step that needs root
named with why and the fix, and nothing run as root; the home's steps go ahead."""

from __future__ import annotations

import pytest

from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox

UBUNTU = {"user": "ubuntu", "uid": 2001, "sudo": True}
ALICE = {"user": "alice", "uid": 2002, "sudo": False}
ROOT_TOOLS = ("apt-get", "apt-mark", "modprobe", "update-initramfs", "reboot")


def test_a_sudo_login_installs_the_driver_through_sudo(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`ubuntu` on a fresh Ubuntu 22.04 VM (its archive has 580) with RTX 3090s and no driver:
    the plan says "(through sudo)", every
    package tool and the reboot run as root (uid 0), and the step's log, journal and result are
    the login's own files in its home."""
    info = hosts.fresh("ubuntu-22.04-nodriver", ubuntu_drivers=None, reboot_delay=2, login=UBUNTU)
    try:
        f = facts_json(info, gp_home)
        assert (f["root"], f["sudo"], f["login"], f["home"]) == (False, True, "ubuntu",
                                                                 "/home/ubuntu")
        plan = gpu_provision("-H", info.inventory, "plan", home=gp_home, cwd=tmp_path)
        assert plan.returncode == 0, plan.stdout + plan.stderr
        assert "install branch 580 (open modules) from Ubuntu's archive (through sudo)" in plan.stdout
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "driver 580.126.20 loaded (CUDA <= 13.0)" in r.stdout
        assert ("hold the driver packages (every installed package of branch 580; with prebuilt "
                "modules, the kernel's metapackages too) (through sudo)") in r.stdout
        calls = [c for c in info.calls() if c["tool"] in ROOT_TOOLS]
        # update, the driver packages held (apt-mark showhold), the dry run and the install
        assert [c["tool"] for c in calls] == ["apt-get", "apt-mark", "apt-get", "apt-get",
                                              "update-initramfs", "modprobe", "reboot", "apt-mark"]
        assert {c["uid"] for c in calls} == {0}
        assert info.state()["held"] and info.state()["boots"] == 1
        state = info.path("/home/ubuntu/.gpu-provision")
        for name in ("logs/driver.log", "steps/driver.json", "steps/driver.result",
                     "locks/host", "logs/driver-hold.log"):
            assert (state / name).stat().st_uid == 2001, name
        assert not info.path("/root/.gpu-provision").exists()  # nothing of ours in root's home
    finally:
        harness.stop(info.id)


def test_a_login_without_sudo_names_the_driver_step_and_runs_nothing_as_root(  # type: ignore[no-untyped-def]
        hosts: Hosts, gp_home, tmp_path) -> None:
    """`alice` (no sudoers entry) on the same kind of host: the plan names the driver step that
    cannot run and why; `driver` fails in one line naming host, step and fix; no package tool
    was run at all."""
    info = hosts.fresh("ubuntu-22.04-nodriver", ubuntu_drivers=None, login=ALICE)
    try:
        f = facts_json(info, gp_home)
        assert (f["root"], f["sudo"], f["sudo_said"]) == (False, False,
                                                         "sudo: a password is required")
        plan = gpu_provision("-H", info.inventory, "plan", home=gp_home, cwd=tmp_path)
        assert plan.returncode == 0, plan.stdout + plan.stderr
        flat = " ".join(plan.stdout.split())
        assert "cannot run: install branch 580 (open modules) from Ubuntu's archive needs root, " \
               "and the login alice is not root and has no passwordless sudo (sudo: a password is " \
               "required)" in flat.replace("│ ", "").replace(" │", ""), plan.stdout
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 1, r.stdout + r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: {info.id}: not run: driver: cannot run: install branch "
                               "580") or "not run: driver: cannot run" in last, r.stderr
        assert "log in as root or as a user with passwordless sudo" in last
        assert not [c for c in info.calls() if c["tool"] in ROOT_TOOLS]
    finally:
        harness.stop(info.id)


def test_a_login_without_sudo_bootstraps_its_home_and_exits_0(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`alice` without sudo on a host where nothing needs root (no GPU): conda, the env and
    torch go into her home, validation runs there, and bootstrap exits 0; every file is hers."""
    info = hosts.fresh("cpu-only", login=ALICE)
    try:
        r = gpu_provision("-H", info.inventory, "bootstrap", home=gp_home, cwd=tmp_path, timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        f = facts_json(info, gp_home)
        env = next(e for e in f["envs"] if e["name"] == "torch")
        assert env["prefix"] == "/home/alice/miniconda3/envs/torch"
        assert env["torch"].startswith("2.13.0")
        for inside in ("/home/alice/miniconda3/envs/torch/bin/python",
                       "/home/alice/.gpu-provision/steps/torch.json"):
            assert info.path(inside).stat().st_uid == 2002, inside
        assert not [c for c in info.calls() if c["tool"] in ROOT_TOOLS]
    finally:
        harness.stop(info.id)
