"""Every image's stack, met as it is: a torch the image put in a named conda env or in the system
python (really installed from the local mirror when the host was built) passes the rule and is
used as it is: no Miniconda and no torch from the mirror, jobs and validation run in it, and what
a recipe adds goes into a venv over the system python with pip. One that fails the rule (a CPU
build on a GPU host) is left untouched and ours goes beside it."""

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

from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness, mirror
from tests.sandbox.platform_env import platform_torch_files
from tests.sandbox.test_installer import fake_wheels, with_pypi
from tests.sandbox.test_provisioned import junit

pytestmark = pytest.mark.sandbox

VIEW = "/root/.gpu-provision/venv"
SYSTEM_TORCH = "/usr/local/lib/python3.11/dist-packages/torch/__init__.py"
WHICH = "import sys, torch; print(torch.__file__); print(sys.executable)"


def plan_json(inventory: str, home: Path) -> dict[str, object]:
    r = gpu_provision("-H", inventory, "plan", "--json", home=home)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def decisions(plan: dict[str, object], step: str) -> list[dict[str, str]]:
    return [d for d in plan["decisions"] if d["step"] == step]  # type: ignore[attr-defined,union-attr]


def decision(plan: dict[str, object], step: str) -> dict[str, str]:
    return decisions(plan, step)[0]


def job_output(info: harness.HostInfo, home: Path, name: str, *argv: str) -> list[str]:
    """`run -- ARGV` as a user types it, and the job's log once it ended."""
    r = gpu_provision("-H", info.inventory, "run", "--name", name, "--workdir", "/tmp",
                      "--no-code", "--", *argv, home=home)
    assert r.returncode == 0, r.stdout + r.stderr
    job = r.stdout.split("started job ")[1].split()[0]
    logs = gpu_provision("-H", info.inventory, "logs", job, "-f", home=home)
    assert logs.returncode == 0, logs.stderr
    return logs.stdout.splitlines()[-2:]  # (torch 2.13.0 warns first where numpy is missing)


def report_of(tmp_path: Path, host: str) -> dict[str, object]:
    [path] = (tmp_path / "reports" / host).glob("validate-*.json")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def unshared(inventory: str, info: harness.HostInfo) -> str:
    """``inventory`` with its Miniconda and PyTorch mirrors under a path of this host's own (the
    mirror serves nothing there): the access log is shared by every test running at once, and
    a request of this host's must be told from theirs. A Miniconda or a torch this host did
    need would fail its bootstrap; one it asked for shows in ``not_downloaded``."""
    data = yaml.safe_load(Path(inventory).read_text())
    base = data["mirrors"]["miniconda"].rsplit("/miniconda", 1)[0]
    data["mirrors"] = {**data["mirrors"], "miniconda": f"{base}/only-{info.id}/miniconda",
                       "pytorch": f"{base}/only-{info.id}/pytorch"}
    Path(inventory).write_text(yaml.safe_dump(data))
    return inventory


def not_downloaded(since: int, info: harness.HostInfo) -> None:
    """This host asked the mirror for nothing of Miniconda and no torch since ``since``."""
    served = [line for line, _ in mirror.requests(since)]
    assert not [s for s in served if f"/only-{info.id}/" in s], served


def test_a_named_conda_env_of_the_image_is_used_as_it_is(hosts: Hosts, gp_home: Path,
                                                        tmp_path: Path) -> None:
    info = hosts.fresh("image-conda-env")
    env = "/opt/conda/envs/pytorch"
    try:
        before = platform_torch_files(info, env)
        assert "torch/version.py" in before
        plan = plan_json(info.inventory, gp_home)
        assert [d["reason"] for d in decisions(plan, "image")] == [
            f"{env} (the image's conda env 'pytorch', python 3.11) has torch 2.13.0+cpu, which "
            "passes the rule (no NVIDIA GPU: any build runs): used as it is, nothing downloaded"]
        assert decision(plan, "env")["reason"] == \
            "adopt the image's env 'pytorch' (python 3.11, torch 2.13.0+cpu)"
        assert plan["changes"] == []

        inv = unshared(info.inventory_with(tmp_path / "inv" / f"{info.id}.yaml"), info)
        since = mirror.log_offset()
        r = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, timeout=600)
        assert r.returncode == 0 and "verdict: PASS" in r.stdout, r.stdout + r.stderr
        not_downloaded(since, info)
        assert not info.path("/root/miniconda3").exists()
        assert platform_torch_files(info, env) == before  # not touched
        report = report_of(tmp_path, info.id)
        assert report["python"] == f"{env}/bin/python"
        assert report["torch_file"] == f"{env}/lib/python3.11/site-packages/torch/__init__.py"

        assert job_output(info, gp_home, "which", "python", "-c", WHICH) == [
            f"{env}/lib/python3.11/site-packages/torch/__init__.py", f"{env}/bin/python"]
    finally:
        harness.stop(info.id)


