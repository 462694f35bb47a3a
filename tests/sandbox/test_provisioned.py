"""On one provisioned CPU-only sandbox host: `verify` (the shipped testinfra suite), `validate`,
`doctor`, `fit --measure` (which needs a GPU), `bench`, then `compare` with two published
reports and its page in headless Chromium; last, torch is removed behind the tool's back and
verify names that check."""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import ROOT, Hosts, gpu_provision
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
        (tmp_path / "inventories").mkdir()
        inv = info.inventory_with(tmp_path / "inventories" / "cpu-box.yaml", price_per_hour=0.12,
                                  currency="USD", platform="generic-vm")
        boot = gpu_provision("-H", info.inventory, "bootstrap", "--json", home=gp_home,
                             cwd=tmp_path)
        assert boot.returncode == 0, boot.stdout + boot.stderr
        done = json.loads(boot.stdout)  # only JSON on stdout; the progress went to stderr
        assert done["host"] == info.id and done["verdict"] == "PASS"
        changed = {x["step"]: x["changed"] for x in done["steps"]}
        assert all(changed[k] for k in ("conda", "env", "torch", "validate")), changed
        assert all(x["seconds"] >= 0 for x in done["steps"]) and done["seconds"] > 0
        assert done["validation"]["verdict"] == "PASS" and done["report"].endswith(".json")
        assert "conda: done in" in boot.stderr
        again = json.loads(gpu_provision("-H", info.inventory, "bootstrap", "--json",
                                         home=gp_home, cwd=tmp_path).stdout)
        assert not any(x["changed"] for x in again["steps"]) and again["executions"] == 1

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
        # every command of the suite went through the executor: in the run's log, as a step's
        logged = [q.read_text() for q in (tmp_path / "logs").glob(f"{info.id}/*/verify.log")]
        assert any("cat ~/.gpu-provision/expected.json" in x for x in logged), logged
        assert "host key for" not in ok.stderr  # already pinned: the same known_hosts file
        # the same suite afresh (--no-keep; the run above went through the kept connection)
        fresh = gpu_provision("-H", info.inventory, "--no-keep", "verify", "--junit", "v2.xml",
                              home=gp_home, cwd=tmp_path)
        assert fresh.returncode == 0, fresh.stdout + fresh.stderr
        assert f"verify: {info.id}: all checks passed (JUnit XML: v2.xml)" in fresh.stdout
        assert junit(tmp_path / "v2.xml") == junit(tmp_path / "v1.xml")

        v = gpu_provision("-H", info.inventory, "validate", home=gp_home, cwd=tmp_path)
        assert v.returncode == 0, v.stdout + v.stderr
        assert "(cpu mode, torch 2.13.0+cpu, CUDA None)" in v.stdout and "verdict: PASS" in v.stdout
        vj = gpu_provision("-H", info.inventory, "validate", "--json", home=gp_home, cwd=tmp_path)
        assert vj.returncode == 0, vj.stderr
        validated = json.loads(vj.stdout)
        assert [(x["step"], x["changed"]) for x in validated["steps"]] == [("validate", True)]
        assert validated["verdict"] == validated["validation"]["verdict"] == "PASS"
        report = json.loads(sorted((tmp_path / "reports" / info.id).glob("validate-*.json"))[-1]
                            .read_text())
        assert report["schema"] == 3 and report["mode"] == "cpu"
        assert report["measurements"]["cpu_gflops"] > 0
        assert {c["name"] for c in report["checks"]} >= {"torch import", "cpu matmul", "cuda build",
                                                         "cpu cores", "memory", "free disk /root"}

        d = gpu_provision("-H", info.inventory, "doctor", home=gp_home, cwd=tmp_path)
        assert (d.returncode, d.stdout.strip()) == (0, f"doctor: {info.id}: no known problem found")

        # fit --measure on a host without a GPU: said in one line, nothing run
        m = gpu_provision("-H", info.inventory, "fit", "--model", "qwen2.5-7b", "--method",
                          "qlora", "--measure", "--", "python", "train.py", "--batch-size",
                          "{batch}", home=gp_home, cwd=tmp_path)
        assert m.returncode == 1 and m.stdout == "", m.stdout + m.stderr
        assert m.stderr.strip().endswith("fit --measure needs a GPU and nvidia-smi sees none on "
                                         "this host; without one, `gpu-provision fit` (no -H) "
                                         "estimates the memory offline"), m.stderr
        assert not (tmp_path / "logs" / info.id).exists() or not any(
            p.name.startswith("measure") for p in (tmp_path / "logs" / info.id).rglob("*"))
        afresh = gpu_provision("-H", info.inventory, "--no-keep", "fit", "--model", "qwen2.5-7b",
                               "--method", "qlora", "--measure", "--", "python", "train.py",
                               "--batch-size", "{batch}", home=gp_home, cwd=tmp_path)
        assert (afresh.returncode, afresh.stderr.strip().splitlines()[-1]) == \
            (1, m.stderr.strip().splitlines()[-1])

        bench_and_compare(info, inv, gp_home, tmp_path)

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


