"""The installer of the torch and packages steps on real sandbox hosts: our pinned uv from the
PyPI mirror, which never takes torch from that mirror, not even when it serves a same-named torch
of a higher version and the host's own uv settings name it first; and pip, saying why, when the
mirror has no uv or alters it on the way."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from provision.ops.installer import load_uv
from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness, mirror
from tests.sandbox.wheels import build_wheel

pytestmark = pytest.mark.sandbox

UV = load_uv()
TOOLS = "/root/.gpu-provision/tools"
FAKE = "raise ImportError('a fake torch, from the PyPI mirror')\n"


def fake_wheels(dest: Path) -> list[Path]:
    """Two fake torch releases, both higher than the CPU build the PyTorch index serves
    (2.13.0+cpu): 99.0.0, and 2.13.0+zzfake, which a pin ``torch==2.13.0`` also allows; and a
    package that needs torch."""
    out = [build_wheel(dest, "torch", v, {"torch/__init__.py": FAKE,
                                          "torch/version.py": f"__version__ = '{v}'\ncuda = None\n"})
           for v in ("99.0.0", "2.13.0+zzfake")]
    out.append(build_wheel(dest, "needs-torch", "1.0", {"needs_torch/__init__.py": "import torch\n"},
                           requires=["torch>=2"]))
    return out


def with_pypi(info: harness.HostInfo, dest: Path, pypi: str, **changes: object) -> str:
    inv = yaml.safe_load(Path(info.inventory).read_text())
    return info.inventory_with(dest, mirrors={**inv["mirrors"], "pypi": pypi}, **changes)


def decision(plan_stdout: str, step: str) -> dict[str, str]:
    return next(d for d in json.loads(plan_stdout)["decisions"] if d["step"] == step)


def torch_env(info: harness.HostInfo, home: Path) -> tuple[dict[str, object], dict[str, object]]:
    f = facts_json(info, home)
    return f, {e["name"]: e for e in f["envs"]}["torch"]


def test_uv_never_takes_torch_from_the_pypi_mirror(hosts: Hosts, gp_home: Path,
                                                   tmp_path: Path) -> None:
    pypi = mirror.overlay("fake-torch", wheels=fake_wheels(tmp_path / "wheels"))
    info = hosts.fresh("cpu-only")
    try:
        inv = with_pypi(info, tmp_path / "fake-torch.yaml", pypi, packages=["needs-torch"])
        # the image's own uv settings name that mirror as an extra index (which uv searches
        # BEFORE --index-url) and take the highest version across indexes
        conf = info.path("/root/.config/uv/uv.toml")
        conf.parent.mkdir(parents=True)
        conf.write_text(f'extra-index-url = ["{pypi}"]\nindex-strategy = "unsafe-best-match"\n')

        plan = gpu_provision("-H", inv, "plan", "--json", home=gp_home)
        assert plan.returncode == 0, plan.stderr
        installer = decision(plan.stdout, "installer")
        assert installer["action"] == f"use uv {UV.version} (or pip where the mirror has no uv)"
        assert installer["reason"].startswith(f"torch and packages install with uv {UV.version}: "
                                              f"parallel downloads; fetched from the PyPI mirror "
                                              f"{pypi} into ~/.gpu-provision/tools/uv-{UV.version}")

        since = mirror.log_offset()
        r = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "verdict: PASS" in r.stdout

        torch_log = info.path("/root/.gpu-provision/logs/torch.log").read_text()
        assert f"installer: uv {UV.version}, fetched into {TOOLS}/uv-{UV.version}" in torch_log
        assert f"sha256 ok: {UV.wheels['x86_64'].sha256}" in torch_log
        index = f"{info.mirror['pytorch']}/cpu"
        assert (f"{TOOLS}/uv-{UV.version}/uv pip install torch==2.13.0 --index-url {index}/ "
                "--python /root/miniconda3/envs/torch/bin/python\n") in torch_log
        assert " + torch==2.13.0+cpu\n" in torch_log
        assert ('imported torch: {"version": "2.13.0+cpu", "cuda": null, "index": "'
                f'{index}", "note": ""}}') in torch_log
        assert re.search(r"^received \d+ MiB in \d+\.\ds \(\d+\.\d MiB/s\)$", torch_log, re.MULTILINE)
        packages_log = info.path("/root/.gpu-provision/logs/packages.log").read_text()
        assert f"installer: uv {UV.version} ({TOOLS}/uv-{UV.version}/uv)" in packages_log
        assert " + needs-torch==1.0\n" in packages_log  # and torch left as it was:
        assert " - torch==" not in packages_log and " + torch==" not in packages_log

        f, env = torch_env(info, gp_home)
        assert env["torch"] == "2.13.0+cpu"
        assert f["uv_versions"] == [UV.version]
        assert f["torch_installers"] == {env["prefix"]: ["uv"]}
        # the fake torch was never fetched, not even to read its metadata; the package was
        fetched = [line for line, _ in mirror.requests(since) if "/overlay/fake-torch/files/" in line]
        assert fetched and all("/needs_torch-1.0-" in line for line in fetched), fetched
    finally:
        harness.stop(info.id)


def test_pip_installs_when_the_mirror_has_no_uv_or_alters_it(hosts: Hosts, gp_home: Path,
                                                              tmp_path: Path) -> None:
    no_uv = mirror.overlay("no-uv", hide=["uv"])
    info = hosts.fresh("cpu-only")
    try:
        inv = with_pypi(info, tmp_path / "no-uv.yaml", no_uv)
        r = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "verdict: PASS" in r.stdout
        torch_log = info.path("/root/.gpu-provision/logs/torch.log").read_text()
        assert (f"installer: pip, as uv {UV.version} cannot be had: no PyPI mirror has it: "
                f"{no_uv} (HTTP 404);\n") in torch_log
        assert (f"/root/miniconda3/envs/torch/bin/python -m pip install torch==2.13.0 "
                f"--index-url {info.mirror['pytorch']}/cpu/\n") in torch_log
        assert re.search(r"^Successfully installed .*torch-2\.13\.0\+cpu", torch_log, re.MULTILINE)
        assert re.search(r"^received \d+ MiB in \d+\.\ds", torch_log, re.MULTILINE)
        f, env = torch_env(info, gp_home)
        assert env["torch"] == "2.13.0+cpu"
        assert f["torch_installers"] == {env["prefix"]: ["pip"]}
        assert f["uv_versions"] == [] and list(info.path(TOOLS).iterdir()) == []

        # a mirror that alters uv on the way (under its genuine sha256): refused, pip installs
        tampered = mirror.overlay("tampered-uv", tamper=["uv"])
        inv = with_pypi(info, tmp_path / "tampered.yaml", tampered, packages=["six"])
        r = gpu_provision("-H", inv, "torch", home=gp_home, cwd=tmp_path, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        log = info.path("/root/.gpu-provision/logs/packages.log").read_text()
        wheel = UV.wheels["x86_64"]
        assert (f"installer: pip, as uv {UV.version} cannot be had: sha256 mismatch for "
                f"{wheel.file} from {tampered}: expected {wheel.sha256}, got ") in log
        assert re.search(r"^Successfully installed six-", log, re.MULTILINE)
        assert list(info.path(TOOLS).iterdir()) == []  # nothing unpacked, nothing left over
    finally:
        harness.stop(info.id)
