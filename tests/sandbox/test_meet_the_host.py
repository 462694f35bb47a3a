"""Meet the host as it is: a platform's torch that fails the wheel rule is replaced (in an env of
ours, the platform's left alone) with a plan that says why; an env with another Python than
the one asked is recreated or refused; a mirror that lags behind the data is installed from as
it is, and the plan names the lag.

The CPU-torch container does the one real CUDA install (2.14.1+cu130 from the mirror, minutes
and GBs); the old-image container shows the replacement in the plan and the install command in
the step log and stops there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from provision.ops.installer import load_uv
from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness
from tests.sandbox.platform_env import platform_torch_files

pytestmark = pytest.mark.sandbox

NO_LIBCUDA = ("no libcuda.so.1 on this host: the NVIDIA driver's user-space library is missing, "
              "so CUDA cannot start")


def plan_json(inventory: str, home: Path, *args: str) -> dict[str, object]:
    r = gpu_provision("-H", inventory, "plan", "--json", *args, home=home)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def decision(plan: dict[str, object], step: str) -> dict[str, str]:
    return next(d for d in plan["decisions"] if d["step"] == step)  # type: ignore[attr-defined,union-attr]


def envs(info: harness.HostInfo, home: Path) -> dict[str, tuple[str, str | None]]:
    return {e["name"]: (e["python"], e["torch"]) for e in facts_json(info, home)["envs"]}


def test_cpu_torch_in_the_platform_env_is_replaced_in_an_env_of_ours(
        hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    info = hosts.fresh("autodl-cpu-torch")
    try:
        before = platform_torch_files(info, "/root/miniconda3")
        assert "torch/version.py" in before
        why = ("the platform's env 'base' keeps its torch 2.13.0+cpu, unchanged (torch 2.13.0+cpu "
               "is a CPU build; 2x RTX 3090 need a CUDA build)")
        plan = plan_json(info.inventory, gp_home)
        assert decision(plan, "env")["action"] == "create 'torch'"
        assert decision(plan, "env")["reason"].startswith(why)
        assert decision(plan, "torch")["action"] == "install torch 2.14.1+cu130"
        assert decision(plan, "torch")["reason"].startswith(why)

        r = gpu_provision("-H", info.inventory, "bootstrap", home=gp_home, cwd=tmp_path,
                          timeout=1500)
        assert "torch 2.14.1+cu130 (CUDA 13.0) installed in /root/miniconda3/envs/torch" in r.stdout
        assert envs(info, gp_home) == {"base": ("3.11", "2.13.0+cpu"),
                                       "torch": ("3.11", "2.14.1+cu130")}
        assert platform_torch_files(info, "/root/miniconda3") == before  # not touched
        # no GPU here: validation says so in one line, about the replaced torch
        assert r.returncode == 1 and "verdict: FAIL" in r.stdout
        [path] = (tmp_path / "reports" / info.id).glob("validate-*.json")
        report = json.loads(path.read_text())
        assert (report["torch"], report["cuda"]) == ("2.14.1+cu130", "13.0")
        assert [c["reason"] for c in report["checks"] if c["status"] == "fail"] == [NO_LIBCUDA]
        assert not {c["tool"] for c in info.calls()} & {"apt-get", "ubuntu-drivers", "modprobe",
                                                         "reboot", "apt-mark"}
        # the next plan keeps what was installed, and still says why the platform's is not used
        again = plan_json(info.inventory, gp_home)
        assert decision(again, "torch") == {"step": "torch", "action": "none",
                                            "reason": "torch 2.14.1+cu130 already installed"}
        assert decision(again, "env")["reason"].startswith(why)
    finally:
        harness.stop(info.id)


def test_old_cuda_torch_without_the_gpus_arch_shows_the_replacement_and_its_command(
        hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    info = hosts.fresh("autodl-old-torch")
    first = None
    try:
        before = platform_torch_files(info, "/root/miniconda3")
        why = ("torch 2.2.1+cu121 has no sm_120 kernels; RTX 5090 needs cu128 or later")
        plan = plan_json(info.inventory, gp_home)
        assert decision(plan, "env") == {
            "step": "env", "action": "create 'torch'",
            "reason": f"the platform's env 'base' keeps its torch 2.2.1+cu121, unchanged ({why}); "
                      "conda create -n torch python=3.11"}
        assert decision(plan, "torch")["action"] == "install torch 2.14.1+cu130"
        assert why in decision(plan, "torch")["reason"]

        # bootstrap until the torch step starts installing (the CUDA wheel is the other
        # test's), stop
        first = subprocess.Popen([sys.executable, "-m", "provision", "-H", info.inventory,
                                  "bootstrap"], cwd=tmp_path, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "GPU_PROVISION_HOME": str(gp_home),
                                      "GPU_PROVISION_WORKDIR": str(tmp_path),
                                      "COLUMNS": "200"})
        log = info.path("/root/.gpu-provision/logs/torch.log")
        # into our env, with its python, from the mirror's cu130 index, by our uv (the
        # mirror serves it)
        command = (f"/root/.gpu-provision/tools/uv-{load_uv().version}/uv pip install "
                   f"torch==2.14.1 torchvision==0.29.1 --index-url {info.mirror['pytorch']}/cu130/"
                   " --python /root/miniconda3/envs/torch/bin/python\n")
        deadline = time.monotonic() + 300
        while not (log.exists() and command in log.read_text()):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the torch step never reached the install"
            time.sleep(0.2)
        body = int(info.path("/root/.gpu-provision/steps/torch.pid").read_text().split()[0])
        first.kill()
        first.communicate()
        os.killpg(body, signal.SIGKILL)  # the detached body: its own session, still installing
        assert platform_torch_files(info, "/root/miniconda3") == before
        assert info.path("/root/miniconda3/envs/torch/bin/python").exists()
    finally:
        if first is not None and first.poll() is None:
            first.kill()
        harness.stop(info.id)


def test_a_python_asked_of_the_platforms_env_is_refused(hosts: Hosts, gp_home: Path,
                                                        tmp_path: Path) -> None:
    info = hosts.get("autodl")  # read-only here: plan and a refused env step change nothing
    blocked = gpu_provision("-H", info.inventory, "plan", "--json", "--python", "3.10",
                            home=gp_home)
    assert blocked.returncode == 2, blocked.stderr  # a blocked plan: the JSON, and exit 2
    plan = json.loads(blocked.stdout)
    refusal = ("the platform's env 'base' has python 3.11, python 3.10 is asked (--python): the "
               "platform's env is never replaced; drop --python to use it with python 3.11, or "
               "name an env of ours for python 3.10 beside it (--env-name NAME, or env_name: in "
               "the inventory)")
    assert plan["blocked"] == refusal
    r = gpu_provision("-H", info.inventory, "bootstrap", "--python", "3.10", home=gp_home,
                      cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(refusal)
    assert envs(info, gp_home) == {"base": ("3.11", None)}


# -- a mirror that lags, then an env with the wrong Python, on one CPU host ------------------

@pytest.fixture(scope="module")
def lagging(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[harness.HostInfo, str, Path]:
    """A fresh CPU host whose inventory does not pin torch: the rule's newest is 2.14.1+cpu, the
    mirror's cpu index serves 2.13.0."""
    info = hosts.fresh("cpu-only")
    home = tmp_path_factory.mktemp("gp-home")
    data = yaml.safe_load(Path(info.inventory).read_text())
    assert data.pop("torch") == "2.13"
    inventory = tmp_path_factory.mktemp("inv") / "lagging.yaml"
    inventory.write_text(yaml.safe_dump(data))
    return info, str(inventory), home


