"""Decisions tested from case files: captured facts + settings -> the expected steps."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from provision.facts.host import HostFacts, parse_facts
from provision.gather import markers_of
from provision.recipes import all_platforms

CASES = Path(__file__).resolve().parent
FACTS = CASES / "facts"


def raw(name: str, probes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The captured facts document ``facts/<name>.json``, some probes replaced: each value an
    output text (exit code 0), or ``{"rc": N, "out": text}``."""
    doc: dict[str, Any] = json.loads((FACTS / f"{name}.json").read_text())
    for key, value in (probes or {}).items():
        doc["probes"][key] = value if isinstance(value, Mapping) else {"rc": 0, "out": value}
    return doc


def captured(name: str, probes: Mapping[str, Any] | None = None) -> HostFacts:
    return parse_facts(raw(name, probes), markers_of(all_platforms()))
