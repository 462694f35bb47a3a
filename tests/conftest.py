"""Shared fixtures: sandbox hosts (skipped with the reason where they cannot run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox import harness

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def sandbox_ready() -> Iterator[None]:
    problem = harness.why_unavailable()
    if problem:
        pytest.skip(f"sandbox hosts unavailable: {problem}")
    yield
    harness.stop_all()


class Hosts:
    """Starts sandbox hosts on demand; one per profile unless asked for a fresh one."""

    def __init__(self) -> None:
        self.shared: dict[str, harness.HostInfo] = {}

    def get(self, profile: str) -> harness.HostInfo:
        if profile not in self.shared:
            self.shared[profile] = harness.start(profile)
        return self.shared[profile]

    def fresh(self, profile: str, **kw: Any) -> harness.HostInfo:
        return harness.start(profile, **kw)


@pytest.fixture(scope="session")
def hosts(sandbox_ready: None) -> Hosts:
    return Hosts()


@pytest.fixture()
def gp_home(tmp_path: Path) -> Path:
    """A private state dir (known_hosts) for one test."""
    home = tmp_path / "gp-home"
    home.mkdir()
    return home


def gpu_provision(*args: str, home: Path, cwd: Path | None = None,
                  env: dict[str, str] | None = None, timeout: int = 300
                  ) -> subprocess.CompletedProcess[str]:
    """Run the real program as a user would (a separate process)."""
    e = dict(os.environ, GPU_PROVISION_HOME=str(home), COLUMNS="200", **(env or {}))
    return subprocess.run([sys.executable, "-m", "provision", *args], capture_output=True,
                          text=True, cwd=str(cwd or ROOT), env=e, timeout=timeout)


def facts_json(info: harness.HostInfo, home: Path) -> dict[str, Any]:
    r = gpu_provision("-H", info.inventory, "facts", "--json", home=home)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]
