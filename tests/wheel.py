"""Build the wheel from this checkout as a user would from a clone.

It builds from a copy of the checkout, so that no ``build/`` or ``*.egg-info`` lands in the
checkout and nothing stale from an earlier in-tree build (setuptools keeps ``build/lib``) can
slip into the wheel.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# what a clone does not have: local state, caches, venvs and earlier build outputs
_IGNORE = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "*.egg-info",
                                 "__pycache__", ".*_cache", "reports", "logs", ".sandbox")


def build_wheel(workdir: Path) -> Path:
    """Build the wheel into ``workdir/dist`` (setuptools from this environment, no build
    isolation, so no download) and return its path."""
    src = workdir / "src"
    shutil.copytree(ROOT, src, ignore=_IGNORE)
    dist = workdir / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(dist), str(src)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"pip wheel failed:\n{r.stdout}\n{r.stderr}"
    [wheel] = dist.glob("gpu_provision-*.whl")
    return wheel
