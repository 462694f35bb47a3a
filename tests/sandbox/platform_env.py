"""What a rental image leaves in the platform's env before we arrive: a torch, really installed
from the local mirror where this machine has the wheel, else replayed from a captured real
``torch/version.py`` (all the facts read of it) where it has not (an old CUDA build).

Profile key ``platform_torch``: ``{wheel: "torch==2.13.0", variant: cpu}`` or
``{version_py: torch/version-py-2.2.1-cu121.txt}`` (a file under tests/fixtures).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .harness import FIXTURES, HostInfo, in_host

CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def install_platform_torch(info: HostInfo, prefix: str, spec: dict[str, Any]) -> None:
    python = f"{prefix}/bin/python"
    if spec.get("wheel"):
        # pip as the platform's image build ran it; this machine's pip settings stay outside
        in_host(info, "env", "-i", f"PATH={CLEAN_PATH}", "HOME=/root", python, "-m", "pip",
                "install", "--no-input", "--progress-bar", "off", "--disable-pip-version-check",
                "--index-url", f"{info.mirror['pytorch']}/{spec.get('variant', 'cpu')}/",
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
    for site in Path(info.path(prefix)).glob("lib/python3.*/site-packages"):
        for f in [*site.glob("torch/*.py"), *site.glob("torch-*.dist-info/*")]:
            found[str(f.relative_to(site))] = f.stat().st_mtime_ns
    return found
