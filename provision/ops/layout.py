"""Where conda and the env live on the host, known before they exist."""

from __future__ import annotations

from dataclasses import dataclass

from ..config.inventory import Settings
from ..config.recipes import Platform
from ..facts.host import CondaEnv, HostFacts


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
    owner: str = "the platform"  # whose env an adopted one is: the platform's, or the image's

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
    # an env name set on the command line or in the inventory is one of ours, even where the
    # platform ships an env to adopt
    adopt = None if settings.asked_by_user("env_name") else platform.adopt_env
    if adopt is None and not settings.asked_by_user("env_name") and image_base(facts, root):
        # the image's own conda with torch in its base (the pytorch/pytorch images' /opt/conda,
        # no platform marker): judged and kept or left alone as a platform's env is
        return Layout(conda_root=root, env_name="base", adopted=True, owner="the image")
    return Layout(conda_root=root, env_name=adopt or settings.env_name, adopted=bool(adopt))


def image_base(facts: HostFacts, root: str) -> bool:
    """The conda at ``root`` came with the image and its base holds a torch: not a conda our
    conda step installed (the journal records that step), not an env we made."""
    if "conda" in facts.journal:
        return False
    base = next((e for e in facts.envs if e.prefix == root), None)
    return base is not None and bool(base.torch) and base.prefix not in facts.own_envs


def ours(lay: Layout, settings: Settings) -> Layout:
    """An env of ours beside the platform's, in the same conda (the platform's env stays as
    it is)."""
    name = settings.env_name if settings.env_name != lay.env_name and settings.env_name != "base" \
        else "torch"
    return Layout(conda_root=lay.conda_root, env_name=name, adopted=False, owner=lay.owner)


def find_env(facts: HostFacts, lay: Layout) -> CondaEnv | None:
    return next((e for e in facts.envs if e.prefix == lay.env_prefix), None)


INTERRUPTED = "interrupted on the host before it finished (a reboot or a kill)"
