"""Programs a recipe installs outside the env (``tools: [ollama]``): the release archive from the
mirror list of the same name, unpacked under the login's home, no root needed.

What each tool's archive is called per architecture, the formats it comes in and where its
program lies inside are data (provision/tables/tools.yaml, with the vendor's sources); the body
is templates/setup/tool.sh.j2. Done is what the journal says (as for the recipe's packages).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from ..config.inventory import Settings
from ..facts.host import HostFacts
from ..remote.contract import shown
from ..remote.templating import render
from .conda import listed
from .step import Step, inputs_hash, nothing


@dataclass(frozen=True)
class Archive:
    name: str  # the file a mirror serves: ollama-linux-amd64.tar.zst
    needs: str  # the program the host needs to unpack it: zstd


@dataclass(frozen=True)
class Tool:
    name: str
    archive: str  # "ollama-linux-{arch}"
    arch: dict[str, str]  # uname -m -> the name the archive uses
    formats: tuple[tuple[str, str], ...]  # (extension, program that unpacks it), best first
    program: str  # inside the archive: bin/ollama

    def archives(self, machine: str) -> tuple[Archive, ...]:
        arch = self.arch.get(machine)
        if arch is None:
            return ()
        base = self.archive.format(arch=arch)
        return tuple(Archive(f"{base}.{ext}", needs) for ext, needs in self.formats)


@cache
def load_tools() -> dict[str, Tool]:
    """provision/tables/tools.yaml, read once."""
    raw: Any = yaml.safe_load(
        resources.files("provision.tables").joinpath("tools.yaml").read_text())
    return {name: Tool(name, str(t["archive"]), {str(k): str(v) for k, v in t["arch"].items()},
                       tuple((str(f["ext"]), str(f["needs"])) for f in t["formats"]),
                       str(t["bin"]))
            for name, t in raw.items()}


def tool_step(facts: HostFacts, settings: Settings, name: str) -> Step:
    """Install ``name`` unless the journal says this host has it from the same mirrors."""
    tool = load_tools()[name]
    bases: tuple[str, ...] = getattr(settings.mirrors, name)
    machine = facts.arch or "x86_64"
    archives = tool.archives(machine)
    where = shown("tools", name)
    if not archives:
        return nothing(name, f"{name} publishes no Linux archive for {machine} (only for "
                       f"{', '.join(tool.arch)}): not installed")
    h = inputs_hash(tool=name, bases=bases, archives=[a.name for a in archives])
    done = facts.journal.get(name, {})
    if done.get("inputs") == h and done.get("result") == "ok" and name not in facts.interrupted:
        return nothing(name, f"{name} installed at {where} (journal)")
    body = render("setup/tool.sh.j2", tool=name, bases=bases, files=archives,
                  program=tool.program, mirror_timeout=settings.mirrors.timeout)
    return Step(name, f"recipe {settings.recipe}: {' or '.join(a.name for a in archives)} from "
                f"{listed(bases)}, unpacked under the home (no root)",
                action=f"install {name} at {where}", body=body, inputs=h)


def tool_steps(facts: HostFacts, settings: Settings) -> list[Step]:
    return [tool_step(facts, settings, name) for name in settings.tools]
