"""The small frictions a new user met in a day, each fixed and held here: `TASK -h` for every
task, `--json` before the task's name, forward's ports as separate words, a download said as a
download, `sync up SRC DEST`."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from rich.console import Console

from provision.cli.argv import rewrite
from provision.cli.main import namespace
from provision.sync.show import sync_report

TASKS = set(namespace.task_names)


def gp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provision", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_task_answers_h_with_its_help(task: str) -> None:
    r = gp(task, "-h")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"Usage: gpu-provision [--core-opts] {task} ")


def test_help_after_other_words_and_with_hosts() -> None:
    assert rewrite(["gp", "-H", "box", "logs", "train", "--help"], TASKS) == \
        ["gp", "-H", "box", "--help", "logs"]
    # a -h after `--` is the command's own
    assert rewrite(["gp", "-H", "box", "run", "--", "python", "x.py", "-h"], TASKS) == \
        ["gp", "-H", "box", "run", "--", "python", "x.py", "-h"]
    # a host named like a task is the host
    assert rewrite(["gp", "-H", "jobs", "jobs"], TASKS) == ["gp", "-H", "jobs", "jobs"]


def test_json_before_the_task_is_the_tasks() -> None:
    assert rewrite(["gp", "--json", "-H", "box", "jobs", "--all"], TASKS) == \
        ["gp", "-H", "box", "jobs", "--json", "--all"]
    r = gp("--json", "pick", "--driver", "550.54.14", "--compute-cap", "8.9", "--python", "3.10")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)  # the task's JSON, not "did you mean --version?"


def test_forward_ports_as_separate_words() -> None:
    assert rewrite(["gp", "-H", "box", "forward", "8888", "6006:7000", "--job", "nb"], TASKS) == \
        ["gp", "-H", "box", "forward", "8888,6006:7000", "--job", "nb"]


def _said(report: dict[str, object]) -> str:
    out = io.StringIO()
    sync_report(report, Console(file=out, width=200))
    return out.getvalue()


BASE = {"host": "box", "transport": "sftp", "transport_why": "asked", "files": 1, "same": 0,
        "deleted": 0, "bytes": 5, "sent_bytes": 5, "resumed_bytes": 0, "seconds": 0.1,
        "verified": "sha256 of each file on both sides", "dry_run": False, "planned": [],
        "deletions": [], "mbs": None}


def test_a_download_reads_as_a_download() -> None:
    down = _said({**BASE, "direction": "down", "source": "/root/results",
                  "dest": "/tmp/work/results"})
    assert down.splitlines()[:2] == [
        "sync down: box:/root/results -> /tmp/work/results",
        "fetched 1 file(s), 5 B in 0.1s by sftp; 0 already the same"]
    up = _said({**BASE, "direction": "up", "source": "/tmp/data", "dest": "/root/data"})
    assert up.splitlines()[:2] == ["sync up: /tmp/data -> box:/root/data",
                                   "sent 1 file(s), 5 B in 0.1s by sftp; 0 already the same"]
    dry = _said({**BASE, "direction": "down", "source": "/root/r", "dest": "/tmp/r",
                 "dry_run": True, "planned": ["a.ckpt"]})
    assert "would fetch 1 file(s)" in dry and "  fetch a.ckpt" in dry


def test_sync_src_dest_as_scp_and_rsync_take_them() -> None:
    from provision.cli.main import program
    program.normalize_argv(["gp", "-H", "box", "sync", "up", "./data", "/root/data", "--exclude",
                            "*.tmp", "--dry-run"])
    assert program.argv == ["gp", "-H", "box", "sync", "up", "./data", "--dest", "/root/data",
                            "--exclude", "*.tmp", "--dry-run"]
    program.normalize_argv(["gp", "-H", "box", "sync", "down", "--transport", "sftp", "runs/a",
                            "./back/"])
    assert program.argv == ["gp", "-H", "box", "sync", "down", "--transport", "sftp", "runs/a",
                            "--dest", "./back/"]
    program.normalize_argv(["gp", "-H", "box", "sync", "up", "./data"])  # the one-path form
    assert program.argv == ["gp", "-H", "box", "sync", "up", "./data"]
