"""Which installer the torch and packages steps use: our pinned uv where it can be had, else pip.

uv downloads in parallel and unpacks much faster than pip, which fetches one file at a time; on
the CUDA torch install (about 3 GB of wheels) that is most of a cold bootstrap. uv itself comes
from the configured PyPI mirror into our own tool dir on the host, one pinned release whose
wheels' sha256 lie in ``provision/tables/uv.yaml``; the step falls back to pip on the host when the
mirror lacks it, the hash differs or the binary does not run (templates/setup/_install.sh.j2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from ..config.inventory import Settings
from ..facts.host import HostFacts
from ..remote.contract import shown
from .conda import listed

TOOLS_DIR = shown("tools")  # ours on the host; uv-<version>/uv inside


@dataclass(frozen=True)
class UvWheel:
    file: str
    sha256: str
    size: int


@dataclass(frozen=True)
class UvRelease:
    version: str
    source: str  # where the hashes were read
    wheels: Mapping[str, UvWheel]  # host arch (uname -m) -> its wheel


@cache
def load_uv() -> UvRelease:
    """The pinned uv release (provision/tables/uv.yaml), read once."""
    raw: Any = yaml.safe_load(resources.files("provision.tables").joinpath("uv.yaml").read_text())
    return UvRelease(version=str(raw["version"]), source=str(raw["source"]),
                     wheels={arch: UvWheel(str(w["file"]), str(w["sha256"]), int(w["size"]))
                             for arch, w in raw["wheels"].items()})


@dataclass(frozen=True)
class Installer:
    """The installer decided for a host: ``wheel`` None means pip, for the reason given."""

    version: str
    wheel: UvWheel | None
    present: bool  # our uv of this version is already in the tool dir
    mirrors: tuple[str, ...]  # the PyPI mirrors uv is fetched from, tried in order
    why: str  # why this one (uv: how it gets there; pip: why not uv)

    @property
    def name(self) -> str:
        return f"uv {self.version}" if self.wheel else "pip"

    def template_vars(self) -> dict[str, Any]:
        """What templates/setup/_install.sh.j2 needs."""
        uv = None if self.wheel is None else {
            "version": self.version, "file": self.wheel.file, "sha256": self.wheel.sha256}
        return {"uv": uv, "uv_mirrors": self.mirrors, "pip_reason": self.why}


# uv reads only the venv's own site-packages, not those a --system-site-packages venv sees, so it
# would install torch again beside the image's (astral-sh/uv#7358, #4466: "we don't look at the
# full sys.path"); pip sees them, and in a venv it never touches what lies outside it (PEP 668,
# use case 4: https://peps.python.org/pep-0668/#use-cases)
OVER_IMAGE = ("the env is a venv over the image's python (--system-site-packages), whose "
              "packages uv does not see (astral-sh/uv#7358): pip keeps the image's torch")


def choose_installer(facts: HostFacts, settings: Settings, over_image: bool = False) -> Installer:
    """uv when a wheel is pinned for the host's arch, pip otherwise. (Its wheels need glibc 2.17,
    older than any torch release in the data needs; a binary that does not run on the host sends
    the step to pip there.) ``over_image``: the env is our venv over the image's python: pip."""
    rel = load_uv()
    arch = facts.arch or "x86_64"
    mirrors = settings.mirrors.pypi
    if over_image:
        return Installer(rel.version, None, False, mirrors, OVER_IMAGE)
    wheel = rel.wheels.get(arch)
    where = f"{TOOLS_DIR}/uv-{rel.version}"
    if wheel is None:
        return Installer(rel.version, None, False, mirrors,
                         f"no uv wheel is pinned for {arch} (provision/tables/uv.yaml has "
                         f"{', '.join(sorted(rel.wheels))})")
    if rel.version in facts.uv_versions:
        return Installer(rel.version, wheel, True, mirrors,
                         f"parallel downloads; already in {where}")
    return Installer(rel.version, wheel, False, mirrors,
                     f"parallel downloads; fetched from the PyPI mirror {listed(mirrors)} into "
                     f"{where}, sha256 checked (provision/tables/uv.yaml); pip where it cannot "
                     "be had")


def installer_decision(facts: HostFacts, settings: Settings, changing: list[str],
                       over_image: bool = False) -> tuple[str, str] | None:
    """(action, reason) of the plan's installer line, when the torch or packages step has work."""
    served = [name for name in ("torch", "packages") if name in changing]
    if not served:
        return None
    chosen = choose_installer(facts, settings, over_image)
    verb = "installs" if len(served) == 1 else "install"
    # until our uv is on the host, whether a mirror serves it is the step's to find out: the
    # plan does not promise it
    hedge = " (or pip where the mirror has no uv)" if chosen.wheel and not chosen.present else ""
    return (f"use {chosen.name}{hedge}",
            f"{' and '.join(served)} {verb} with {chosen.name}: {chosen.why}")
