"""Bootstrap on GPU sandbox hosts with the real CUDA 13.0 wheel from the mirror (several GB):
the driver path, the install, and validation that fails honestly (this machine has no GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox

NO_LIBCUDA = ("no libcuda.so.1 on this host: the NVIDIA driver's user-space library is missing, "
              "so CUDA cannot start")


def report(tmp_path: Path, host: str) -> dict[str, object]:
    [path] = (tmp_path / "reports" / host).glob("validate-*.json")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def test_no_driver_vm_bootstrap_end_to_end(hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    # Ubuntu 22.04: its archive has branch 580, whose CUDA 13.0 build the mirror serves (20.04's
    # ends at 550)
    info = hosts.fresh("ubuntu-22.04-nodriver")
    try:
        boot = facts_json(info, gp_home)["boot_id"]
        r = gpu_provision("-H", info.inventory, "bootstrap", home=gp_home, cwd=tmp_path,
                          timeout=1500)
        assert "rebooting (the module cannot load without it)" in r.stdout
        f = facts_json(info, gp_home)
        # every package of the branch that loaded held, the module's and the libraries'
        assert f["boot_id"] != boot and f["driver"] == "580.126.20"
        held = info.state()["held"]
        assert "nvidia-driver-580-server-open" in held and "libnvidia-compute-580-server" in held
        assert "nvidia-dkms-580-server-open" in held and all("580" in name for name in held)
        for step in ("conda", "env", "torch"):
            entry = json.loads(info.path(f"/root/.gpu-provision/steps/{step}.json").read_text())
            assert entry["result"] == "ok", step
        env = {e["name"]: e for e in f["envs"]}["torch"]
        assert (env["torch"].split("+")[0], env["torch_cuda"]) == ("2.14.1", "13.0")
        # no GPU here: the verdict says so, in one line, and the exit code says FAIL
        assert r.returncode == 1 and "verdict: FAIL" in r.stdout
        rep = report(tmp_path, info.id)
        assert rep["verdict"] == "FAIL"
        assert {"name": "cuda available", "status": "fail", "reason": NO_LIBCUDA} in rep["checks"]
    finally:
        harness.stop(info.id)


def test_h200_torch_2_14_cu130(hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    info = hosts.fresh("h200")
    try:
        r = gpu_provision("-H", info.inventory, "bootstrap", "--torch", "2.14", home=gp_home,
                          cwd=tmp_path, timeout=1500)
        assert "torch: install torch 2.14.1+cu130" in r.stdout
        assert r.returncode == 1 and "verdict: FAIL" in r.stdout
        rep = report(tmp_path, info.id)
        assert (rep["torch"].split("+")[0], rep["cuda"]) == ("2.14.1", "13.0")
        assert [c["reason"] for c in rep["checks"] if c["status"] == "fail"] == [NO_LIBCUDA]
        assert not {c["tool"] for c in info.calls()} & {"apt-get", "ubuntu-drivers", "reboot"}
        # doctor right after it names that FAIL first, as an error (it said "nothing" once)
        d = gpu_provision("-H", info.inventory, "doctor", "--json", home=gp_home, cwd=tmp_path)
        assert d.returncode == 1, d.stdout + d.stderr
        first = json.loads(d.stdout)[0]
        assert (first["id"], first["level"]) == ("recorded-verdict", "error")
        assert f"says FAIL: cuda available: {NO_LIBCUDA}" in first["diagnosis"]
        # the CUDA build is recognised on the next run: nothing reinstalled, two executions
        before = len(info.sessions())
        again = gpu_provision("-H", info.inventory, "bootstrap", "--torch", "2.14", home=gp_home,
                              cwd=tmp_path)
        assert "torch: nothing to do - torch 2.14.1+cu130 already installed" in again.stdout
        assert len(info.sessions()) - before == 2
    finally:
        harness.stop(info.id)


def test_autodl_uses_the_platform_conda_and_env(hosts: Hosts, gp_home: Path,
                                                tmp_path: Path) -> None:
    info = hosts.get("autodl")
    for task in ("driver", "conda", "env"):
        r = gpu_provision("-H", info.inventory, task, home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"{task}: nothing to do" in r.stdout
    assert "adopt the platform's env 'base'" in r.stdout
    assert not {c["tool"] for c in info.calls()} & {"apt-get", "ubuntu-drivers", "modprobe",
                                                     "reboot", "apt-mark"}
    # the facts list the installed driver packages (for doctor); nothing else asks dpkg
    assert all(c["argv"][:1] == ["-W"] for c in info.calls("dpkg-query"))
