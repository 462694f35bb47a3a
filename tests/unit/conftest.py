"""Unit-test fixtures: host states come from facts captured on sandbox hosts
(tests/cases/facts/, made by ``python -m tests.cases.capture``), never from this machine."""

from __future__ import annotations

import pytest

from provision.facts.host import HostFacts
from tests.cases import captured


@pytest.fixture(scope="session")
def cpu_host() -> HostFacts:
    """A fresh CPU-only Ubuntu 24.04 VM: nothing installed yet."""
    return captured("cpu-only")
