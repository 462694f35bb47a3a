"""Where conda and the env live on the host, known before they exist."""

from __future__ import annotations

from dataclasses import dataclass

from ..facts.host import CondaEnv, HostFacts
from ..inventory import Settings
from ..recipes import Platform


def expand_home(path: str, home: str) -> str:
    """``~`` and ``~/x`` are the host user's home (facts know it); a quoted ``~`` would be a
    folder named ``~``."""
    if path == "~":
        return home
    return f"{home.rstrip('/')}/{path[2:]}" if path.startswith("~/") else path


@dataclass(frozen=True)
class Layout:
    conda_root: str
    env_name: str
    adopted: bool  # the platform's env (AutoDL's base), not one of ours

    @property
    def env_prefix(self) -> str:
        return self.conda_root if self.env_name == "base" else f"{self.conda_root}/envs/{self.env_name}"

    @property
    def python_bin(self) -> str:
        return f"{self.env_prefix}/bin/python"


def layout(facts: HostFacts, settings: Settings, platform: Platform) -> Layout:
    roots = [c.removesuffix("/bin/conda") for c in facts.conda]
    prefix = expand_home(platform.conda_prefix, facts.home) if platform.conda_prefix else None
    root = prefix if prefix in roots else (roots[0] if roots else prefix or f"{facts.home}/miniconda3")
    adopt = platform.adopt_env
    return Layout(conda_root=root, env_name=adopt or settings.env_name, adopted=bool(adopt))


def find_env(facts: HostFacts, lay: Layout) -> CondaEnv | None:
    return next((e for e in facts.envs if e.prefix == lay.env_prefix), None)


INTERRUPTED = "interrupted on the host before it finished (a reboot or a kill)"