def test_a_mirror_that_lags_is_installed_from_as_it_is(
        lagging: tuple[harness.HostInfo, str, Path], tmp_path: Path) -> None:
    info, inventory, home = lagging
    mirror = info.mirror["pytorch"]
    first = plan_json(inventory, home)
    assert decision(first, "torch")["action"] == "install torch 2.14.1+cpu"
    assert decision(first, "torch")["reason"].endswith(
        f"the step confirms torch 2.14.1+cpu against the mirror ({mirror}) before installing")

    r = gpu_provision("-H", inventory, "bootstrap", home=home, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict: PASS" in r.stdout
    lag = f"mirror {mirror} has no 2.14.1+cpu; newest there 2.13.0 (for python 3.11)"
    log = info.path("/root/.gpu-provision/logs/torch.log").read_text()
    assert f"{lag}: installing 2.13.0 instead" in log
    assert f"pip install torch==2.13.0 --index-url {mirror}/cpu/" in log
    [path] = (tmp_path / "reports" / "lagging").glob("validate-*.json")  # the inventory's name
    assert json.loads(path.read_text())["torch"] == "2.13.0+cpu"

    after = plan_json(inventory, home)
    torch = decision(after, "torch")
    assert torch["action"] == "none"
    assert torch["reason"].startswith(f"torch 2.13.0+cpu already installed; {lag} (read ")
    assert after["changes"] == []


def test_an_env_with_another_python_is_recreated_or_put_back(
        lagging: tuple[harness.HostInfo, str, Path], tmp_path: Path) -> None:
    info, inventory, home = lagging
    torch_dir = info.path("/root/miniconda3/envs/torch/lib/python3.11/site-packages/torch")
    assert torch_dir.is_dir(), "the mirror test bootstraps this host first"
    stamp = torch_dir.stat().st_mtime_ns
    plan = plan_json(inventory, home, "--python", "3.10")
    assert decision(plan, "env") == {
        "step": "env", "action": "recreate 'torch' with python 3.10",
        "reason": "env 'torch' has python 3.11, python 3.10 is asked (--python): it is recreated "
                  "with it (what was installed in it goes; the old env is put back if conda "
                  "cannot make the new one)"}
    # the test conda has no python 3.10 (as a channel without it): conda's error, with a fix
    r = gpu_provision("-H", inventory, "bootstrap", "--python", "3.10", home=home, cwd=tmp_path)
    assert r.returncode == 1
    assert "step 'env' failed" in r.stderr and "PackagesNotFoundError" in r.stderr
    fix = next(ln for ln in r.stderr.splitlines() if ln.startswith("fix: "))
    assert "None of the configured conda channels has python 3.10" in fix
    assert "the env torch is back as it was (python 3.11)" in r.stderr
    assert torch_dir.stat().st_mtime_ns == stamp  # the same files, back where they were
    assert envs(info, home)["torch"] == ("3.11", "2.13.0+cpu")
    # and the Python it has is the one asked by default: nothing to do, one execution
    before = len(info.sessions())
    again = gpu_provision("-H", inventory, "bootstrap", home=home, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(info.sessions()) - before == 1
