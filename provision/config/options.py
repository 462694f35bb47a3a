"""What the command line asks for, typed and checked like the YAML (the error names the option).

Precedence puts these last: defaults < platform < recipe < inventory < command line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ConfigError, UsageError
from . import validators as v
from .recipes import platform_path, recipe_path

_CHECKS = {"python": v.python_version, "torch": v.torch_spec, "env_name": v.name,
           "recipe": v.name, "platform": v.name, "cuda_compat": v.one_of("strict", "minor")}


@dataclass(frozen=True)
class Overrides:
    """Command-line settings; None means "not given"."""

    python: str | None = None
    torch: str | None = None
    recipe: str | None = None
    platform: str | None = None
    cuda_compat: str | None = None
    env_name: str | None = None

    def __post_init__(self) -> None:
        for key, check in _CHECKS.items():
            value = getattr(self, key)
            problem = check(value) if value is not None else None
            if problem:
                raise UsageError(f"--{key.replace('_', '-')}: {problem}")
        for key, find in (("recipe", recipe_path), ("platform", platform_path)):
            value = getattr(self, key)
            if value is not None:
                try:
                    find(value)
                except ConfigError as exc:  # before any connection: the name must exist
                    raise UsageError(f"--{key}: {exc.problem}") from None

    def as_settings(self) -> dict[str, Any]:
        """The given values, keyed like the YAML settings."""
        return {k: x for k, x in asdict(self).items() if x is not None}
