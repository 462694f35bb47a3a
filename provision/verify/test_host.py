"""A provisioned host, checked from outside: driver, GPUs, conda, the env, torch, mirrors, held
driver packages, no stale lock. Each test's name says what failed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from testinfra.host import Host

from provision.remote.contract import CONTRACT
from provision.verify.conftest import run_json


def test_driver_loaded_as_recorded(host: Host, expected: dict[str, Any]) -> None:
    if not expected["gpus"]:
        pytest.skip("no NVIDIA GPU on this host")
    r = host.run("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert r.rc == 0, f"nvidia-smi failed: {(r.stdout + r.stderr).strip()[:300]}"
    versions = {v.strip() for v in r.stdout.splitlines() if v.strip()}
    assert versions == {expected["driver"]}, f"driver {versions}, bootstrap recorded {expected['driver']}"


def test_gpus_as_expected(host: Host, expected: dict[str, Any]) -> None:
    if not expected["gpus"]:
        pytest.skip("no NVIDIA GPU on this host")
    r = host.run("nvidia-smi --query-gpu=name --format=csv,noheader")
    assert [n.strip() for n in r.stdout.splitlines() if n.strip()] == expected["gpus"]


def test_conda(host: Host, expected: dict[str, Any]) -> None:
    if not expected["conda_root"]:
        pytest.skip(f"no conda: the env is the image's python ({expected['env_prefix']})")
    conda = host.file(f"{expected['conda_root']}/bin/conda")
    assert conda.exists and conda.mode & 0o111, f"no conda at {expected['conda_root']}"
    assert host.run(f"{conda.path} --version").rc == 0


def test_env_python(host: Host, expected: dict[str, Any]) -> None:
    py = f"{expected['env_prefix']}/bin/python"
    assert host.file(py).exists, f"the env {expected['env_prefix']} has no python"
    if expected.get("base_python"):  # a venv over the image's python: it runs that interpreter
        real = host.check_output(f"{py} -c 'import os, sys; print(os.path.realpath(sys.executable))'")
        base = host.check_output(f"readlink -f {expected['base_python']}")
        assert real == base, f"{py} runs {real}, not the image's {expected['base_python']}"
    if expected["python"]:
        version = host.check_output(f"{py} -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'")
        assert version == expected["python"]


def test_torch_version_and_cuda_variant(host: Host, expected: dict[str, Any]) -> None:
    got = run_json(host, f"{expected['env_prefix']}/bin/python -c 'import json, torch; "
                         "print(json.dumps([torch.__version__, torch.version.cuda]))'")
    assert got[0].split("+")[0] == expected["torch"], f"torch {got[0]}, expected {expected['torch']}"
    assert got[1] == expected["torch_cuda"], f"CUDA {got[1]}, expected {expected['torch_cuda']}"


def test_cuda_available(host: Host, expected: dict[str, Any]) -> None:
    if not expected["gpus"]:
        pytest.skip("no NVIDIA GPU on this host")
    got = run_json(host, f"{expected['env_prefix']}/bin/python -c 'import json, torch; "
                         "print(json.dumps([torch.cuda.is_available(), torch.cuda.device_count()]))'")
    assert got == [True, len(expected["gpus"])], f"is_available, device_count = {got}"


def test_mirrors_configured(host: Host, expected: dict[str, Any]) -> None:
    if expected["conda_channels"] is None:
        pytest.skip("conda is the platform's: its .condarc is left as it was")
    condarc = host.file(host.check_output("echo $HOME") + "/.condarc")
    assert condarc.exists, "no ~/.condarc"
    for channel in expected["conda_channels"]:
        assert channel in condarc.content_string, f"{channel} missing from ~/.condarc"
    assert "defaults" not in condarc.content_string
    if expected["pypi"]:
        pip = host.run("cat ~/.config/pip/pip.conf").stdout
        assert any(f"index-url = {u.rstrip('/')}" in pip for u in expected["pypi"]), pip


def test_driver_packages_held(host: Host) -> None:
    entry = host.run(f"cat ~/{CONTRACT.steps}/driver-hold.json")
    if entry.rc != 0:
        pytest.skip("the driver was not installed by gpu-provision: nothing of ours to hold")
    assert json.loads(entry.stdout)["result"] == "ok"
    r = host.run("apt-mark showhold 2>/dev/null || yum versionlock list 2>/dev/null || "
                 "dnf versionlock list")
    assert "nvidia" in r.stdout, f"no held nvidia package: {r.stdout.strip()[:300]}"


def test_no_stale_lock(host: Host) -> None:
    r = host.run(f'st="$HOME/{CONTRACT.state}"; ' 'for l in "$st"/locks/*; do case $l in *.owner) '
                 'continue;; esac; [ -f "$l" ] && { flock -n "$l" true || echo "lock $(basename '
                 '"$l") held: $(cat "$l.owner")"; }; done; for p in "$st"/steps/*.pid; do '
                 '[ -f "$p" ] && echo "step left unfinished: $(basename "$p" .pid)"; done; true')
    problems = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert not problems, "; ".join(problems)
