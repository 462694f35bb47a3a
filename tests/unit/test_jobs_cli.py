"""The command line of the job tasks: the words after -- are the job's argv, never a command
Fabric runs; the tasks are listed by both programs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_the_words_after_dashes_are_never_run_here(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    # no host: the task says so (Fabric alone would run the words as a shell command)
    r = subprocess.run([str(BIN / "gpu-provision"), "run", "--", "touch", str(marker)],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2 and "this task needs a host" in r.stderr
    # a host that refuses the connection: named, and nothing ran here
    key = tmp_path / "id_ed25519"  # a key of its own, so the attempt reaches the network
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    r = subprocess.run([str(BIN / "gpu-provision"), "-i", str(key), "-H", "root@127.0.0.1:1", "run",
                        "--", "touch", str(marker)], cwd=tmp_path, capture_output=True, text=True,
                       env={"GPU_PROVISION_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 1 and "connection refused" in r.stderr.lower()
    assert not marker.exists()


def test_both_programs_list_the_job_tasks(tmp_path: Path) -> None:
    for argv, cwd in (([str(BIN / "gpu-provision"), "-l"], tmp_path), ([str(BIN / "fab"), "-l"], ROOT)):
        r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        names = {line.split()[0] for line in r.stdout.splitlines()[1:] if line.startswith("  ")}
        assert {"run", "logs", "jobs", "kill", "watch"} <= names


def test_hosts_given_twice_is_refused(tmp_path: Path) -> None:
    r = subprocess.run([str(BIN / "gpu-provision"), "-H", "root@127.0.0.1:1", "run", "--hosts",
                        "root@127.0.0.1:2", "--", "true"], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 2
    assert "give the hosts once: -H a,b (a job on each) or --hosts a,b (one job over them)" in r.stderr
