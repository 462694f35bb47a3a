"""Under CI (CI=true) a skip that is not on tests/allowed_skips.txt fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import (pytest_runtest_logreport, pytest_sessionfinish,  # noqa: F401\n"
        "                            pytest_terminal_summary)\n")
    (tmp_path / "test_some.py").write_text(
        "import pytest\n\ndef test_runs():\n    pass\n\n"
        "def test_skips():\n    pytest.skip('sshd missing')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true" if ci else "false"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)


def test_an_unlisted_skip_fails_under_ci(tmp_path: Path) -> None:
    r = run(tmp_path, ci=True)
    assert r.returncode == 1, r.stdout
    assert "skipped: 1 (0 on the allowed list, tests/allowed_skips.txt)" in r.stdout
    assert "skips not on the allowed list fail a CI run:" in r.stdout
    assert "test_some.py::test_skips: Skipped: sshd missing" in r.stdout


def test_outside_ci_a_skip_is_counted_only(tmp_path: Path) -> None:
    r = run(tmp_path, ci=False)
    assert r.returncode == 0, r.stdout
    assert "skipped: 1 (0 on the allowed list" in r.stdout
