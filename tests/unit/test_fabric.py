"""NVSwitch boards: the switches on the PCI bus, the fabric manager's state, the step that
installs, holds and starts the driver's exact version, and what validation and doctor say about
CUDA error 802 (captured texts in tests/fixtures/lspci, fabric/ and torch/)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from provision.config.inventory import Target, settings_for
from provision.config.recipes import load_platform
from provision.config.shipped import templates_dir
from provision.doctor.match import diagnose
from provision.facts.fabric import (
    FabricManager,
    fabric_ready,
    fm_install_spec,
    fm_packages,
    nvlink5_board,
    parse_fabric_manager,
    parse_fabric_states,
    parse_fm_version,
    parse_nvswitches,
)
from provision.facts.host import HostFacts
from provision.facts.pci import parse_lspci
from provision.setup.plan import Plan, make_plan
from tests.cases import captured

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H100_BOARD = (FIX / "lspci/lspci-Dnn-egrep-nvidia-vga-8xh100-sxm5-4xnvswitch.txt").read_text()
IN_PROGRESS = {"rc": 0, "out": "0, In Progress, N/A\n1, In Progress, N/A"}
COMPLETED = {"rc": 0, "out": "0, Completed, Success\n1, Completed, Success"}


def _fm(version: str | None, active: str, enabled: str = "enabled") -> str:
    """The fabric manager probe's sections, its version line as nv-fabricmanager prints it."""
    line = (FIX / "fabric/nv-fabricmanager-version-450.102.04.txt").read_text()
    said = line.replace("450.102.04", version) if version else \
        "bash: line 1: nv-fabricmanager: command not found\n"
    return f"== version\n{said}== active\n{active}\n== enabled\n{enabled}\n"


@pytest.mark.parametrize("fixture,count", [
    ("lspci/lspci-Dnn-egrep-nvidia-vga-8xh100-sxm5-4xnvswitch.txt", 4),
    ("lspci/lspci-nn-grep-nvidia-8xa100-sxm4-80gb-6xnvswitch.txt", 6),
    ("lspci/lspci-nn-vm-1xa10-no-nvswitch.txt", 0),
    ("lspci/lspci-nn-8xh200-sxm.txt", 0),  # the GPUs' lines only: no switch function listed
])
def test_nvswitches_are_nvidia_functions_of_class_0680(fixture: str, count: int) -> None:
    assert len(parse_nvswitches((FIX / fixture).read_text())) == count


def test_b200_boards_hide_their_switches_behind_connectx7() -> None:
    text = (FIX / "lspci/lspci-PP-nn-hgx-b200-cx7-bridge.txt").read_text()
    assert parse_nvswitches(text) == ()
    assert nvlink5_board(parse_lspci(text)) == "8x B200"
    assert nvlink5_board(parse_lspci(H100_BOARD)) is None


def test_fabric_manager_version_service_and_fabric_state() -> None:
    assert parse_fm_version((FIX / "fabric/nv-fabricmanager-version-450.102.04.txt").read_text()) \
        == "450.102.04"
    assert parse_fabric_manager("") is None  # the probe prints nothing without a fabric manager
    assert parse_fabric_manager(_fm("590.48.01", "active")) == \
        FabricManager("590.48.01", "active", "enabled")
    no_systemd = parse_fabric_manager(_fm("590.48.01", "System has not been booted with systemd "
                                                       "as init system (PID 1). Can't operate."))
    assert no_systemd is not None and no_systemd.active is None
    # the fabric columns of a real --query-gpu row (tests/fixtures/nvidia-smi, H200 590.48.01)
    csv = (FIX / "nvidia-smi/query-gpu-full-h200-590.48.01.csv").read_text().splitlines()
    head = [h.strip() for h in csv[0].split(",")]
    row = [c.strip() for c in csv[1].split(",")]
    picked = ", ".join(row[head.index(k)] for k in ("index", "fabric.state", "fabric.status"))
    states = parse_fabric_states(picked, 0)
    assert [(s.state, s.status) for s in states] == [("Completed", "Success")]
    assert fabric_ready(states) is True
    assert parse_fabric_states('Field "fabric.state" is not a valid field to query.', 2) == ()
    assert fabric_ready(parse_fabric_states(IN_PROGRESS["out"], 0)) is False


@pytest.mark.parametrize("fam,driver,names", [
    ("apt", "550.90.07", ["nvidia-fabricmanager-550"]),
    ("apt", "580.82.09", ["nvidia-fabricmanager", "nvidia-fabricmanager-580"]),
    ("el", "550.90.07", ["nvidia-fabric-manager", "nvidia-fabricmanager"]),
    ("el", "590.48.01", ["nvidia-fabricmanager", "nvidia-fabric-manager"]),
])
def test_package_names_follow_the_branch(fam: str, driver: str, names: list[str]) -> None:
    assert fm_packages(fam, driver) == names


