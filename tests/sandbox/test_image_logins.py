"""Every image's stack, as logins without sudo and bare images meet it: a torch an account put in
its user site with `pip install --user` (~/.local, or wherever $PYTHONUSERBASE points) is the
system python's and is used as it is, jobs importing that very torch; an env of ours never goes
into a conda the login cannot write to (an image's /opt/conda made by root); a system python
without pip gets pip's own wheel into our venv before the recipe's packages; an image's venv that
sees the system python's torch (--system-site-packages) is used as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness, mirror
from tests.sandbox.platform_env import platform_torch_files
from tests.sandbox.test_image_pythons import (
    WHICH,
    decision,
    decisions,
    job_output,
    not_downloaded,
    plan_json,
    report_of,
    unshared,
)
from tests.sandbox.test_installer import fake_wheels, with_pypi

pytestmark = pytest.mark.sandbox

HOME = "/home/alice"
VIEW = f"{HOME}/.gpu-provision/venv"


def there(info: harness.HostInfo, path: str) -> bool:
    """As the host sees it (a file the image left out is an overlay whiteout on this side)."""
    return harness.in_host(info, "test", "-e", path, check=False).returncode == 0


def test_a_user_site_torch_of_a_login_without_sudo(hosts: Hosts, gp_home: Path,
                                                   tmp_path: Path) -> None:
    info = hosts.fresh("lab-user-site-torch")
    site = f"{HOME}/.local/lib/python3.11/site-packages"
    try:
        f = facts_json(info, gp_home)
        assert (f["root"], f["sudo"], f["login"]) == (False, False, "alice")
        assert f["conda_readonly"] == ["/opt/conda"]  # root's, as the image made it
        before = platform_torch_files(info, f"{HOME}/.local")
        assert "torch/version.py" in before
        plan = plan_json(info.inventory, gp_home)
        assert [d["reason"] for d in decisions(plan, "image")] == [
            f"{site} (pip --user, read by the system python 3.11 /usr/bin/python3.11) has torch "
            "2.13.0+cpu, which passes the rule (no NVIDIA GPU: any build runs): used as it is, "
            "nothing downloaded"]
        assert decision(plan, "env")["action"] == \
            "make ~/.gpu-provision/venv over /usr/bin/python3.11"

        inv = unshared(info.inventory_with(tmp_path / "inv" / f"{info.id}.yaml"), info)
        since = mirror.log_offset()
        r = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, timeout=600)
        assert r.returncode == 0 and "verdict: PASS" in r.stdout, r.stdout + r.stderr
        not_downloaded(since, info)
        assert platform_torch_files(info, f"{HOME}/.local") == before  # not touched
        report = report_of(tmp_path, info.id)
        assert (report["python"], report["torch_file"]) == (
            f"{VIEW}/bin/python", f"{site}/torch/__init__.py")
        assert job_output(info, gp_home, "which", "python", "-c", WHICH) == [
            f"{site}/torch/__init__.py", f"{VIEW}/bin/python"]

        # the same torch moved under $PYTHONUSERBASE, which the login's ~/.bashrc sets (as lab
        # accounts with a small home do): found there, and named in the venv's .pth, so a job
        # whose environment lacks PYTHONUSERBASE still imports it
        moved = f"{HOME}/pyuser"
        info.path(f"{HOME}/.local").rename(info.path(moved))
        bashrc = info.path(f"{HOME}/.bashrc")
        bashrc.write_text(f"export PYTHONUSERBASE={moved}\n")
        harness.in_host(info, "chown", "2002:2002", f"{HOME}/.bashrc")
        site = f"{moved}/lib/python3.11/site-packages"
        plan = plan_json(info.inventory, gp_home)
        assert [d["reason"] for d in decisions(plan, "image")][0].startswith(
            f"{site} (pip --user, read by the system python 3.11 /usr/bin/python3.11) has torch "
            "2.13.0+cpu, which passes the rule")
        env = decision(plan, "env")
        assert env["action"] == "make ~/.gpu-provision/venv over /usr/bin/python3.11"
        assert f"its user site {site} (pip --user) is named in the venv's _image_user_site.pth" \
            in env["reason"] and env["reason"].endswith("names another user site: made again")
        r = gpu_provision("-H", info.inventory, "env", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert job_output(info, gp_home, "nobase", "env", "-u", "PYTHONUSERBASE", "python", "-c",
                          WHICH) == [f"{site}/torch/__init__.py", f"{VIEW}/bin/python"]
        assert plan_json(info.inventory, gp_home)["changes"] == []

        # an env of ours asked for: the image's /opt/conda is root's, so ours goes into a
        # Miniconda in the home, and /opt/conda stays as it is
        conda_before = sorted(p.name for p in info.path("/opt/conda/envs").iterdir())
        inv = info.inventory_with(tmp_path / "inv" / "mine.yaml", env_name="mine")
        plan = plan_json(inv, gp_home)
        conda = decision(plan, "conda")
        assert conda["action"] == f"install Miniconda at {HOME}/miniconda3"
        assert conda["reason"].startswith(
            "the conda at /opt/conda is not writable by the login alice, so an env of ours "
            "cannot go there (it is left as it is): one of ours in the home")
        assert decision(plan, "env")["action"] == "create 'mine'"
        for task in ("conda", "env"):
            r = gpu_provision("-H", inv, task, home=gp_home, cwd=tmp_path, timeout=600)
            assert r.returncode == 0, r.stdout + r.stderr
        assert info.path(f"{HOME}/miniconda3/envs/mine/bin/python").exists()
        assert info.path(f"{HOME}/miniconda3/envs/mine").stat().st_uid == 2002
        assert sorted(p.name for p in info.path("/opt/conda/envs").iterdir()) == conda_before
    finally:
        harness.stop(info.id)


def test_a_system_python_without_pip_and_an_image_venv_over_it(hosts: Hosts, gp_home: Path,
                                                                tmp_path: Path) -> None:
    info = hosts.fresh("image-system-torch-no-pip")
    try:
        assert not there(info, "/usr/lib/python3/dist-packages/pip")
        pypi = mirror.overlay("image-no-pip", wheels=fake_wheels(tmp_path / "wheels"))
        inv = with_pypi(info, tmp_path / "inv" / "box.yaml", pypi, packages=["needs-torch"])
        plan = plan_json(inv, gp_home)
        assert decision(plan, "packages")["reason"].endswith(
            "torch pinned; /usr/bin/python3.11 has no pip module: pip's own wheel from the PyPI "
            "mirror is installed into the venv first (no root needed)")
        r = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, timeout=600)
        assert r.returncode == 0 and "verdict: PASS" in r.stdout, r.stdout + r.stderr
        packages = info.path("/root/.gpu-provision/logs/packages.log").read_text()
        assert "/root/.gpu-provision/venv/bin/python has no pip module (nor has the image's " \
               "python it runs): pip's wheel from" in packages, packages
        assert "Requirement already satisfied: torch>=2 in /usr/local/lib/python3.11/" \
               "dist-packages" in packages, packages
        assert "Successfully installed needs-torch-1.0" in packages
        venv_site = info.path("/root/.gpu-provision/venv/lib/python3.11/site-packages")
        assert (venv_site / "pip").is_dir() and (venv_site / "needs_torch").is_dir()
        assert not list(venv_site.glob("torch*"))
        assert not there(info, "/usr/lib/python3/dist-packages/pip")  # the image's: as it was

        # the image's own venv over the same python, made with --system-site-packages and no
        # torch of its own: it carries the system torch and is used as it is
        harness.in_host(info, "/usr/bin/python3.11", "-m", "venv", "--without-pip",
                        "--system-site-packages", "/opt/venv")
        plan = plan_json(info.inventory, gp_home)
        assert [d["reason"] for d in decisions(plan, "image")][-1] == (
            "/opt/venv (a venv in the image over /usr/bin/python3.11, whose torch it sees: "
            "--system-site-packages, python 3.11) has torch 2.13.0+cpu, which passes the rule "
            "(no NVIDIA GPU: any build runs): used as it is, nothing downloaded")
        assert decision(plan, "env")["reason"] == \
            "use the image's venv /opt/venv as it is (python 3.11, torch 2.13.0+cpu)"
        r = gpu_provision("-H", info.inventory, "validate", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        reports = sorted((tmp_path / "reports" / info.id).glob("validate-*.json"))
        last = json.loads(reports[-1].read_text())
        assert (last["python"], last["torch_file"]) == (
            "/opt/venv/bin/python", "/usr/local/lib/python3.11/dist-packages/torch/__init__.py")
    finally:
        harness.stop(info.id)
