"""The venv of ours over an image's system python (templates/setup/view.sh.j2), run for real on
this machine's own python3 in a scratch home: it is a venv that sees the python's site-packages,
made again over another python, and it says in one line when that python has no torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from provision.remote.templating import render

# the interpreter itself (not a shim script, not this suite's venv): what an image's python3.X is
BASE = os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def run_view(home: Path, base: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", render("setup/view.sh.j2", base=base, site="", pth="x.pth", torch_dir="")],
                          env={**os.environ, "HOME": str(home)}, capture_output=True, text=True)


def test_a_python_without_torch_is_refused_in_one_line(tmp_path: Path) -> None:
    seen = subprocess.run([BASE, "-c", "import importlib.util as u; print(u.find_spec('torch'))"],
                          capture_output=True, text=True).stdout.strip()
    if seen != "None":
        pytest.skip(f"{BASE} has a torch of its own")
    r = run_view(tmp_path, BASE)
    assert r.returncode == 1
    assert r.stderr.strip() == "the image's torch is not visible from the venv"
    cfg = (tmp_path / ".gpu-provision/venv/pyvenv.cfg").read_text()
    assert "include-system-site-packages = true" in cfg  # it sees the image's packages
    assert not list((tmp_path / ".gpu-provision/venv/bin").glob("pip*"))  # none of its own


def test_the_venv_sees_the_pythons_packages_and_is_made_again(tmp_path: Path) -> None:
    """A ``torch`` package on the base python's path stands for the image's torch: the venv's
    python finds it without importing it, and runs the base's interpreter."""
    view = tmp_path / ".gpu-provision/venv"
    (view / "stale").mkdir(parents=True)  # a half-made one, or one over another python
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch/__init__.py").write_text("")
    r = subprocess.run(["bash", "-c", render("setup/view.sh.j2", base=BASE, site="", pth="x.pth", torch_dir="")],
                       env={**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(site)},
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"torch from {site}/torch/__init__.py"
    assert not (view / "stale").exists()
    real = subprocess.run([view / "bin/python", "-c", "import os, sys; "
                           "print(os.path.realpath(sys.executable))"], capture_output=True,
                          text=True).stdout.strip()
    assert real == os.path.realpath(BASE)


def test_a_user_site_torch_is_the_one_the_venv_imports_whatever_pythonuserbase_says(
        tmp_path: Path) -> None:
    """A torch installed with pip --user under $PYTHONUSERBASE (a ``torch`` package in that user
    site stands for it): the venv names the site in its .pth, so its python imports that torch
    with PYTHONUSERBASE unset (a job's environment) and with user sites off; the view checks the
    torch it sees is that one, and says in one line when another one shadows it."""
    site = tmp_path / "pyuser/lib/site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch/__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONUSERBASE", "PYTHONPATH")}
    script = render("setup/view.sh.j2", base=BASE, site=str(site), pth="_image_user_site.pth",
                    torch_dir=str(site / "torch"))
    r = subprocess.run(["bash", "-c", script], env={**env, "HOME": str(tmp_path)},
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"torch from {site}/torch/__init__.py"
    python = tmp_path / ".gpu-provision/venv/bin/python"
    for extra in ({}, {"PYTHONNOUSERSITE": "1"}):
        seen = subprocess.run([python, "-c", "import torch; print(torch.__file__)"],
                              env={**env, **extra}, capture_output=True, text=True)
        assert seen.stdout.strip() == f"{site}/torch/__init__.py", seen.stderr
    # another torch first on the path (PYTHONPATH here; a torch of the venv's own in a job) is
    # not the one the plan judged: the view says so instead of passing
    other = tmp_path / "other"
    (other / "torch").mkdir(parents=True)
    (other / "torch/__init__.py").write_text("")
    r = subprocess.run(["bash", "-c", script], env={**env, "HOME": str(tmp_path),
                                                    "PYTHONPATH": str(other)},
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"the venv imports torch from {other}/torch/__init__.py, not "
                                f"the image's in {site}/torch")