def test_doctor_advises_the_package_the_step_installs() -> None:
    """One spelling: doctor's fix names the first package the fabric-manager step tries (on
    the RHEL family from R580 on that is nvidia-fabricmanager, not nvidia-fabric-manager)."""
    from provision.doctor.match import diagnose
    from tests.cases import captured
    assert fm_install_spec("dnf", "580.65.06") == "nvidia-fabricmanager-580.65.06"
    assert fm_install_spec("apt", "550.90.07") == "nvidia-fabricmanager-550=550.90.07-1"
    text = ("fabric manager NVIDIA GPU driver interface version 570.86.15 don't match with "
            "driver version 580.65.06")
    rocky = captured("rocky-9-h100")
    [found] = [f for f in diagnose({"log": text}, rocky, host="box") if f.id == "fabric-manager-version"]
    assert "nvidia-fabricmanager-580.65.06" in found.fix, found.fix
    assert "nvidia-fabric-manager-580" not in found.fix


def _board(base: str = "rocky-9-h100", fm: str = "", fabric: dict[str, object] | None = None,
           **probes: str) -> HostFacts:
    return captured(base, {"lspci": H100_BOARD, "fabric_manager": fm,
                           "fabric": fabric or IN_PROGRESS, **probes})


def _plan(facts: HostFacts, platform: str = "generic-vm") -> Plan:
    settings = settings_for(Target(name="box", host="h"), platform, {})
    return make_plan("box", facts, settings, load_platform(platform))


def _fabric(plan: Plan) -> tuple[str | None, str]:
    d = next(d for d in plan.decisions if d.step == "fabric-manager")
    return d.action, d.reason


def _bash_ok(script: str) -> bool:
    return subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


BOARD = "NVSwitch board (4 NVSwitches on the PCI bus)"
ERR = "until it runs, CUDA fails on every GPU with error 802 \"system not yet initialized\""


@pytest.mark.parametrize("fm,action,why", [
    ("", "install nvidia-fabricmanager 590.48.01, hold it and start it",
     "nvidia-fabricmanager is not installed"),
    (_fm("580.82.09", "failed"), "install nvidia-fabricmanager 590.48.01, hold it and start it",
     "nvidia-fabricmanager is 580.82.09, not the driver's 590.48.01 (it refuses to start)"),
    (_fm("590.48.01", "inactive", "disabled"), "enable and start nvidia-fabricmanager",
     "nvidia-fabricmanager 590.48.01 is installed but inactive"),
])
def test_a_missing_stopped_or_other_fabric_manager_gets_a_step(fm: str, action: str,
                                                                why: str) -> None:
    plan = _plan(_board(fm=fm))
    assert _fabric(plan) == (action, f"{BOARD}: {why}; {ERR}")
    step = next(s for s in plan.steps if s.name == "fabric-manager")
    assert step.body is not None and _bash_ok(step.body)
    assert ("dnf install -y \"$name-$driver\"" in step.body) == action.startswith("install")
    assert "driver=590.48.01" in step.body
    assert [s.name for s in plan.steps][:2] == ["fabric-manager", "conda"]  # before the env


def test_a_running_fabric_manager_of_the_drivers_version_is_left_alone() -> None:
    plan = _plan(_board(fm=_fm("590.48.01", "active"), fabric=COMPLETED))
    assert _fabric(plan) == (None, f"{BOARD}: nvidia-fabricmanager 590.48.01 running (the "
                                   "driver's version); fabric Completed on 2 GPUs")


def test_on_a_container_the_fabric_manager_is_the_providers() -> None:
    plan = _plan(captured("autodl", {"lspci": H100_BOARD, "fabric": IN_PROGRESS}), "autodl")
    action, reason = _fabric(plan)
    assert action is None
    assert reason == (f"{BOARD}: the fabric manager runs on the platform's host, never touched "
                      "here; fabric In Progress on 2 GPUs: until it completes, CUDA fails on "
                      "every GPU with error 802 \"system not yet initialized\"; ask the provider")


def test_before_the_driver_the_fabric_manager_waits_for_its_version() -> None:
    plan = _plan(captured("ubuntu-20.04-nodriver", {"lspci": H100_BOARD}))
    assert _fabric(plan) == (None, f"{BOARD}: nvidia-fabricmanager of exactly the driver's "
                                   "version follows once the driver answers")
    assert [s.name for s in plan.steps if s.changes][0] == "driver"


def test_apt_takes_the_repositorys_entry_of_the_drivers_version() -> None:
    plan = _plan(_board("h200", fm=""))
    step = next(s for s in plan.steps if s.name == "fabric-manager")
    assert step.body is not None and _bash_ok(step.body)
    assert "for name in nvidia-fabricmanager nvidia-fabricmanager-590; do" in step.body
    assert 'apt-mark hold "$pkg"' in step.body


