"""Stopping everything leaves no sandbox sshd, supervisor or mirror (in a sandbox dir of its own:
the rest of the suite may be using the shared one beside it, under pytest -n)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.sandbox import harness

pytestmark = pytest.mark.sandbox


def sandbox_processes() -> list[str]:
    base = str(harness.sandbox_dir())
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            root = os.readlink(d / "root")
        except OSError:
            continue
        # hostd and the mirror carry their folder under the sandbox dir on the command line
        if root.startswith(base) or base in cmd:
            found.append(f"{d.name}: {cmd.strip()} (root {root})")
    return found


def test_stop_all_leaves_nothing_running(sandbox_ready: None, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_SANDBOX_DIR", str(tmp_path / "sandbox"))
    harness.start("cpu-only")
    assert sandbox_processes()
    harness.stop_all()
    assert sandbox_processes() == []
    assert harness.running() == []
