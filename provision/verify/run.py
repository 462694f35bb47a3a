"""Run the shipped testinfra suite against a host through our executor: every command it runs
goes over the open, pinned connection, into the run's log, with secrets masked, like a step's."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.inventory import Target
from ..config.shipped import as_dir, verify_suite

if TYPE_CHECKING:
    from ..remote.executor import Executor

_PYTEST = threading.Lock()  # pytest.main is not thread-safe: hosts of a -H list take turns


def run_suite(ex: Executor, target: Target, junit: Path) -> int:
    """pytest's exit code (0: every check passed); its summary goes to stdout, JUnit XML to
    ``junit``."""
    import pytest

    class HandOver:  # gives the suite our executor (its open, pinned connection)
        def pytest_configure(self, config: Any) -> None:
            config.gpu_provision_executor = ex
            config.gpu_provision_client = ex.conn.client

    junit.parent.mkdir(parents=True, exist_ok=True)
    with _PYTEST, as_dir(verify_suite()) as suite:
        return int(pytest.main([str(suite), f"--hosts=paramiko://{target.user}@{target.host}:"
                                f"{target.port}", "-c", os.devnull, "--rootdir", str(suite),
                                "-p", "no:cacheprovider", "-q", "-rfEs", f"--junitxml={junit}"],
                               plugins=[HandOver()]))
