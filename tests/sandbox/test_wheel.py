"""The wheel is the product: built from the checkout, installed into a clean venv with its
dependencies from the package index (as a user would: no checkout, no PYTHONPATH), and the
installed `gpu-provision` run from an unrelated folder against a CPU-only sandbox host: facts,
plan, verify without its extra (the message's own pip line then installs it), bootstrap (the real
CPU torch wheel from the local mirror), verify."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Hosts
from tests.sandbox import harness
from tests.wheel import ROOT, build_wheel

pytestmark = pytest.mark.sandbox


class Installed:
    """A clean venv holding the built wheel; runs its console script from ``cwd``."""

    def __init__(self, venv: Path, cwd: Path, home: Path) -> None:
        self.venv, self.cwd, self.home = venv, cwd, home
        self.python = venv / "bin" / "python"
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        self.env.update(GPU_PROVISION_HOME=str(home), COLUMNS="200",
                        PATH=f"{venv / 'bin'}{os.pathsep}{self.env.get('PATH', '')}")

    def run(self, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.venv / "bin" / "gpu-provision"), *args], cwd=self.cwd,
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def shell(self, line: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", line], cwd=self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """``hosts`` first: where sandbox hosts cannot run, skip before building anything."""
    work = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(work)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    started = time.monotonic()
    # pip's own cache (the user's) is kept: a second run installs from it
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                       cwd=work, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    print(f"wheel installed into a clean venv in {time.monotonic() - started:.1f} s")
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    home = work / "gp-home"
    home.mkdir()
    return Installed(venv, elsewhere, home)


def test_installed_wheel_runs_from_any_folder(installed: Installed, hosts: Hosts) -> None:
    where = installed.shell("python -c 'import provision, sys; print(provision.__file__); "
                            "print(sys.prefix)'")
    assert where.returncode == 0, where.stderr
    module, prefix = where.stdout.split()
    assert module.startswith(str(installed.venv)) and not module.startswith(str(ROOT))
    assert prefix == str(installed.venv)

    info = hosts.fresh("cpu-only")
    try:
        inv = info.inventory  # written by the harness, outside the checkout
        f = installed.run("-H", inv, "facts", "--json")
        assert f.returncode == 0, f.stdout + f.stderr
        facts = json.loads(f.stdout)
        assert (facts["os"]["id"], facts["os"]["version_id"]) == ("ubuntu", "24.04")
        assert facts["gpus"] == [] and facts["driver"] is None
        table = installed.run("-H", inv, "facts")
        assert table.returncode == 0, table.stderr
        assert f"facts: {info.id}" in table.stdout and "Ubuntu 24.04 LTS (apt)" in table.stdout
        assert "no NVIDIA driver installed (nvidia-smi not found)" in table.stdout

        p = installed.run("-H", inv, "plan")
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"plan: {info.id} (dry run: nothing was changed)" in p.stdout
        assert "install torch 2.13.0+cpu" in p.stdout
        assert "no NVIDIA GPU -> the CPU build" in p.stdout and "create 'torch'" in p.stdout

        # the default install has no pytest: verify says the one line that adds it, which works
        v = installed.run("-H", inv, "verify")
        assert v.returncode == 2  # an extra that is not installed: exit 2, as docs/commands.md says
        assert "error: pytest and testinfra are not installed (the 'verify' extra); install " \
            "with: " in v.stderr
        line = v.stderr.split("install with: ", 1)[1].strip()
        assert shlex.split(line) == [str(installed.python), "-m", "pip", "install",
                                     "gpu-provision[verify]"]
        extra = installed.shell(line + " -q")
        assert extra.returncode == 0, extra.stdout + extra.stderr

        b = installed.run("-H", inv, "bootstrap")
        assert b.returncode == 0, b.stdout + b.stderr
        assert "verdict: PASS" in b.stdout
        # logs and reports in our folder ($GPU_PROVISION_HOME here), none where it ran
        [report] = (installed.home / "reports" / info.id).glob("validate-*.json")
        assert json.loads(report.read_text())["torch"] == "2.13.0+cpu"
        assert not (installed.cwd / "reports").exists()
        [torch_log] = (installed.home / "logs" / info.id).glob("*/torch.log")
        assert " + torch==2.13.0+cpu\n" in torch_log.read_text()

        ok = installed.run("-H", inv, "verify", "--junit", "verify.xml")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert f"verify: {info.id}: all checks passed (JUnit XML: verify.xml)" in ok.stdout
        assert "passed" in ok.stdout and (installed.cwd / "verify.xml").is_file()
    finally:
        harness.stop(info.id)
