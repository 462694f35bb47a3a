"""Unit-test fixtures."""

from __future__ import annotations

import json
import subprocess

import pytest

from provision.facts.host import HostFacts, parse_facts
from provision.gather import facts_script, markers_of
from provision.recipes import all_platforms


@pytest.fixture(scope="session")
def here() -> HostFacts:
    """The facts of this very machine: a real HostFacts to build test states from."""
    platforms = all_platforms()
    out = subprocess.run(["bash", "-c", facts_script(platforms)], capture_output=True,
                         text=True, timeout=60, check=True)
    return parse_facts(json.loads(out.stdout), markers_of(platforms))
