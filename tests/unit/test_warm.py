"""Which command lines the warm start takes (provision/cli/warm.py), and what names its server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from provision.cli import warm


@pytest.mark.parametrize("argv, taken", [
    (["-H", "box.yaml", "jobs", "--json"], True),
    (["-Hbox.yaml", "facts"], True),
    (["--hosts=a.yaml,b.yaml", "facts"], True),
    (["pick", "--gpu", "4090"], False),  # no host: nothing is kept for it
    (["-H", "box.yaml", "--no-keep", "jobs"], False),
    (["-H", "box.yaml", "--keep", "0", "jobs"], False),
    (["-H", "box.yaml", "--keep=0", "jobs"], False),
    (["-H", "box.yaml", "shell"], False),  # needs this terminal as its controlling one
    (["-H", "box.yaml", "authorize"], False),  # asks for a password on it
    (["-H", "box.yaml", "--prompt-for-login-password", "facts"], False),
    (["-H", "box.yaml", "run", "--", "python", "shell"], True),  # the job's words, not ours
])
def test_which_commands_go_warm(argv: list[str], taken: bool,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_PROVISION_KEEP", "600")
    assert warm.wanted(argv) is taken


@pytest.mark.parametrize("keep, idle", [("", 600), ("30", 30), ("0", None), ("ten", None)])
def test_keeping_off_means_no_warm_start(keep: str, idle: int | None,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_PROVISION_KEEP", keep)
    assert warm.idle_seconds() == idle
    assert warm.wanted(["-H", "box.yaml", "jobs"]) is (idle is not None)
    monkeypatch.setenv("GPU_PROVISION_WARM", "0")  # connections kept, the program not
    assert warm.wanted(["-H", "box.yaml", "jobs"]) is False


def test_an_edited_or_upgraded_program_gets_another_server(tmp_path: Path) -> None:
    root = tmp_path / "provision"
    (root / "cli").mkdir(parents=True)
    (root / "cli" / "main.py").write_text("x = 1\n")
    first = warm.code_key(root)
    assert warm.code_key(root) == first
    (root / "cli" / "main.py").write_text("x = 22\n")  # another size
    assert warm.code_key(root) != first
    second = warm.code_key(root)
    st = (root / "cli" / "main.py").stat()
    os.utime(root / "cli" / "main.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # same size
    assert warm.code_key(root) != second
    (root / "cli" / "__pycache__").mkdir()  # what Python writes beside it changes nothing
    (root / "cli" / "__pycache__" / "main.cpython-311.pyc").write_bytes(b"\0")
    third = warm.code_key(root)
    (root / "cli" / "__pycache__" / "main.cpython-311.pyc").write_bytes(b"\0\0")
    assert warm.code_key(root) == third


def test_an_upgraded_dependency_gets_another_server(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "provision"
    root.mkdir()
    site = tmp_path / "site-packages"
    (site / "paramiko-5.1.0.dist-info").mkdir(parents=True)
    monkeypatch.setattr("sys.path", [str(site)])
    first = warm.code_key(root)
    (site / "paramiko-5.1.0.dist-info").rename(site / "paramiko-5.2.0.dist-info")  # pip install -U
    assert warm.code_key(root) != first


def test_the_worker_takes_the_clients_time_zone_priority_and_limits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the client sends (warm._message) is what a forked worker becomes (become_limited,
    time.tzset in work): a command run warm keeps the client's TZ, nice and ulimits."""
    import json
    import resource
    import time

    from provision.cli import warm_server
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the client: lower its own limits and priority, then say what it sends
        try:
            os.close(read)
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
            os.nice(3)
            os.write(write, warm._message(["-H", "box", "jobs"]))
        finally:
            os._exit(0)
    os.close(write)
    request = json.loads(os.fdopen(read, "rb").read())
    os.waitpid(pid, 0)
    assert request["limits"]["RLIMIT_NOFILE"] == [256, hard] and request["env"]["TZ"] == "Asia/Tokyo"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker, as work() sets itself up
        try:
            os.close(read)
            os.environ.clear()
            os.environ.update(request["env"])
            time.tzset()
            warm_server.become_limited(request)
            os.write(write, json.dumps([resource.getrlimit(resource.RLIMIT_NOFILE),
                                        os.getpriority(os.PRIO_PROCESS, 0),
                                        time.strftime("%z")]).encode())
        finally:
            os._exit(0)
    os.close(write)
    got = json.loads(os.fdopen(read, "rb").read())
    os.waitpid(pid, 0)
    assert got == [[256, hard], request["nice"], "+0900"]
    assert request["nice"] == os.getpriority(os.PRIO_PROCESS, 0) + 3
