"""Our local sockets trust nothing that is not proven (remote/rundir.py): a run dir another
user could swap is refused, and no client says a byte to a socket another user listens on, nor
any server to another user's client. The other user is real: a process of uid 65534 (nobody),
made here by fork and setuid (the suite runs as root, as CI does)."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.cli import warm
from provision.remote import relay, rundir

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as a second user")


@pytest.fixture()
def ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    d = tmp_path / "run"
    monkeypatch.setenv("GPU_PROVISION_RUN_DIR", str(d))
    return d


@pytest.fixture()
def short() -> Iterator[Path]:
    """A folder with a short path (a socket's path is at most about 100 bytes: under pytest-xdist
    tmp_path is longer than a run dir may be, and such a run dir is passed over unsaid)."""
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="rd-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_run_dir_of_ours_is_made_0700_and_used(ours: Path) -> None:
    assert rundir.run_dir() == ours and rundir.refused == ""
    assert ours.stat().st_mode & 0o777 == 0o700


def test_a_symlink_where_the_run_dir_should_be_is_refused(ours: Path, tmp_path: Path) -> None:
    target = tmp_path / "ssh"  # a 0700 folder of ours, as ~/.ssh is: the link is still refused
    target.mkdir(mode=0o700)
    ours.symlink_to(target)
    assert rundir.run_dir() is None
    assert rundir.refused.startswith(f"{ours}: not a folder of ours")
    assert "a link is not followed" in rundir.refused


def test_a_run_dir_of_another_user_or_open_to_others_is_refused(ours: Path) -> None:
    ours.mkdir(mode=0o700)
    os.chown(ours, NOBODY, NOBODY)
    assert rundir.run_dir() is None
    assert rundir.refused == f"{ours}: belongs to uid {NOBODY}, not to us (0)"
    os.chown(ours, 0, 0)
    ours.chmod(0o750)
    assert rundir.run_dir() is None
    assert rundir.refused == f"{ours}: others may use it (mode 750; 700 is safe)"


def test_a_parent_another_user_may_swap_is_refused(short: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """root after `su` keeps the user's XDG_RUNTIME_DIR: a folder that user owns, who may rename
    our folder away and put theirs in its place. A shared folder others may write in is the
    same, unless it is sticky (as /tmp is)."""
    users = short / "user-1000"
    users.mkdir(mode=0o700)
    os.chown(users, NOBODY, NOBODY)
    monkeypatch.setenv("GPU_PROVISION_RUN_DIR", str(users / "gp"))
    assert rundir.run_dir() is None
    assert rundir.refused == f"{users}: user-1000 belongs to uid {NOBODY}, who could swap what is in it"
    shared = short / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("GPU_PROVISION_RUN_DIR", str(shared / "gp"))
    assert rundir.run_dir() is None
    assert rundir.refused == f"{shared}: others may write in shared and it is not sticky"
    shared.chmod(0o1777)
    assert rundir.run_dir() == shared / "gp"


def test_a_refused_runtime_dir_falls_back_to_the_temp_one(short: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    users = short / "user-1000"
    users.mkdir(mode=0o700)
    os.chown(users, NOBODY, NOBODY)
    monkeypatch.delenv("GPU_PROVISION_RUN_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(users))
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    assert rundir.run_dir() == short / "gpu-provision-0"


class Foreign:
    """A listener that another user holds at ``path`` (bound there, then made nobody's before
    it listens: the kernel gives a listener's credentials as of listen()). It tells what it got
    from the one client it accepts: bytes and file descriptors."""

    def __init__(self, path: str):
        self.read_end, write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the other user
            try:
                os.close(self.read_end)
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.bind(path)
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                s.listen(1)
                os.write(write_end, b"L")
                s.settimeout(10)
                conn, _ = s.accept()
                conn.settimeout(2)
                got, fds = b"", 0
                try:
                    while True:
                        msg, anc, _, _ = socket.recv_fds(conn, 1 << 16, 8)
                        fds += len(anc)
                        if not msg:
                            break
                        got += msg
                except OSError:
                    pass
                os.write(write_end, struct.pack("!II", len(got), fds))
            finally:
                os._exit(0)
        os.close(write_end)
        assert os.read(self.read_end, 1) == b"L"

    def got(self) -> tuple[int, int]:
        """(bytes, descriptors) the client sent it."""
        data = os.read(self.read_end, 8)
        os.waitpid(self.pid, 0)
        os.close(self.read_end)
        return struct.unpack("!II", data) if data else (0, 0)


def test_no_client_speaks_to_another_users_socket(ours: Path) -> None:
    d = rundir.run_dir()
    assert d is not None
    keeper = Foreign(str(d / "k"))  # a fake keeper where ours would listen
    with pytest.raises(relay.Gone, match="is held by another user"):
        relay.ask(str(d / "k"), {"op": "exec", "command": "echo $HF_TOKEN", "env": {}}, 5)
    assert keeper.got() == (0, 0)
    server = Foreign(str(d / "w-0"))  # a fake warm server: our env, our stdio would go to it
    started = time.monotonic()
    assert warm.run_warm(str(d / "w-0"), ["-H", "box", "facts"]) is None  # it runs here instead
    assert server.got() == (0, 0) and time.monotonic() - started < 5
    status = Foreign(str(d / "w-1"))
    assert warm.ask(str(d / "w-1"), "status") is None
    assert status.got() == (0, 0)


def test_servers_tell_their_own_user_from_another() -> None:
    where = tempfile.mkdtemp(dir="/tmp")  # (pytest's tmp_path is closed to other users)
    os.chmod(where, 0o755)
    path = os.path.join(where, "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.settimeout(10)
    listener.bind(path)
    os.chmod(path, 0o777)
    listener.listen(2)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            socket.socket(socket.AF_UNIX).connect(path)
            time.sleep(1)
        finally:
            os._exit(0)
    theirs, _ = listener.accept()
    assert not rundir.peer_is_us(theirs)
    mine = socket.socket(socket.AF_UNIX)
    mine.connect(path)
    own, _ = listener.accept()
    assert rundir.peer_is_us(own)
    os.waitpid(pid, 0)
    for s in (theirs, own, mine, listener):
        s.close()
    os.unlink(path)
    os.rmdir(where)


@pytest.fixture(autouse=True)
def _no_leftover_children() -> Iterator[None]:
    yield
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def test_only_a_socket_nobody_listens_on_counts_as_stale(tmp_path: Path) -> None:
    """`keepers` removes a killed server's socket, never a slow one's (it could not be
    stopped any more)."""
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow.bind(str(tmp_path / "slow"))
    slow.listen(1)  # listens, never accepts nor answers
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(tmp_path / "dead"))
    dead.close()  # its file stays, as a killed server's does
    assert not rundir.nobody_listens(str(tmp_path / "slow"))
    assert rundir.nobody_listens(str(tmp_path / "dead"))
    slow.close()


@pytest.mark.skipif(not Path("/proc/self/ns/pid").exists() or not shutil.which("unshare"),
                    reason="needs Linux namespaces and unshare")
def test_a_client_in_another_pid_namespace_is_told_apart(tmp_path: Path) -> None:
    """Its pid means another process here (signals passed on would go astray): the warm
    server does not serve it, and the command runs by itself."""
    path = str(tmp_path / "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.settimeout(20)
    listener.bind(path)
    listener.listen(2)
    connect = f"import socket, time; s = socket.socket(socket.AF_UNIX); s.connect({path!r}); time.sleep(3)"
    other = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                              connect])
    theirs, _ = listener.accept()
    assert rundir.peer_is_us(theirs) and not rundir.peer_shares_our_namespaces(theirs)
    same = subprocess.Popen([sys.executable, "-c", connect])
    ours, _ = listener.accept()
    assert rundir.peer_shares_our_namespaces(ours)
    for p in (other, same):
        p.wait(10)
    for s in (theirs, ours, listener):
        s.close()
