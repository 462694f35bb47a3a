"""What doctor reads from files: the shipped knowledge base and library tables (package data),
and the ``--log`` files a user gives. The rest of the package is pure and gets texts from here.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..config.shipped import Traversable
from ..errors import ConfigError, UsageError

# The knowledge base, one file per phase, read in this order: within a group (see
# knowledge/gpu.yaml's header) the first entry that matches wins, so order is meaning.
PHASES = ("gpu", "install", "imports", "build", "training", "data", "host")


def shipped(name: str) -> Traversable:
    """A data file of the doctor package (``knowledge/gpu.yaml``, ``libraries.yaml``)."""
    node = resources.files("provision.doctor")
    for part in name.split("/"):
        node = node / part
    return node


KNOWLEDGE: tuple[Traversable, ...] = tuple(shipped(f"knowledge/{p}.yaml") for p in PHASES)


def read_yaml(path: Traversable) -> Any:
    """A shipped YAML file, parsed; a syntax error names the file."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), f"not valid YAML: {exc}") from None


def read_logs(names: Sequence[str]) -> dict[str, str]:
    """``--log`` files by name (``-`` is standard input); an unreadable one is an error."""
    files = {}
    for name in names:
        if name == "-":
            files["stdin"] = sys.stdin.read()
            continue
        try:
            files[name] = Path(name).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise UsageError(f"--log {name}: cannot read it ({exc.strerror})") from None
    return files
