"""Where shipped files live: the checkout's top-level folders, or their copies in the wheel."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def _shipped(folder: str, package: str) -> Path:
    local = _CHECKOUT / folder
    if local.is_dir():
        return local
    return Path(str(resources.files(package)))


def templates_dir() -> Path:
    return _shipped("templates", "provision._templates")


def builtin_recipes_dir() -> Path:
    return _shipped("recipes", "provision._recipes")


def state_dir() -> Path:
    """Local state (known_hosts, logs): ``$GPU_PROVISION_HOME`` or ``~/.config/gpu-provision``."""
    env = os.environ.get("GPU_PROVISION_HOME")
    return Path(env) if env else Path.home() / ".config" / "gpu-provision"