BAR = (0x2F, 0x6D, 0xB5)  # provision.chart.BAR


def bench_and_compare(info: harness.HostInfo, inv: str, gp_home: Path, tmp_path: Path) -> None:
    b = gpu_provision("-H", inv, "bench", "--download-mb", "5", home=gp_home, cwd=tmp_path)
    assert b.returncode == 0, b.stdout + b.stderr
    assert "bench: cpu-box (cpu mode, torch 2.13.0+cpu)" in b.stdout
    [path] = (tmp_path / "reports" / "cpu-box").glob("bench-*.json")
    r = json.loads(path.read_text())
    assert r["mode"] == "cpu" and "no usable GPU: the torch figures are the CPU's" in r["notes"]
    for key in ("train_samples_s", "infer_ms_b1", "infer_ms_b32", "disk_write_mbs",
                "disk_read_mbs", "cpu_single_score"):
        assert isinstance(r[key], (int, float)) and r[key] > 0, key
    assert r["tflops"]["fp32"] > 0 and r["cpu_cores"] >= 1
    kinds = {d["kind"]: d for d in r["downloads"]}
    assert set(kinds) == {"miniconda", "pypi", "pytorch"}
    assert kinds["pytorch"]["url"].endswith(".whl") and 4 <= kinds["pytorch"]["mb"] <= 5.3
    assert all(d["error"] is None and d["mbs"] > 0 for d in r["downloads"])
    assert (r["price_per_hour"], r["currency"]) == (0.12, "USD")

    for f in (ROOT / "bench" / "published").glob("*.json"):
        shutil.copy(f, tmp_path / "reports" / f.name)
    c = gpu_provision("compare", "--report", "reports/cpu-box/bench-*.json", "--report",
                      "reports/lambda-*.json", home=gp_home, cwd=tmp_path)
    assert c.returncode == 0, c.stdout + c.stderr
    lines = [ln for ln in c.stdout.splitlines() if "│" in ln]
    hosts = [ln.split("│")[1].strip() for ln in lines]  # data rows (the header uses ┃)
    assert hosts[0] == "cpu-box"  # the only host with a training figure comes first
    assert {"lambda-h100-sxm (published)", "lambda-a100-40gb (published)"} <= set(hosts)
    assert "note: lambda-h100-sxm: datasheet peak TFLOPS and Lambda 1x H100 SXM $4.29/h" in c.stdout
    page = tmp_path / "reports" / "compare.html"
    assert page.exists() and (tmp_path / "reports" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    rendered(page, tmp_path)


def rendered(page: Path, tmp_path: Path) -> None:
    """Headless Chromium opens the page: the chart's SVG is in the DOM and its bars are on screen."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (make test installs it with apt)")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'chromium'}"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert "<svg" in dom.stdout and "cost per TFLOP-hour" in dom.stdout, dom.stderr[-2000:]
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1400,1600", page.as_uri()],
                   capture_output=True, timeout=120)
    from PIL import Image
    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 24) or []
    bar = sum(n for n, rgb in colours if all(abs(a - b) <= 8 for a, b in zip(rgb, BAR, strict=True)))
    assert bar > 500, f"{bar} pixels of the bar colour on screen: the chart did not render"
