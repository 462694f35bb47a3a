"""`verify` (the shipped testinfra suite), `validate` and `doctor` on a provisioned CPU-only
sandbox host; then torch is removed behind the tool's back and verify names that check."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import Hosts, gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox


def junit(path: Path) -> dict[str, str]:
    """test name -> passed | failed | skipped."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        out[case.get("name", "").split("[")[0]] = {"failure": "failed", "error": "failed"}.get(kind, kind)
    return out


def test_verify_validate_doctor_on_a_provisioned_host(hosts: Hosts, gp_home: Path,
                                                      tmp_path: Path) -> None:
    info = hosts.fresh("cpu-only")
    try:
        boot = gpu_provision("-H", info.inventory, "bootstrap", home=gp_home, cwd=tmp_path)
        assert boot.returncode == 0, boot.stdout + boot.stderr

        sessions = len(info.sessions())
        ok = gpu_provision("-H", info.inventory, "verify", "--junit", "v1.xml", home=gp_home,
                           cwd=tmp_path)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert f"verify: {info.id}: all checks passed (JUnit XML: v1.xml)" in ok.stdout
        assert junit(tmp_path / "v1.xml") == {
            "test_driver_loaded_as_recorded": "skipped", "test_gpus_as_expected": "skipped",
            "test_conda": "passed", "test_env_python": "passed",
            "test_torch_version_and_cuda_variant": "passed", "test_cuda_available": "skipped",
            "test_mirrors_configured": "passed", "test_driver_packages_held": "skipped",
            "test_no_stale_lock": "passed"}
        assert len(info.sessions()) > sessions  # it really ran on the host, over our connection
        assert "host key for" not in ok.stderr  # already pinned: the same known_hosts file

        v = gpu_provision("-H", info.inventory, "validate", home=gp_home, cwd=tmp_path)
        assert v.returncode == 0, v.stdout + v.stderr
        assert "(cpu mode, torch 2.13.0+cpu, CUDA None)" in v.stdout and "verdict: PASS" in v.stdout
        report = json.loads(sorted((tmp_path / "reports" / info.id).glob("validate-*.json"))[-1]
                            .read_text())
        assert report["schema"] == 2 and report["mode"] == "cpu"
        assert report["measurements"]["cpu_gflops"] > 0
        assert {c["name"] for c in report["checks"]} >= {"torch import", "cpu matmul", "cuda build",
                                                         "cpu cores", "memory", "free disk /root"}

        d = gpu_provision("-H", info.inventory, "doctor", home=gp_home, cwd=tmp_path)
        assert (d.returncode, d.stdout.strip()) == (0, f"doctor: {info.id}: no known problem found")

        env = "/root/miniconda3/envs/torch"
        harness.in_host(info, f"{env}/bin/python", "-m", "pip", "uninstall", "-y", "-q", "torch")
        bad = gpu_provision("-H", info.inventory, "verify", "--junit", "v2.xml", home=gp_home,
                            cwd=tmp_path)
        assert bad.returncode == 1
        assert f"verify: {info.id}: FAILED" in bad.stdout
        assert "FAILED" in bad.stdout and "test_torch_version_and_cuda_variant" in bad.stdout
        assert "No module named 'torch'" in bad.stdout
        results = junit(tmp_path / "v2.xml")
        assert [k for k, s in results.items() if s == "failed"] == ["test_torch_version_and_cuda_variant"]
    finally:
        harness.stop(info.id)
