"""Kept connections (provision/remote/keep.py) against real sshd: one handshake serves many
commands, and a kept connection is exactly as safe as a fresh one."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Hosts, gpu_provision
from tests.sandbox import harness
from tests.sandbox.proxy import TcpProxy
from tests.sandbox.remote import wait_for_boot

pytestmark = pytest.mark.sandbox


def handshakes(info: harness.HostInfo) -> int:
    """Logins sshd accepted (one per SSH connection)."""
    log = Path(info.root) / "upper/var/log/gpu-sandbox-sshd.log"
    return sum("Accepted publickey" in ln for ln in log.read_text(errors="replace").splitlines())


def session_sshds(info: harness.HostInfo) -> list[int]:
    """The per-connection sshd processes of this host (not its listener; no other host's)."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            root = os.readlink(d / "root")
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if root.startswith(info.root) and cmd.startswith("sshd: root"):
            found.append(int(d.name))
    assert found
    return found


class Kept:
    """The program with keeping on, its keepers in a run dir of this test's own."""

    def __init__(self, home: Path):
        self.home = home
        self.run_dir = harness.keeper_dir() / uuid.uuid4().hex[:8]  # short: a socket path
        self.env = {"GPU_PROVISION_KEEP": "120", "GPU_PROVISION_RUN_DIR": str(self.run_dir)}

    def __call__(self, *args: str, keep: int | None = None, timeout: int = 120,
                 cwd: Path | None = None, extra: dict[str, str] | None = None
                 ) -> subprocess.CompletedProcess[str]:
        env = dict(self.env, **({"GPU_PROVISION_KEEP": str(keep)} if keep is not None else {}),
                   **(extra or {}))
        return gpu_provision(*args, home=self.home, env=env, timeout=timeout, cwd=cwd)

    def ok(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        r = self(*args, **kw)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert "Traceback" not in r.stderr
        return r

    def listed(self) -> list[dict[str, Any]]:
        """The kept connections (not the warm start: provision/cli/warm.py)."""
        rows = json.loads(self.ok("keepers", "--json").stdout)
        return [r for r in rows if not r.get("warm_start")]

    def pids(self) -> list[int]:
        return harness.keeper_pids(self.run_dir)


@pytest.fixture()
def kept(gp_home: Path) -> Iterator[Kept]:
    k = Kept(gp_home)
    yield k
    harness.stop_keepers(k.run_dir)
    assert k.pids() == []


def test_many_commands_one_handshake_then_keepers_stop(hosts: Hosts, kept: Kept,
                                                       tmp_path: Path) -> None:
    info = hosts.get("cpu-only")
    before = handshakes(info)
    facts = json.loads(kept.ok("-H", info.inventory, "facts", "--json").stdout)
    assert facts["hostname"] == info.id
    sessions = len(info.sessions())
    again = json.loads(kept.ok("-H", info.inventory, "facts", "--json").stdout)
    assert again["boot_id"] == facts["boot_id"]
    kept.ok("-H", info.inventory, "jobs", "--json")
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(os.urandom(5_000_000))  # > 100 pipelined SFTP writes
    kept.ok("-H", info.inventory, "sync", "up", str(data), "--dest", "/root/kept-data",
            "--transport", "sftp")
    assert info.path("/root/kept-data/a.bin").read_bytes() == (data / "a.bin").read_bytes()
    assert len(info.sessions()) > sessions  # they ran on the host ...
    assert handshakes(info) == before + 1  # ... over the one connection of the first command

    [k] = kept.listed()
    assert k["host"] == info.id and k["channels"] == 0 and k["keep"] == 120
    assert 0 <= k["idle"] < 60 and k["age"] >= k["idle"]
    assert len(kept.pids()) == 1
    r = kept.ok("keepers", "--stop", info.id)
    assert "stopped 1" in r.stdout
    harness.wait_until(lambda: not kept.pids(), "the keeper to end")
    assert kept.listed() == []
    kept.ok("-H", info.inventory, "facts", "--json")  # and a new one serves the next command
    assert handshakes(info) == before + 2


def test_socket_is_ours_alone(hosts: Hosts, kept: Kept) -> None:
    info = hosts.get("cpu-only")
    kept.ok("-H", info.inventory, "facts", "--json")
    [sock] = [p for p in kept.run_dir.iterdir() if p.is_socket()]
    assert len(str(sock).encode()) < 104  # macOS sun_path
    assert stat.S_IMODE(kept.run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert sock.stat().st_uid == os.getuid()
    # another local user may neither open the socket nor list the folder
    probe = textwrap.dedent(f"""
        import os, socket
        try:
            os.listdir({str(kept.run_dir)!r}); print("listed")
        except PermissionError:
            print("no list")
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect({str(sock)!r}); print("connected")
        except PermissionError:
            print("no connect")
    """)
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                        sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert r.stdout.split() == ["no", "list", "no", "connect"], r.stdout + r.stderr


def test_a_keeper_ends_when_idle_for_its_keep_time(hosts: Hosts, kept: Kept) -> None:
    info = hosts.get("cpu-only")
    kept.ok("-H", info.inventory, "facts", "--json", keep=3)
    [pid] = kept.pids()
    ended = time.monotonic()
    harness.wait_until(lambda: not kept.pids(), "the keeper to end", timeout=30)
    assert time.monotonic() - ended < 10
    # the warm start (provision/cli/warm.py) has the same idle time: it ends too
    harness.wait_until(lambda: not harness.keeper_pids(kept.run_dir, harness.WARM),
                       "the warm server to end", timeout=30)
    assert not [p for p in kept.run_dir.iterdir() if p.is_socket()]
    before = handshakes(info)
    kept.ok("-H", info.inventory, "facts", "--json", keep=3)
    assert handshakes(info) == before + 1


def test_a_dead_connection_is_replaced_within_the_command(hosts: Hosts, kept: Kept) -> None:
    info = hosts.fresh("cpu-only")
    try:
        kept.ok("-H", info.inventory, "facts", "--json")
        [first] = kept.pids()
        # the connection's sshd dies (the listener stays): the keeper holds a dead transport
        for pid in session_sshds(info):
            os.kill(pid, signal.SIGKILL)
        before = handshakes(info)
        r = kept.ok("-H", info.inventory, "facts", "--json")
        assert json.loads(r.stdout)["hostname"] == info.id and r.stderr == ""
        assert handshakes(info) == before + 1
        assert first not in kept.pids()

        # the host reboots between two commands
        boot = json.loads(kept.ok("-H", info.inventory, "facts", "--json").stdout)["boot_id"]
        harness.in_host(info, "reboot", check=False)
        wait_for_boot(info, 1)
        r = kept.ok("-H", info.inventory, "facts", "--json")
        assert json.loads(r.stdout)["boot_id"] != boot and r.stderr == ""
        assert len(kept.pids()) == 1
    finally:
        harness.stop(info.id)


def test_a_changed_host_key_is_refused_with_a_keeper_alive(hosts: Hosts, kept: Kept) -> None:
    info = hosts.fresh("cpu-only")
    try:
        kept.ok("-H", info.inventory, "facts", "--json")
        known = (kept.home / "known_hosts").read_text()
        assert len(kept.pids()) == 1
        harness.in_host(info, "sh", "-c", "rm /etc/gpu-sandbox/ssh_host_ed25519_key* && ssh-keygen"
                        " -q -t ed25519 -N '' -f /etc/gpu-sandbox/ssh_host_ed25519_key")
        harness.in_host(info, "reboot", check=False)
        wait_for_boot(info, 1)
        sessions = len(info.sessions())
        r = kept("-H", info.inventory, "facts", "--json")
        assert r.returncode == 1 and "host key changed" in r.stderr, r.stderr
        assert len(info.sessions()) == sessions, "nothing may run on a host with a changed key"
        assert (kept.home / "known_hosts").read_text() == known
        assert kept.listed() == [] and kept.pids() == []
        kept.ok("-H", info.inventory, "repin")
        kept.ok("-H", info.inventory, "facts", "--json")
    finally:
        harness.stop(info.id)


def test_repin_and_forget_host_key_end_the_keeper(hosts: Hosts, kept: Kept) -> None:
    info = hosts.get("cpu-only")
    kept.ok("-H", info.inventory, "facts", "--json")
    [first] = kept.pids()
    kept.ok("-H", info.inventory, "forget-host-key")
    harness.wait_until(lambda: first not in kept.pids(), "forget-host-key to end the keeper")
    kept.ok("-H", info.inventory, "facts", "--json")  # pins again, and keeps again
    [second] = kept.pids()
    kept.ok("-H", info.inventory, "repin")
    harness.wait_until(lambda: second not in kept.pids(), "repin to end the keeper")


def test_two_inventories_to_one_host_never_share(hosts: Hosts, kept: Kept,
                                                 tmp_path: Path) -> None:
    info = hosts.get("cpu-only")
    other = info.inventory_with(tmp_path / "other-name.yaml")
    before = handshakes(info)
    kept.ok("-H", info.inventory, "facts", "--json")
    kept.ok("-H", other, "facts", "--json")
    kept.ok("-H", info.inventory, "facts", "--json")
    kept.ok("-H", other, "facts", "--json")
    assert handshakes(info) == before + 2
    assert sorted(k["host"] for k in kept.listed()) == sorted([info.id, "other-name"])
    # the same address with -i and user@host:port is another identity again
    kept.ok("-i", info.key, "-H", f"root@{info.host}:{info.port}", "facts", "--json")
    assert len(kept.listed()) == 3 and handshakes(info) == before + 3
    r = kept("--no-keep", "-H", info.inventory, "facts", "--json")
    assert r.returncode == 0 and handshakes(info) == before + 4 and len(kept.pids()) == 3


CLIENT = """
import sys
from provision.config.inventory import load_inventory
from provision.remote.command import Command
from provision.remote.connection import connect
from provision.remote.executor import Executor
ex = Executor(connect(load_inventory(__import__("pathlib").Path(sys.argv[1]))), "box")
print("started", flush=True)
ex.run(Command(("sleep", "60")), step="long")
"""


def test_ctrl_c_of_one_client_leaves_the_keepers_other_channels(hosts: Hosts, kept: Kept,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    from provision.config.inventory import load_inventory
    from provision.remote.command import Command
    from provision.remote.connection import connect
    from provision.remote.executor import Executor

    info = hosts.get("cpu-only")
    kept.ok("-H", info.inventory, "facts", "--json")  # the keeper is there
    for k, v in {**kept.env, "GPU_PROVISION_HOME": str(kept.home)}.items():
        monkeypatch.setenv(k, v)
    ex = Executor(connect(load_inventory(Path(info.inventory))), info.id)
    lines: list[str] = []
    result: list[Any] = []
    counting = threading.Thread(target=lambda: result.append(ex.run(
        Command(("sh", "-c", "for i in $(seq 1 30); do echo $i; sleep 0.1; done")),
        step="count", on_out=lines.append)))
    counting.start()
    harness.wait_until(lambda: lines, "the first line")
    other = subprocess.Popen([sys.executable, "-c", CLIENT, info.inventory], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ})
    assert other.stdout is not None and other.stdout.readline().strip() == "started"
    time.sleep(0.5)
    other.send_signal(signal.SIGINT)
    assert other.wait(timeout=10) != 0  # interrupted
    counting.join(timeout=60)
    [r] = result
    assert r.exit_code == 0 and lines == [str(i) for i in range(1, 31)]
    assert ex.run(Command(("true",)), step="after").exit_code == 0
    ex.conn.close()
    assert len(kept.pids()) == 1 and kept.listed()[0]["channels"] == 0


class SilentProxy(TcpProxy):
    """A NAT or proxy that forgets the connections open now without a word (no FIN, no RST):
    what they carry is dropped; new connections pass."""

    def __init__(self, target: tuple[str, int]):
        self.silenced: set[socket.socket] = set()
        super().__init__(target)

    def silence(self) -> None:
        with self.lock:
            self.silenced |= set(self.conns)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if src not in self.silenced:
                    dst.sendall(data)
        except OSError:
            pass
        if src not in self.silenced:
            self._close(src, dst)


def test_a_silently_dropped_link_is_replaced_within_the_timeout(hosts: Hosts, kept: Kept,
                                                               tmp_path: Path) -> None:
    info = hosts.get("cpu-only")
    proxy = SilentProxy((info.host, info.port))
    try:
        inv = info.inventory_with(tmp_path / "via.yaml", host="127.0.0.1", port=proxy.port)
        kept.ok("-H", inv, "facts", "--json")
        [first] = kept.pids()
        proxy.silence()  # the keeper's connection now leads nowhere, and it cannot tell yet
        before, started = handshakes(info), time.monotonic()
        r = kept.ok("-t", "3", "-H", inv, "facts", "--json")
        assert json.loads(r.stdout)["hostname"] == info.id and r.stderr == ""
        # it waited out the timeout on the dead link (no sooner: nothing had told it), no longer
        assert 3 <= time.monotonic() - started < 3 + 20
        assert handshakes(info) == before + 1
        harness.wait_until(lambda: first not in kept.pids(), "the old keeper to end", timeout=15)
    finally:
        proxy.close()


class OneWayProxy(SilentProxy):
    """A link that fails one way: what the keeper sends still reaches the host (the host acts on
    it), and nothing the host says comes back."""

    def silence(self) -> None:
        with self.lock:
            self.silenced |= {c for c in self.conns if self._towards_host(c)}

    def _towards_host(self, conn: socket.socket) -> bool:
        try:
            return bool(conn.getpeername()[1] == self.target[1])
        except OSError:
            return False  # a connection already closed


@pytest.mark.parametrize("ending", ["the answer times out", "the keeper is stopped"])
def test_a_command_whose_answer_never_came_back_runs_once(hosts: Hosts, kept: Kept,
                                                          tmp_path: Path, ending: str) -> None:
    """The link dies just after the command's exec left the keeper: the host runs it, and its
    answer never comes; the command's wait ends by its timeout, or by the keeper ending first
    (`keepers --stop`, its own check of the link). The command fails saying it may have started
    (not sent again through a fresh connection: the host would run it twice); a read (facts) on
    the same dead link runs again on a fresh one."""
    info = hosts.get("cpu-only")
    proxy = OneWayProxy((info.host, info.port))
    mark = f"ran-once-{uuid.uuid4().hex[:8]}"
    try:
        inv = info.inventory_with(tmp_path / "via.yaml", host="127.0.0.1", port=proxy.port)
        kept.ok("-H", inv, "facts", "--json")
        [first] = kept.pids()
        time.sleep(1)  # the keeper's spare channel is open: the exec costs one message
        proxy.silence()
        if ending == "the keeper is stopped":
            threading.Timer(3, lambda: kept.ok("keepers", "--stop")).start()
        r = kept("-t", "3" if ending == "the answer times out" else "60", "-H", inv, "shell",
                 "--", "bash", "-c", f"echo ran >> ~/{mark}")
        assert r.returncode != 0
        assert "it may have started on the host, so it is not sent again" in r.stderr, r.stderr
        harness.wait_until(lambda: first not in kept.pids(), "the old keeper to end", timeout=30)
        r = kept.ok("-H", inv, "shell", "--", "cat", mark)
        assert r.stdout == "ran\n"  # once
        [second] = kept.pids()
        time.sleep(1)
        proxy.silence()
        before = handshakes(info)
        r = kept.ok("-t", "3", "-H", inv, "facts", "--json")
        assert json.loads(r.stdout)["hostname"] == info.id
        assert handshakes(info) == before + 1  # it only reads: run again on a fresh link
    finally:
        kept("-H", info.inventory, "shell", "--", "rm", "-f", mark)
        proxy.close()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_forwards_and_pty_shells_ride_the_keeper(hosts: Hosts, kept: Kept,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from provision.config.inventory import load_inventory
    from provision.remote.connection import connect
    from provision.remote.keep import KeptConnection

    info = hosts.get("cpu-only")
    kept.ok("-H", info.inventory, "facts", "--json")
    before = handshakes(info)
    for k, v in {**kept.env, "GPU_PROVISION_HOME": str(kept.home)}.items():
        monkeypatch.setenv(k, v)
    conn = connect(load_inventory(Path(info.inventory)))
    assert isinstance(conn, KeptConnection)
    try:
        # a local port forwarded through the host to the mirror (direct-tcpip)
        mirror = urllib.parse.urlsplit(info.mirror["pypi"])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            local = s.getsockname()[1]
        with conn.forward_local(local, remote_port=mirror.port, remote_host="127.0.0.1"):
            # Fabric's forward_local returns before its listener is bound (tunnels.py)
            harness.wait_until(lambda: _listening(local), "the forwarded port", timeout=30)
            with urllib.request.urlopen(f"http://127.0.0.1:{local}{mirror.path}/",
                                        timeout=30) as page:
                assert page.status == 200 and b"<a " in page.read()
        # an interactive shell on a pty
        chan = conn.transport.open_session()
        chan.get_pty("xterm", 100, 30)
        chan.invoke_shell()
        chan.resize_pty(120, 40)
        chan.sendall("stty size; echo kept-$((40+2)); exit 3\n")
        out = b""
        while data := chan.recv(4096):
            out += data
        assert b"40 120" in out and b"kept-42" in out
        assert chan.recv_exit_status() == 3
    finally:
        conn.close()
    assert handshakes(info) == before


def test_commands_at_once_share_one_keeper_per_host(hosts: Hosts, kept: Kept,
                                                    tmp_path: Path) -> None:
    info = hosts.get("cpu-only")
    other = info.inventory_with(tmp_path / "second.yaml")  # another identity: its own keeper
    kept.ok("-H", info.inventory, "facts", "--json")  # pins the key
    kept.ok("keepers", "--stop")
    harness.wait_until(lambda: not kept.pids(), "the keeper to end")
    before = handshakes(info)
    env = dict(os.environ, GPU_PROVISION_HOME=str(kept.home), COLUMNS="200", **kept.env)
    procs = [subprocess.Popen([sys.executable, "-m", "provision", "-H", inv, "facts", "--json"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for inv in (info.inventory,) * 3]
    procs.append(subprocess.Popen([sys.executable, "-m", "provision", "-H",
                                   f"{info.inventory},{other}", "facts", "--json"], cwd=ROOT,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True))
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert handshakes(info) == before + 2  # one per identity, however many commands at once
    assert sorted(k["host"] for k in kept.listed()) == sorted([info.id, "second"])


def test_a_frozen_keeper_loses_the_command_on_it_within_its_heartbeats(hosts: Hosts,
                                                                       kept: Kept) -> None:
    """The keeper stops (SIGSTOP, a wedged process) under a running command: the command ends
    with a lost connection after the missed heartbeats (relay.HEARTBEAT x MISSED: 20 s), not
    never; the next command gets a keeper of its own and runs."""
    from provision.remote import relay
    info = hosts.get("cpu-only")
    kept.ok("-H", info.inventory, "facts", "--json")
    [keeper] = kept.pids()
    env = dict(os.environ, GPU_PROVISION_HOME=str(kept.home), **kept.env)
    cmd = subprocess.Popen([sys.executable, "-m", "provision", "-H", info.inventory, "shell", "--",
                            "bash", "-c", "echo started; sleep 60; echo done"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert cmd.stdout is not None and cmd.stdout.readline() == "started\n"
        os.kill(keeper, signal.SIGSTOP)
        frozen = time.monotonic()
        out, err = cmd.communicate(timeout=60)
        took = time.monotonic() - frozen
        assert cmd.returncode == 1 and "done" not in out and "connection lost" in err, err
        assert took < relay.HEARTBEAT * relay.MISSED + 10, took
    finally:
        os.kill(keeper, signal.SIGCONT)
        if cmd.poll() is None:
            cmd.kill()
    os.kill(keeper, signal.SIGKILL)  # (the test's own: its socket is left behind)
    r = kept.ok("-H", info.inventory, "facts", "--json")
    assert json.loads(r.stdout)["hostname"] == info.id


def test_a_command_that_closes_its_output_is_not_taken_for_a_frozen_keeper(
        hosts: Hosts, kept: Kept) -> None:
    """`exec > log 2>&1; python train.py`: the host's channel sends EOF and then nothing until
    the exit status, for longer than the missed heartbeats allow; the keeper beats until the
    status, so the command ends with its own exit code."""
    from provision.remote import relay
    info = hosts.get("cpu-only")
    quiet = int(relay.HEARTBEAT * relay.MISSED) + 4
    r = kept("-H", info.inventory, "shell", "--", "bash", "-c",
             f"echo before; exec > /dev/null 2>&1; sleep {quiet}; exit 3", timeout=quiet + 60)
    assert (r.returncode, r.stdout) == (3, "before\n"), r.stderr