def test_the_system_python_torch_is_used_through_a_venv_over_it(hosts: Hosts, gp_home: Path,
                                                                 tmp_path: Path) -> None:
    info = hosts.fresh("image-system-torch")
    try:
        before = platform_torch_files(info, "/usr/local")
        assert "torch/version.py" in before
        # what a recipe adds: a package that needs torch, from a PyPI mirror that also serves a
        # higher (fake) torch: pip, seeing the image's torch through the venv, installs neither
        pypi = mirror.overlay("image-pythons", wheels=fake_wheels(tmp_path / "wheels"))
        inv = unshared(with_pypi(info, tmp_path / "inv" / "box.yaml", pypi,
                                 packages=["needs-torch"]), info)
        plan = plan_json(inv, gp_home)
        assert [d["reason"] for d in decisions(plan, "image")] == [
            "/usr/bin/python3.11 (the image's system python 3.11) has torch 2.13.0+cpu, which "
            "passes the rule (no NVIDIA GPU: any build runs): used as it is, nothing downloaded"]
        assert decision(plan, "conda")["action"] == "none"
        assert decision(plan, "env")["action"] == \
            "make ~/.gpu-provision/venv over /usr/bin/python3.11"
        assert decision(plan, "torch")["action"] == "none"
        assert decision(plan, "installer")["action"] == "use pip"

        since = mirror.log_offset()
        r = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, timeout=600)
        assert r.returncode == 0 and "verdict: PASS" in r.stdout, r.stdout + r.stderr
        not_downloaded(since, info)
        assert not info.path("/root/miniconda3").exists()
        assert platform_torch_files(info, "/usr/local") == before  # not touched
        packages = info.path("/root/.gpu-provision/logs/packages.log").read_text()
        assert "installer: pip (the env is a venv over the image's python" in packages
        assert "Requirement already satisfied: torch>=2 in /usr/local/lib/python3.11/" \
               "dist-packages" in packages, packages
        assert "Successfully installed needs-torch-1.0" in packages
        assert info.path(f"{VIEW}/lib/python3.11/site-packages/needs_torch").is_dir()
        assert not list(info.path(f"{VIEW}/lib/python3.11/site-packages").glob("torch*"))
        report = report_of(tmp_path, "box")
        assert (report["python"], report["python_base"], report["torch_file"]) == (
            f"{VIEW}/bin/python", "/usr/bin/python3.11", SYSTEM_TORCH)
        assert f"python: {VIEW}/bin/python (it runs /usr/bin/python3.11), torch from " \
               f"{SYSTEM_TORCH}" in r.stdout

        assert job_output(info, gp_home, "which", "python", "-c", WHICH) == [
            SYSTEM_TORCH, f"{VIEW}/bin/python"]
        # a login shell has the same python first on PATH
        login = subprocess.run(
            ["ssh", "-i", info.key, "-p", str(info.port), "-o", "StrictHostKeyChecking=no",
             "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             f"{info.user}@{info.host}", "bash -lc 'command -v python; echo $VIRTUAL_ENV'"],
            capture_output=True, text=True, timeout=60)
        assert login.stdout.split() == [f"{VIEW}/bin/python", VIEW], login.stderr
        # the next plan changes nothing: the venv is there, over the same python
        again = plan_json(inv, gp_home)
        assert again["changes"] == []
        assert decision(again, "env")["reason"].startswith(
            "~/.gpu-provision/venv, a venv over the image's /usr/bin/python3.11, is there")
        assert facts_json(info, gp_home)["view"] == "/usr/bin/python3.11"
        # the shipped testinfra suite checks the same interpreter (no conda to check)
        ok = gpu_provision("-H", inv, "verify", "--junit", "v.xml", home=gp_home, cwd=tmp_path)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert junit(tmp_path / "v.xml") == {
            "test_driver_loaded_as_recorded": "skipped", "test_gpus_as_expected": "skipped",
            "test_conda": "skipped", "test_env_python": "passed",
            "test_torch_version_and_cuda_variant": "passed", "test_cuda_available": "skipped",
            "test_mirrors_configured": "skipped", "test_driver_packages_held": "skipped",
            "test_no_stale_lock": "passed"}
    finally:
        harness.stop(info.id)


def test_a_cpu_torch_in_the_system_python_on_a_gpu_host_gets_ours_beside_it(
        hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    info = hosts.fresh("image-system-cpu-torch-h200")
    first = None
    try:
        before = platform_torch_files(info, "/usr/local")
        plan = plan_json(info.inventory, gp_home)
        assert [d["reason"] for d in decisions(plan, "image")] == [
            "/usr/bin/python3.11 (the image's system python 3.11) has torch 2.13.0+cpu, which "
            "fails the rule (torch 2.13.0+cpu is a CPU build; H200 needs a CUDA build): left "
            "untouched, and an env of ours goes beside it"]
        assert decision(plan, "conda")["action"] == "install Miniconda at /root/miniconda3"
        assert decision(plan, "env")["action"] == "create 'torch'"
        assert decision(plan, "torch")["action"] == "install torch 2.14.1+cu130"

        # bootstrap until the torch step starts installing (GBs of CUDA wheels), then stop
        since = mirror.log_offset()
        first = subprocess.Popen([sys.executable, "-m", "provision", "-H", info.inventory,
                                  "bootstrap"], cwd=tmp_path, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "GPU_PROVISION_HOME": str(gp_home),
                                      "COLUMNS": "200"})
        log = info.path("/root/.gpu-provision/logs/torch.log")
        deadline = time.monotonic() + 300
        while not (log.exists() and "pip install torch==2.14.1" in (text := log.read_text())
                   and "/root/miniconda3/envs/torch/bin/python" in text):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the torch step never reached the install"
            time.sleep(0.2)
        body = int(info.path("/root/.gpu-provision/steps/torch.pid").read_text().split()[0])
        first.kill()
        first.communicate()
        os.killpg(body, signal.SIGKILL)  # the detached body: its own session, still installing
        assert any("/miniconda/" in line for line, _ in mirror.requests(since))
        assert info.path("/root/miniconda3/envs/torch/bin/python").exists()
        assert platform_torch_files(info, "/usr/local") == before  # the image's: untouched
    finally:
        if first is not None and first.poll() is None:
            first.kill()
        harness.stop(info.id)
