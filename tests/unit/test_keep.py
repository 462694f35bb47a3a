"""Kept connections: what decides whether two commands may share one (remote/keep.py)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from provision.config.inventory import Target, load_inventory
from provision.errors import ProvisionError
from provision.remote import keep

BIN = Path(__import__("sys").executable).parent


def test_keep_time_comes_from_the_flag_env_then_the_inventory(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    inv = tmp_path / "box.yaml"
    inv.write_text("host: 1.2.3.4\nkeep: 30\n")
    target = load_inventory(inv)
    monkeypatch.delenv("GPU_PROVISION_KEEP", raising=False)
    assert keep.keep_seconds(target) == 30
    assert keep.keep_seconds(replace(target, keep=None)) == 600
    monkeypatch.setenv("GPU_PROVISION_KEEP", "0")
    assert keep.keep_seconds(target) == 0
    monkeypatch.setenv("GPU_PROVISION_KEEP", "ten")
    with pytest.raises(ProvisionError, match=r"\$GPU_PROVISION_KEEP='ten': give whole seconds"):
        keep.keep_seconds(target)


def test_a_bad_keep_is_named(tmp_path: Path) -> None:
    inv = tmp_path / "box.yaml"
    inv.write_text("host: 1.2.3.4\nkeep: -5\n")
    r = subprocess.run([str(BIN / "gpu-provision"), "-H", str(inv), "facts"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "box.yaml:2: keep: -5 must be whole seconds, 0 to 86400" in \
        r.stderr
    r = subprocess.run([str(BIN / "gpu-provision"), "--keep", "100000", "-H", str(inv), "facts"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == \
        "error: --keep 100000: give whole seconds, 0 to 86400"


def test_every_part_of_a_connection_changes_the_socket(tmp_path: Path) -> None:
    base = Target(name="box", host="10.0.0.5", port=22, user="root", key="~/.ssh/id_ed25519",
                  source=tmp_path / "box.yaml")
    known = tmp_path / "known_hosts"
    ident = keep.identity(base, known)
    others = [replace(base, port=2222), replace(base, user="ubuntu"), replace(base, key="/k2"),
              replace(base, host="10.0.0.6"), replace(base, source=tmp_path / "other.yaml"),
              replace(base, password_env="PW"), replace(base, source=None)]
    idents = {keep.identity(t, known) for t in others} | {keep.identity(base, tmp_path / "kh2")}
    assert ident not in idents and len(idents) == len(others) + 1
    # what does not decide the connection leaves it alone
    assert keep.identity(replace(base, settings={"python": "3.11"}, keep=5), known) == ident
    a, b = keep.socket_for(ident, "AAAA"), keep.socket_for(ident, "BBBB")
    assert a != b  # a re-pinned key: another socket


def test_the_run_dir_is_ours_alone_and_short(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "run"
    monkeypatch.setenv("GPU_PROVISION_RUN_DIR", str(mine))
    assert keep.run_dir() == mine and (mine.stat().st_mode & 0o777) == 0o700
    assert len(keep.socket_for("x", "y").encode()) < 104
    os.chmod(mine, 0o755)  # readable by others: not used
    assert keep.run_dir() is None
    monkeypatch.setenv("GPU_PROVISION_RUN_DIR", "/tmp/" + "d" * 90)
    assert keep.run_dir() is None  # a socket path there would pass 104 bytes (macOS)


def test_keeping_off_means_a_fresh_connection(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_PROVISION_KEEP", "0")
    monkeypatch.setenv("GPU_PROVISION_RUN_DIR", str(tmp_path / "run"))
    target = Target(name="box", host="10.0.0.5")
    assert keep.kept(target, 5, None, tmp_path / "known_hosts") is None
    assert not (tmp_path / "run").exists()
