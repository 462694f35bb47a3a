"""pip for a venv over an image's python that has none (Debian's python3 without python3-pip):
the packages step's pip_ready (templates/setup/_pip_bootstrap.sh.j2), run for real on this
machine's python in a scratch venv, from a PEP 503 page on disk listing this machine's own pip
wheel: pip is installed into the venv from it; a page with no pip wheel for this python ends in
one line naming the index and the fix."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provision.remote.templating import render

BASE = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
FIX = "sudo apt-get install python3-pip (root's to run), or ask for an env of ours with a pip " \
      "of its own: --env-name NAME"


def _wheel() -> Path:
    """A pip wheel this machine has (its pip's local file index)."""
    for folder in (Path("/opt/pypi/files"), Path("/usr/share/python-wheels")):
        found = sorted(folder.glob("pip-*-py3-none-any.whl")) if folder.is_dir() else []
        if found:
            return found[-1]
    pytest.skip("no pip wheel on this machine")


def _ready(tmp_path: Path, page: str) -> subprocess.CompletedProcess[str]:
    venv = tmp_path / "venv"
    subprocess.run([BASE, "-m", "venv", "--without-pip", str(venv)], check=True)
    index = tmp_path / "simple/pip"
    index.mkdir(parents=True)
    (index / "index.html").write_text(page)
    script = ("set -euo pipefail\npy=" + str(venv / "bin/python") + "\ntmp=$(mktemp -d)\n"
              + render("setup/_pip_bootstrap.sh.j2", pip_fix=FIX, mirror_timeout=10)
              + f'\npip_ready "{index.as_uri()}/index.html"\n"$py" -m pip --version\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)


def test_pip_is_installed_into_the_venv_from_the_mirrors_wheel(tmp_path: Path) -> None:
    whl = _wheel()
    sha = hashlib.sha256(whl.read_bytes()).hexdigest()
    r = _ready(tmp_path, f'<a href="{whl.as_uri()}#sha256={sha}">{whl.name}</a>\n'
                         '<a href="file:///nowhere/pip-1.0.tar.gz">pip-1.0.tar.gz</a>\n')
    assert r.returncode == 0, r.stdout + r.stderr
    assert "has no pip module (nor has the image's python it runs): pip's wheel from" in r.stdout
    version = whl.name.split("-")[1]
    assert f"Successfully installed pip-{version}" in r.stdout
    assert f"pip {version} from {tmp_path}/venv/lib/" in r.stdout


def test_a_mirror_without_a_pip_wheel_for_this_python_ends_in_one_line(tmp_path: Path) -> None:
    r = _ready(tmp_path, '<a href="pip-99.0-py3-none-any.whl" data-requires-python="&gt;=3.99">'
                         'pip-99.0-py3-none-any.whl</a>\n')
    assert r.returncode == 1
    index = (tmp_path / "simple/pip/index.html").as_uri()
    assert r.stderr.strip().splitlines() == [
        f"{index} lists no pip wheel for python {sys.version_info[0]}.{sys.version_info[1]}",
        f"no pip for {tmp_path}/venv/bin/python, and none could be had from {index}: {FIX}"]
    assert not list((tmp_path / "venv/lib").glob("*/site-packages/pip"))
