"""The executor's files and the step runtime's locks and log streaming, over real SSH to a
sandbox host, with the link cut mid-way by a proxy."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.config.inventory import Target
from provision.errors import ProvisionError, SSHError
from provision.remote.command import Command
from provision.remote.connection import connect
from provision.remote.executor import Executor
from provision.remote.runtime import run_detached
from tests.conftest import Hosts
from tests.sandbox import harness
from tests.sandbox.proxy import TcpProxy

pytestmark = pytest.mark.sandbox
MB = 1 << 20


@pytest.fixture
def link(hosts: Hosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
         ) -> Iterator[tuple[harness.HostInfo, TcpProxy, Target]]:
    """A shared CPU host behind a proxy that can cut the link; pins go to a temp folder."""
    monkeypatch.setenv("GPU_PROVISION_HOME", str(tmp_path / "gp-home"))
    info = hosts.get("cpu-only")
    proxy = TcpProxy((info.host, info.port))
    target = Target(name="box", host="127.0.0.1", port=proxy.port, user="root", key=info.key)
    yield info, proxy, target
    proxy.close()


def executor(target: Target) -> Executor:
    return Executor(connect(target), "box")


def settled_size(path: Path) -> int:
    """The size once the host's sftp-server has written what reached it before the cut."""
    last, since = -1, time.monotonic()
    while time.monotonic() - since < 1.0:
        size = path.stat().st_size
        if size != last:
            last, since = size, time.monotonic()
        time.sleep(0.1)
    return last


def cut_after(proxy: TcpProxy, limit: int) -> object:
    def progress(done: int, size: int) -> None:
        if done >= limit:
            proxy.cut()
    return progress


def test_put_cut_mid_file_resumes_from_what_arrived(link: tuple[harness.HostInfo, TcpProxy, Target],
                                                    tmp_path: Path) -> None:
    info, proxy, target = link
    data = os.urandom(24 * MB)
    local = tmp_path / "weights.bin"
    local.write_bytes(data)
    dest = f"/tmp/put-{os.getpid()}/weights.bin"
    harness.in_host(info, "mkdir", "-p", os.path.dirname(dest))
    with pytest.raises(SSHError, match=r"^box: connection lost: the connection dropped during the "
                       r"upload of .*weights\.bin"):
        executor(target).put(local, dest, progress=cut_after(proxy, 8 * MB))  # type: ignore[arg-type]
    assert not info.path(dest).exists()  # never half a file under its name
    arrived = settled_size(info.path(os.path.dirname(dest) + "/.weights.bin.part"))
    assert 0 < arrived < len(data)

    before = proxy.sent
    done = executor(target).put(local, dest)
    assert done.resumed_from == arrived and done.size == len(data)
    assert done.sha256 == hashlib.sha256(data).hexdigest()
    assert info.path(dest).read_bytes() == data
    assert not info.path(os.path.dirname(dest) + "/.weights.bin.part").exists()
    # only the rest went over the link again (plus SSH's own traffic and the SFTP framing)
    assert proxy.sent - before < len(data) - arrived + 2 * MB


def test_get_cut_mid_file_resumes_and_checks_the_hash(link: tuple[harness.HostInfo, TcpProxy, Target],
                                                      tmp_path: Path) -> None:
    info, proxy, target = link
    data = os.urandom(16 * MB)
    src = f"/tmp/get-{os.getpid()}.bin"
    info.path(src).write_bytes(data)
    local = tmp_path / "down" / "ckpt.pt"
    with pytest.raises(SSHError, match="connection lost"):
        executor(target).get(src, local, progress=cut_after(proxy, 6 * MB))  # type: ignore[arg-type]
    assert not local.exists()
    part = local.with_name(".ckpt.pt.part")
    assert 0 < part.stat().st_size < len(data)
    done = executor(target).get(src, local)
    assert done.resumed_from == part.stat().st_size if part.exists() else done.resumed_from > 0
    assert local.read_bytes() == data and done.sha256 == hashlib.sha256(data).hexdigest()
    with pytest.raises(ProvisionError, match=r"/tmp/no-such-file: no such file on the host"):
        executor(target).get("/tmp/no-such-file", tmp_path / "x")


def test_a_lost_link_during_a_command_is_one_named_line(link: tuple[harness.HostInfo, TcpProxy,
                                                                    Target]) -> None:
    _, proxy, target = link
    ex = executor(target)
    ex.run(Command(("true",)), step="probe")
    threading.Timer(1.0, proxy.cut).start()
    with pytest.raises(SSHError, match=r"^box: connection lost: the connection dropped during "
                       r"'probe'.* run the task again$"):
        ex.run(Command(("sleep", "10")), step="probe")
    # between commands a dropped link is opened again (Fabric reconnects, with our host-key pin)
    proxy.cut()
    assert ex.run(Command(("echo", "back")), step="probe").stdout == "back\n"


def test_a_task_with_a_lock_of_its_own_streams_its_log_and_resumes(
        link: tuple[harness.HostInfo, TcpProxy, Target]) -> None:
    """A body under its own lock runs while the provisioning lock is held; its log streams as
    it grows; after a cut, a reader resumes from the bytes it had, with nothing repeated."""
    info, proxy, target = link
    holder = harness.hold_host_lock(info, "hold-host")
    with pytest.raises(ProvisionError, match="another run holds the lock on this host"):
        run_detached(executor(target), "other", "true", inputs="o")

    body = "for i in 1 2 3 4 5 6; do echo \"line $i\"; sleep 0.5; done; echo '{\"n\": 6}' > \"$RESULT\""
    seen: list[str] = []

    def on_line(line: str) -> None:
        seen.append(line)
        if line == "line 2":
            proxy.cut()

    with pytest.raises(ProvisionError, match="the connection was lost during step 'counter'"):
        run_detached(executor(target), "counter", body, inputs="c", lock="counter",
                     on_line=on_line)
    offset = sum(len(x.encode()) + 1 for x in seen)
    rest: list[str] = []
    r = run_detached(executor(target), "counter", body, inputs="c", lock="counter",
                     offset=offset, on_line=rest.append)
    assert seen[:2] == ["line 1", "line 2"]
    assert [*seen, *rest] == [f"line {i}" for i in range(1, 7)]  # each line once, in order
    assert r.result == {"n": 6} and r.size == offset + len("".join(rest)) + len(rest)
    holder.join(timeout=30)
