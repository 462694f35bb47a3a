"""What a rental image leaves in the platform's env before we arrive: a torch, really installed
from the local mirror where this machine has the wheel, else replayed from a captured real
``torch/version.py`` (all the facts read of it) where it has not (an old CUDA build).

Profile key ``platform_torch``: ``{wheel: "torch==2.13.0", variant: cpu}`` or
``{version_py: torch/version-py-2.2.1-cu121.txt}`` (a file under tests/fixtures).

Profile key ``image_torch``: what an image's build left outside the platform's env, the same
torch specs, each with where: ``{conda_env: pytorch, ...}`` (a named env of the conda at
``conda_prefix``, made by that conda), ``{system: /usr/bin/python3.11, ...}`` (pip into the
system python as root, as RunPod-style Dockerfiles run it: Debian's pip puts it in
/usr/local/lib/python3.X/dist-packages) or ``{user_site: /usr/bin/python3.11, ...}`` (``pip
install --user`` as the profile's login, as an account without sudo on a lab server runs it: into
~/.local/lib/python3.X/site-packages, owned by that login).

Profile key ``image_removes``: paths the image's build left out, removed after the torches went
in (Debian's pip and ensurepip: a python3 without python3-pip and python3.X-venv).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .harness import FIXTURES, HostInfo, in_host

CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def install_platform_torch(info: HostInfo, prefix: str, spec: dict[str, Any],
                           python: str | None = None) -> None:
    """``python``: the interpreter to install with (default: the env's at ``prefix``)."""
    python = python or f"{prefix}/bin/python"
    if spec.get("wheel"):
        # pip as the platform's image build ran it; this machine's pip settings stay outside.
        # A Debian 12 python is "externally managed" (PEP 668): an image build that pip-installs
        # into it passes --break-system-packages, as pip's docs name the override
        system = ["--break-system-packages"] if not python.startswith(prefix + "/") else []
        in_host(info, "env", "-i", f"PATH={CLEAN_PATH}", "HOME=/root", python, "-m", "pip",
                "install", "--no-input", "--progress-bar", "off", "--disable-pip-version-check",
                *system, "--index-url", f"{info.mirror['pytorch']}/{spec.get('variant', 'cpu')}/",
                spec["wheel"])
        return
    text = (FIXTURES / spec["version_py"]).read_text()
    version = re.search(r"__version__ = '([^']+)'", text)
    assert version, f"{spec['version_py']} holds no __version__"
    site = in_host(info, python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"
                   ).stdout.strip()
    torch_dir = info.path(f"{site}/torch")
    torch_dir.mkdir(parents=True, exist_ok=True)
    (torch_dir / "version.py").write_text(text)
    dist = info.path(f"{site}/torch-{version.group(1)}.dist-info")
    dist.mkdir(exist_ok=True)
    (dist / "INSTALLER").write_text("pip\n")  # what pip writes there


def platform_torch_files(info: HostInfo, prefix: str) -> dict[str, int]:
    """Every file of the platform env's torch with its mtime, to show it was left alone."""
    found = {}
    for site in Path(info.path(prefix)).glob("lib/python3.*/*-packages"):
        for f in [*site.glob("torch/*.py"), *site.glob("torch-*.dist-info/*")]:
            found[str(f.relative_to(site))] = f.stat().st_mtime_ns
    return found


def install_image_torch(info: HostInfo, conda_prefix: str | None, spec: dict[str, Any]) -> str:
    """One ``image_torch`` entry (see the module's docstring); returns the site-packages' prefix
    whose torch files ``platform_torch_files`` lists."""
    if spec.get("conda_env"):
        assert conda_prefix, "a conda_env needs the profile's conda_prefix"
        prefix = f"{conda_prefix}/envs/{spec['conda_env']}"
        in_host(info, "env", "-i", f"PATH={CLEAN_PATH}", "HOME=/root", f"{conda_prefix}/bin/conda",
                "create", "-y", "-n", spec["conda_env"], "python")
        install_platform_torch(info, prefix, spec)
        return prefix
    if spec.get("user_site"):
        return install_user_torch(info, spec)
    python = spec["system"]
    install_platform_torch(info, "/usr/local", spec, python=python)
    return "/usr/local"


def install_user_torch(info: HostInfo, spec: dict[str, Any]) -> str:
    """``pip install --user`` as the login (its uid, its home), into its ~/.local; returns that
    user base. Debian 12's python is externally managed (PEP 668), which refuses --user too: a
    user on such a python passes --break-system-packages, as pip's docs name the override."""
    uid = in_host(info, "id", "-u", info.user).stdout.strip()
    home = f"/home/{info.user}" if info.user != "root" else "/root"
    in_host(info, "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "env", "-i",
            f"PATH={CLEAN_PATH}", f"HOME={home}", spec["user_site"], "-m", "pip", "install",
            "--user", "--no-input", "--progress-bar", "off", "--disable-pip-version-check",
            "--break-system-packages", "--index-url",
            f"{info.mirror['pytorch']}/{spec.get('variant', 'cpu')}/", spec["wheel"])
    return f"{home}/.local"
