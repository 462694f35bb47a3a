"""Optional dependencies: a task that needs one says the one line that installs it.

``verify`` needs pytest and pytest-testinfra (extra ``verify``); ``compare`` draws its chart
with matplotlib (extra ``chart``); ``all`` holds both. The default install stays small.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec

from ..errors import UsageError

DIST = "gpu-provision"


def install_line(extra: str) -> str:
    """The pip command that adds ``extra`` to the environment this program runs in (a venv,
    pipx's venv or the system's): that interpreter's own pip, so it lands in the right place."""
    python = sys.executable or "python"
    if any(c.isspace() for c in python):
        python = f'"{python}"'
    return f"{python} -m pip install '{DIST}[{extra}]'"


def need(*modules: str, extra: str) -> None:
    """Raise UsageError (exit 2: this install cannot run the task as asked) with the install
    line when one of ``modules`` cannot be imported.

    Example: ``need("pytest", "testinfra", extra="verify")`` before ``import pytest``.
    """
    absent = [m for m in modules if find_spec(m) is None]
    if absent:
        raise UsageError(f"{' and '.join(absent)} {'is' if len(absent) == 1 else 'are'} not "
                             f"installed (the {extra!r} extra); install with: "
                             f"{install_line(extra)}")
