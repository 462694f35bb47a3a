"""`facts` and `plan` against every sandbox profile, over real SSH, in one remote execution."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Hosts, facts_json, gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox

# profile -> what facts must say: os id/version, machine kind, platform, nvidia state, driver,
# driver max CUDA, GPU count, first GPU name, its compute capability
EXPECT: dict[str, dict[str, Any]] = {
    "ubuntu-22.04-rtx4090": dict(os=("ubuntu", "22.04"), kind="vm", platform=None, state="ok",
                                 driver="550.127.05", cuda="12.4", gpus=8,
                                 name="NVIDIA GeForce RTX 4090", cc="8.9"),
    "ubuntu-20.04-nodriver": dict(os=("ubuntu", "20.04"), kind="vm", platform=None,
                                  state="no_driver", driver=None, cuda=None, gpus=0, pci=2,
                                  nouveau=True),
    "centos-7": dict(os=("centos", "7"), kind="vm", platform=None, state="no_driver",
                     driver=None, cuda=None, gpus=0, pci=2, glibc="2.17"),
    "rocky-9-h100": dict(os=("rocky", "9.5"), kind="vm", platform=None, state="ok",
                         driver="590.48.01", cuda="13.1", gpus=1, name="NVIDIA H100 80GB HBM3",
                         cc="9.0"),
    "debian-12": dict(os=("debian", "12"), kind="vm", platform=None, state="ok",
                      driver="580.82.09", cuda="13.0", gpus=1, name="NVIDIA GeForce GTX 960",
                      cc="5.2", pci=2),
    "autodl": dict(os=("ubuntu", "22.04"), kind="container", platform="autodl", state="ok",
                   driver="580.65.06", cuda="13.0", gpus=1, name="NVIDIA GeForce RTX 4090",
                   cc="8.9", conda="/root/miniconda3/bin/conda"),
    "cpu-only": dict(os=("ubuntu", "24.04"), kind="vm", platform=None, state="no_driver",
                     driver=None, cuda=None, gpus=0, pci=0),
    "h200": dict(os=("ubuntu", "22.04"), kind="vm", platform=None, state="ok",
                 driver="590.48.01", cuda="13.1", gpus=1, name="NVIDIA H200", cc="9.0", pci=1),
}


@pytest.mark.parametrize("profile", sorted(EXPECT))
def test_facts(hosts: Hosts, gp_home: Path, profile: str) -> None:
    info = hosts.get(profile)
    before = len(info.sessions())
    f = facts_json(info, gp_home)
    assert len(info.sessions()) - before == 1, "facts must be ONE remote execution"
    e = EXPECT[profile]
    assert (f["os"]["id"], f["os"]["version_id"]) == e["os"]
    assert f["virtualization"]["kind"] == e["kind"]
    assert f["platform"] == e["platform"]
    assert f["nvidia_state"] == e["state"]
    assert (f["driver"], f["driver_cuda"]) == (e["driver"], e["cuda"])
    assert len(f["gpus"]) == e["gpus"]
    if e["gpus"]:
        assert f["gpus"][0]["name"] == e["name"]
        assert f["gpus"][0]["compute_cap"] == e["cc"]
    if "pci" in e:
        assert len(f["pci_gpus"]) == e["pci"]
    assert f["nouveau_loaded"] == e.get("nouveau", False)
    if "glibc" in e:
        assert f["glibc"] == e["glibc"]
    if "conda" in e:
        assert f["conda"] == [e["conda"]]
        assert [(x["name"], x["python"]) for x in f["envs"]] == [("base", "3.11")]
    else:
        assert f["conda"] == []
    assert f["root"] is True and len(f["boot_id"]) == 36
    assert f["home"] == "/root"

    # what the facts script asked of the stand-ins, as they recorded it
    calls = [(c["tool"], c["argv"]) for c in info.calls()]
    assert ("lspci", ["-nn"]) in calls and ("lsmod", []) in calls
    assert ("systemd-detect-virt", []) in calls
    smi = [argv for tool, argv in calls if tool == "nvidia-smi"]
    if e["driver"]:
        assert ["--query-gpu=index,name,driver_version,memory.total,memory.used,compute_cap,"
                "utilization.gpu,pci.bus_id,uuid", "--format=csv"] in smi
        assert [] in smi  # the table, for the header's max CUDA
    else:
        assert smi == []  # no driver: nvidia-smi does not exist on the host


def test_fab_from_the_checkout_one_execution(hosts: Hosts, gp_home: Path) -> None:
    """`fab -H root@127.0.0.x:PORT facts` (the checkout's fabfile) is one remote execution."""
    info = hosts.get("rocky-9-h100")
    before = len(info.sessions())
    fab = str(Path(sys.executable).with_name("fab"))
    r = subprocess.run([fab, "-i", info.key, "-H", f"root@{info.host}:{info.port}", "facts"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, GPU_PROVISION_HOME=str(gp_home), COLUMNS="200"))
    assert r.returncode == 0, r.stderr
    assert "NVIDIA H100 80GB HBM3" in r.stdout and "Rocky Linux 9.5" in r.stdout
    assert len(info.sessions()) - before == 1
    assert "Starting session: command for root" in info.sessions()[-1]


def plan_json(info: Any, home: Path, *extra: str) -> dict[str, Any]:
    r = gpu_provision("-H", info.inventory, "plan", "--json", *extra, home=home)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def decision(plan: dict[str, Any], step: str) -> dict[str, str]:
    return next(d for d in plan["decisions"] if d["step"] == step)


@pytest.mark.parametrize("profile,driver_action,torch", [
    # Ubuntu 20.04's archive ends at branch 550 (CUDA 12.4): the build for that
    ("ubuntu-20.04-nodriver", "install branch 550 from Ubuntu's archive", "2.7.1+cu118"),
    ("centos-7", "install branch 550 from ELRepo", "2.6.0+cu124"),
    ("rocky-9-h100", "none", "2.14.1+cu130"),
    ("debian-12", "none", "2.14.1+cu126"),
    ("ubuntu-22.04-rtx4090", "none", "2.7.1+cu118"),
    ("h200", "none", "2.14.1+cu130"),
    ("cpu-only", "none", "2.13.0+cpu"),
])
def test_plan_decisions(hosts: Hosts, gp_home: Path, profile: str, driver_action: str,
                        torch: str) -> None:
    info = hosts.get(profile)
    before = len(info.sessions())
    p = plan_json(info, gp_home)
    # a dry run: the facts, and one probe of the mirrors its downloads would use
    assert len(info.sessions()) - before == (2 if p["mirrors"] else 1)
    assert decision(p, "driver")["action"] == driver_action
    assert f"{p['torch']['torch']}+{p['torch']['cuda']}" == torch
    assert p["torch"]["index_url"].startswith(info.mirror["pytorch"])
    assert p["blocked"] is None


def test_plan_centos7_limits(hosts: Hosts, gp_home: Path) -> None:
    p = plan_json(hosts.get("centos-7"), gp_home)
    # glibc 2.17 stops torch at 2.6, and the ELRepo driver (550) at CUDA 12.4
    assert (p["torch"]["torch"], p["torch"]["cuda"]) == ("2.6.0", "cu124")
    conda = decision(p, "conda")
    assert "Miniconda3-py310_23.11.0-2-Linux-x86_64.sh" in conda["reason"]
    assert "glibc 2.17 is older than the 2.28 current installers need" in conda["reason"]
    assert decision(p, "driver")["action"] == "install branch 550 from ELRepo"


def test_plan_h200_torch_2_14(hosts: Hosts, gp_home: Path) -> None:
    p = plan_json(hosts.get("h200"), gp_home, "--torch", "2.14")
    assert f"{p['torch']['torch']}+{p['torch']['cuda']}" == "2.14.1+cu130"
    assert p["torch"]["torchvision"] == "0.29.1"


def test_plan_nouveau_reason(hosts: Hosts, gp_home: Path) -> None:
    d = decision(plan_json(hosts.get("ubuntu-20.04-nodriver"), gp_home), "driver")
    assert "nouveau is loaded" in d["reason"] and "no NVIDIA driver installed" in d["reason"]


def test_plan_container_never_touches_driver(hosts: Hosts, gp_home: Path) -> None:
    p = plan_json(hosts.get("autodl"), gp_home)
    assert p["settings"]["platform"] == "autodl"
    # the platform's driver is loaded and new enough: nothing to do, and the plan says why
    assert decision(p, "driver") == {
        "step": "driver", "action": "none",
        "reason": "driver 580.65.06 loaded (CUDA <= 13.0, nvidia-smi); enough for torch 2.14.1+cu130"
                  "; autodl owns the driver (never touched on a container)"}
    assert decision(p, "conda")["action"] == "none"
    assert decision(p, "env")["reason"].startswith("adopt the platform's env 'base'")


def test_plan_container_says_the_platform_owns_the_driver(hosts: Hosts, gp_home: Path) -> None:
    reason = decision(plan_json(hosts.get("autodl"), gp_home), "driver")["reason"]
    assert reason.endswith("; autodl owns the driver (never touched on a container)"), reason


# the sandbox's own records, which change on any login and are not the tool's doing: what the
# stand-ins were asked (the test reads it below) and sshd's session log
BOOKKEEPING = ("upper/var/lib/gpu-sandbox/calls.log", "upper/var/log/gpu-sandbox-sshd.log")
# what a dry run may ask the stand-ins: (tool, argv predicate)
READ_ONLY: dict[str, Any] = {
    "lspci": lambda a: True, "lsmod": lambda a: True, "systemd-detect-virt": lambda a: True,
    "nvidia-smi": lambda a: True, "uname": lambda a: True,
    "dpkg-query": lambda a: a[:1] in (["-W"], ["--show"], ["-l"], ["-s"]),
    "rpm": lambda a: a[:1] and a[0].startswith("-q"),
    "apt-mark": lambda a: a == ["showhold"],
    "ubuntu-drivers": lambda a: a[:1] in (["list"], ["devices"]),
}


def host_files(info: Any) -> dict[str, tuple[int, int, int]]:
    """(mode, size, mtime) of every file and directory a host can change: its overlay upper dir
    and its own /root, /opt, /tmp and data dirs."""
    root = Path(info.root)
    out = {}
    for d in ["upper", *(src for src, _ in harness.host_binds(root))]:
        for p in (root / d).rglob("*"):
            rel = str(p.relative_to(root))
            if rel not in BOOKKEEPING:
                st = p.lstat()
                out[rel] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("profile,change,code", [
    ("cpu-only", "install torch 2.13.0+cpu", 0),
    # torch 2.13 has no build for sm_86 within driver 550's CUDA: blocked, a usage error's 2
    ("ubuntu-20.04-nodriver", "install branch 550", 2),
])
def test_plan_text_changes_nothing(hosts: Hosts, gp_home: Path, profile: str, change: str,
                                   code: int) -> None:
    info = hosts.get(profile)
    before, asked = host_files(info), len(info.calls())
    r = gpu_provision("-H", info.inventory, "plan", "--torch", "2.13", home=gp_home)
    assert r.returncode == code, r.stderr
    assert "dry run: nothing was changed" in r.stdout
    assert change in r.stdout
    after = host_files(info)
    assert after == before, {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    calls = info.calls()[asked:]
    assert calls, "the plan read nothing through the stand-ins"
    writes = [(c["tool"], c["argv"]) for c in calls
              if not READ_ONLY.get(c["tool"], lambda a: False)(c["argv"])]
    assert writes == []


def test_plan_rejects_bad_cli_values(hosts: Hosts, gp_home: Path) -> None:
    info = hosts.get("cpu-only")
    r = gpu_provision("-H", info.inventory, "plan", "--env-name", "a b;rm -rf /", home=gp_home)
    assert r.returncode == 2 and "--env-name: 'a b;rm -rf /' is not a valid name" in r.stderr  # a usage error


def test_a_busy_gpu_is_named_by_index_over_ssh(hosts: Hosts, gp_home: Path) -> None:
    """An 8x H100 box (its captured nvidia-smi -q: each GPU's UUID) where someone's job runs on
    the fourth GPU: the facts ask nvidia-smi for each process's GPU UUID, and doctor names that
    GPU by its index and the seven free ones to run on."""
    third = "GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14"  # index 3 in q-8xh100-80gb-hbm3-565.57.01
    info = hosts.fresh("hgx-h100", processes=[{"pid": 1187424, "name": "python",
                                                "used_memory": 21205, "gpu_uuid": third}])
    try:
        f = facts_json(info, gp_home)
        assert [(p["pid"], p["gpu_uuid"]) for p in f["gpu_processes"]] == [(1187424, third)]
        r = gpu_provision("-H", info.inventory, "doctor", "--json", home=gp_home)
        busy = {d["id"]: d for d in json.loads(r.stdout)}["gpu-busy"]
        assert "GPU 3: 20.7 GB held by pid 1187424 (python), 0% busy; GPUs 0-2, 4-7 are free: " \
               "run with --gpus 0,1,2,4,5,6,7." in busy["diagnosis"]
        assert any("--query-compute-apps=gpu_uuid,pid,process_name,used_memory" in c["argv"]
                   for c in info.calls("nvidia-smi"))
    finally:
        harness.stop(info.id)