# -- validation and doctor name error 802 and the stopped fabric manager -------------------

@pytest.fixture(scope="module")
def vg() -> ModuleType:
    spec = importlib.util.spec_from_file_location("validate_gpu", templates_dir() / "gpu/validate_gpu.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _warning(fixture: str) -> str:
    """The message torch's UserWarning carried (what warnings.catch_warnings records)."""
    text = (FIX / fixture).read_text()
    m = re.search(r"UserWarning: (.*?\))\s*$", text, re.M)
    assert m
    return m.group(1)


def _measured(warning: str, fabric: dict[str, object] | None) -> dict[str, object]:
    return {"smi": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}] * 8, "processes": [], "error": None},
            "host": {"cpu_cores": 96, "memory_gb": 2000.0, "disks": []},
            "torch": {"version": "2.7.0+cu126", "cuda": "12.6", "error": None,
                      "cpu_matmul_ok": True, "available": False, "cuda_warnings": [warning]},
            "gpus": [], "cpu_gflops": 500.0, "libcuda": True, "fabric": fabric}


def test_validation_names_error_802_the_fabric_manager_and_the_fix(vg: ModuleType) -> None:
    warning = _warning("torch/warn-802-torch2.7.0-cu126-amzn2023.txt")
    assert "Error 802: system not yet initialized" in warning
    m = _measured(warning, {"manager": "inactive", "version": "570.133.20",
                            "states": ["In Progress, N/A"] * 8})
    checks = {c["name"]: c for c in vg.judge(m, {"expected_gpus": 8})}
    cuda = checks["cuda available"]
    assert cuda["status"] == "fail"
    assert cuda["reason"].startswith(
        "CUDA error 802: system not yet initialized: on an NVSwitch board the GPUs wait for the "
        "fabric manager to set up the NVLink fabric (nvidia-fabricmanager 570.133.20 inactive; "
        "fabric In Progress, N/A on 8 GPU(s)). Fix: run nvidia-fabricmanager of exactly the "
        "driver's version")
    assert "systemctl enable --now nvidia-fabricmanager" in cuda["reason"]
    assert "ask the provider" in cuda["reason"]
    none = vg.judge(_measured(warning, {"manager": None, "version": None, "states": None}),
                    {"expected_gpus": 8})
    assert "(no nvidia-fabricmanager service here)" in \
        next(c for c in none if c["name"] == "cuda available")["reason"]


def test_another_cuda_failure_keeps_its_own_words(vg: ModuleType) -> None:
    said = ("CUDA initialization: The NVIDIA driver on your system is too old (found version "
            "11040). (Triggered internally at ../c10/cuda/CUDAFunctions.cpp:109.)")
    [c] = [c for c in vg.judge(_measured(said, None), {"expected_gpus": 8})
           if c["name"] == "cuda available"]
    assert c["reason"] == ("torch.cuda.is_available() is False (the driver is too old for this "
                           "wheel, or not loaded): CUDA initialization: The NVIDIA driver on your "
                           "system is too old (found version 11040).")


@pytest.mark.parametrize("fm,state", [
    ("", "nvidia-fabricmanager is not installed"),
    (_fm("590.48.01", "failed"), "nvidia-fabricmanager 590.48.01 is failed"),
    (_fm("595.71.05", "failed"), "nvidia-fabricmanager is 595.71.05, not the driver's 590.48.01"),
])
def test_doctor_names_a_fabric_manager_that_is_down(fm: str, state: str) -> None:
    facts = _board(fm=fm)
    [f] = [f for f in diagnose({}, facts, host="box") if f.id.startswith("fabric-manager")]
    assert f.id == "fabric-manager-down" and f.level == "error"
    assert f.diagnosis.startswith(f"This is an NVSwitch board (4 NVSwitches on the PCI bus) and "
                                  f"{state}; fabric In Progress on 2 GPUs: ")
    assert "The driver here is 590.48.01" in f.fix and "`gpu-provision -H box driver`" in f.fix
    assert "{" not in f.fix + f.diagnosis


def test_doctor_is_silent_on_a_running_board_and_takes_the_journals_words_first() -> None:
    up = _board(fm=_fm("590.48.01", "active"), fabric=COMPLETED)
    assert not [f for f in diagnose({}, up, host="box") if f.id.startswith("fabric-manager")]
    journal = (FIX / "fabric/journal-fm-mismatch-595.71.05-vs-loaded-590.48.01-start-sh.txt").read_text()
    found = diagnose({"journal": journal}, _board(fm=_fm("595.71.05", "failed")), host="box")
    assert [f.id for f in found if f.id.startswith("fabric-manager")] == ["fabric-manager-version"]
