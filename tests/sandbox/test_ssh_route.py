"""The user's ~/.ssh/config, against real sshd: targets that only a bastion reaches.

The bastions are sandbox hosts started with ``jump=True``: they listen on 127.0.0.x here, and
their logins (and so ProxyJump's direct-tcpip channels) run in a network namespace of their own
(tests/sandbox/hostd.py). The targets are sandbox hosts started ``behind`` a bastion, listening
on 127.0.0.x inside that namespace: a connection from here is refused, so only a route through
the bastion reaches them. Each machine takes its own key: the bastions (one logs in as a user
of its own) take one, the targets another, so a hop that used the wrong key fails.
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox


@dataclass
class Net:
    b1: harness.HostInfo  # the bastion, login "jumper"
    b2: harness.HostInfo  # a second bastion, reached only through b1
    t1: harness.HostInfo  # behind b1
    t2: harness.HostInfo  # behind b2
    bastion_key: Path
    target_key: Path


def _keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f",
                    str(path)], check=True)
    return path


def _authorize(info: harness.HostInfo, user: str, key: Path) -> None:
    home = Path(info.root) / ("home" if user == "root" else f"upper/home/{user}")
    (home / ".ssh/authorized_keys").write_text(key.with_suffix(".pub").read_text())


@pytest.fixture(scope="module")
def net(sandbox_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    keys = tmp_path_factory.mktemp("route-keys")
    bk, tk = _keygen(keys / "bastion_key"), _keygen(keys / "target_key")
    started: list[harness.HostInfo] = []
    try:
        b1 = harness.start("cpu-only", jump=True, login={"user": "jumper"})
        started.append(b1)
        b2 = harness.start("cpu-only", jump=True, behind=b1)
        started.append(b2)
        t1 = harness.start("cpu-only", behind=b1)
        started.append(t1)
        t2 = harness.start("cpu-only", behind=b2)
        started.append(t2)
        for info, user, key in ((b1, "jumper", bk), (b1, "root", bk), (b2, "root", bk),
                                (t1, "root", tk), (t2, "root", tk)):
            _authorize(info, user, key)
        yield Net(b1, b2, t1, t2, bk, tk)
    finally:
        for info in reversed(started):
            harness.stop(info.id)


def host_key(info: harness.HostInfo) -> str:
    """The host's own public key (type and base64), as its sshd presents it."""
    pub = Path(info.root) / "upper/etc/gpu-sandbox/ssh_host_ed25519_key.pub"
    return " ".join(pub.read_text().split()[:2])


def pins(home: Path) -> dict[str, str]:
    known = home / "known_hosts"
    rows = [ln.split() for ln in known.read_text().splitlines()] if known.exists() else []
    return {r[0]: f"{r[1]} {r[2]}" for r in rows}


def accepted(info: harness.HostInfo, user: str) -> int:
    log = Path(info.root) / "upper/var/log/gpu-sandbox-sshd.log"
    return log.read_text(errors="replace").count(f"Accepted publickey for {user} ")


def config_text(net: Net, extra: str = "") -> str:
    """The user's ~/.ssh/config: targets by alias, bastions with their own user, port, key."""
    b1, b2, t1, t2 = net.b1, net.b2, net.t1, net.t2
    return f"""{extra}
Host lab
  HostName {t1.host}
  Port {t1.port}
  User root
  ProxyJump jump1
  IdentityFile {net.bastion_key.parent}/not-there
  IdentityFile {net.target_key}

Host lab2
  HostName {t2.host}
  Port {t2.port}
  User root
  ProxyJump jump1,jump2
  IdentityFile {net.target_key}

Host jump1
  HostName {b1.host}
  Port {b1.port}
  User jumper
  IdentityFile {net.bastion_key}
  IdentitiesOnly yes

Host jump2
  HostName {b2.host}
  Port {b2.port}
  User root
  IdentityFile {net.bastion_key}
  # reached with -J jump1, as ssh does: this line is not followed
  ProxyJump nowhere.invalid
"""


class User:
    """A user of the program: a home with ~/.ssh/config, our state folder, keeping on or off."""

    def __init__(self, tmp: Path, net: Net, keep: bool, extra: str = ""):
        self.home, self.state = tmp / "home", tmp / "gp-home"
        (self.home / ".ssh").mkdir(parents=True)
        self.state.mkdir()
        self.config = self.home / ".ssh/config"
        self.config.write_text(config_text(net, extra))
        self.run_dir = harness.keeper_dir() / uuid.uuid4().hex[:8]
        self.env = {"HOME": str(self.home), "GPU_PROVISION_KEEP": "120" if keep else "0",
                    "GPU_PROVISION_RUN_DIR": str(self.run_dir)}

    def __call__(self, *args: str, timeout: int = 180,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return gpu_provision(*args, home=self.state, env={**self.env, **(env or {})},
                             timeout=timeout)

    def ok(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        r = self(*args, **kw)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        assert "Traceback" not in r.stderr
        return r

    def keepers(self) -> list[dict[str, Any]]:
        rows = json.loads(self.ok("keepers", "--json").stdout)
        return [r for r in rows if not r.get("warm_start")]

    def stop(self) -> None:
        harness.stop_keepers(self.run_dir)


@pytest.fixture(params=[True, False], ids=["kept", "fresh"])
def user(request: pytest.FixtureRequest, net: Net, tmp_path: Path) -> Iterator[User]:
    u = User(tmp_path, net, keep=request.param)
    yield u
    u.stop()


def test_the_targets_are_reachable_only_through_the_bastions(net: Net) -> None:
    for t in (net.t1, net.t2, net.b2):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((t.host, t.port), timeout=5)
    with socket.create_connection((net.b1.host, net.b1.port), timeout=5) as s:
        assert s.recv(4) == b"SSH-"


def test_proxyjump_one_hop_facts_shell_and_sync(net: Net, user: User, tmp_path: Path) -> None:
    """Today's bug: with ProxyJump in ~/.ssh/config, facts went straight to the address."""
    jumps = accepted(net.b1, "jumper")
    facts = json.loads(user.ok("-H", "lab", "facts", "--json").stdout)
    assert facts["hostname"] == net.t1.id
    assert accepted(net.b1, "jumper") == jumps + 1  # through the bastion, as its own user
    # each hop pinned, under its own address, with its own key
    assert pins(user.state) == {f"[{net.b1.host}]:{net.b1.port}": host_key(net.b1),
                                f"[{net.t1.host}]:{net.t1.port}": host_key(net.t1)}
    r = user.ok("-H", "lab", "shell", "--", "hostname")
    assert r.stdout.strip() == net.t1.id
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("through the bastion\n")
    user.ok("-H", "lab", "sync", "up", str(data), "--dest", "/root/routed")
    assert net.t1.path("/root/routed/a.txt").read_text() == "through the bastion\n"
    kept = user.keepers()
    if user.env["GPU_PROVISION_KEEP"] != "0":
        assert len(kept) == 1  # the one connection served all three commands
        assert accepted(net.b1, "jumper") == jumps + 1
    else:
        assert kept == [] and accepted(net.b1, "jumper") == jumps + 3


def test_proxyjump_two_hops_each_pinned(net: Net, user: User) -> None:
    facts = json.loads(user.ok("-H", "lab2", "facts", "--json").stdout)
    assert facts["hostname"] == net.t2.id
    got = pins(user.state)
    assert got == {f"[{h.host}]:{h.port}": host_key(h) for h in (net.b1, net.b2, net.t2)}
    r = user.ok("-H", "lab2", "shell", "--", "cat", "/proc/sys/kernel/random/boot_id")
    assert r.stdout.strip() == facts["boot_id"]


def _proxy_ssh(net: Net, tmp: Path) -> str:
    """OpenSSH's client as ProxyCommand to the bastion, trusting exactly its key."""
    known = tmp / "bastion_known_hosts"
    known.write_text(f"[{net.b1.host}]:{net.b1.port} {host_key(net.b1)}\n")
    return shlex.join(["ssh", "-F", "none", "-o", "BatchMode=yes", "-o",
                       f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
                       "-i", str(net.bastion_key), "-p", str(net.b1.port),
                       f"jumper@{net.b1.host}"])


@pytest.mark.parametrize("style", ["ssh -W", "nc-style"])
def test_proxycommand(net: Net, user: User, tmp_path: Path, style: str) -> None:
    """``ssh -W %h:%p``, and a command on the bastion that carries the raw stream (bash's
    /dev/tcp where netcat is not installed: what `ssh bastion nc %h %p` does)."""
    ssh = _proxy_ssh(net, tmp_path)
    command = f"{ssh} -W %h:%p" if style == "ssh -W" else \
        f"{ssh} {shlex.quote('exec 3<>/dev/tcp/%h/%p; cat <&3 & exec cat >&3')}"
    user.config.write_text(f"Host lab-pc\n  HostName {net.t1.host}\n  Port {net.t1.port}\n"
                           f"  IdentityFile {net.target_key}\n  ProxyCommand {command}\n"
                           + user.config.read_text())
    facts = json.loads(user.ok("-H", "lab-pc", "facts", "--json").stdout)
    assert facts["hostname"] == net.t1.id
    # the target pinned by us; the bastion is the proxy command's own business
    assert pins(user.state) == {f"[{net.t1.host}]:{net.t1.port}": host_key(net.t1)}
    assert user.ok("-H", "lab-pc", "shell", "--", "hostname").stdout.strip() == net.t1.id


def test_include_pattern_order_and_the_command_line(net: Net, tmp_path: Path) -> None:
    """An included file's block comes first; a later general block fills only what it left;
    -H user@ beats the configuration's User."""
    u = User(tmp_path, net, keep=False)
    inc = u.home / ".ssh/conf.d"
    inc.mkdir()
    (inc / "lab.conf").write_text(f"Host lab-inc lab-*\n  HostName {net.t1.host}\n"
                                  f"  Port {net.t1.port}\n  ProxyJump jump1\n"
                                  f"  IdentityFile {net.target_key}\n")
    u.config.write_text(f"Include {inc}/*.conf\n" + u.config.read_text()
                        + "\nHost *\n  Port 1\n  User nobody\n")
    r = u("-H", "lab-inc", "facts", "--json")
    assert r.returncode == 1 and "nobody@" in r.stderr  # User came from the later block
    facts = json.loads(u.ok("-H", "root@lab-inc", "facts", "--json").stdout)
    assert facts["hostname"] == net.t1.id
    # -S FILE: that file alone, as ssh -F (the user's file is not read)
    alone = tmp_path / "alone.conf"
    alone.write_text(config_text(net).replace("Host lab\n", "Host lab-s\n"))
    facts = json.loads(u.ok("-S", str(alone), "-H", "lab-s", "facts", "--json").stdout)
    assert facts["hostname"] == net.t1.id
    r = u("-S", str(alone), "-H", "lab-inc", "facts")
    assert r.returncode != 0 and "nobody@" not in r.stderr


def test_a_refused_option_is_named_with_its_line(net: Net, tmp_path: Path) -> None:
    u = User(tmp_path, net, keep=True)
    u.config.write_text(u.config.read_text().replace(
        "  IdentitiesOnly yes\n", "  IdentitiesOnly yes\n  BindAddress 127.0.0.99\n"))
    line = next(i for i, ln in enumerate(u.config.read_text().splitlines(), 1)
                if "BindAddress" in ln)
    sessions = len(net.t1.sessions())
    r = u("-H", "lab", "facts")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"~/.ssh/config:{line}: BindAddress: '127.0.0.99' (for jump1) cannot be honoured" \
        in r.stderr
    assert len(net.t1.sessions()) == sessions and u.keepers() == []
    assert not (u.state / "known_hosts").exists()  # nothing was connected to
    u.stop()


def test_a_changed_bastion_key_names_the_hop_and_its_repin(net: Net, tmp_path: Path) -> None:
    u = User(tmp_path, net, keep=False)
    u.ok("-H", "lab", "facts")
    before = pins(u.state)
    harness.in_host(net.b1, "sh", "-c", "rm /etc/gpu-sandbox/ssh_host_ed25519_key* && "
                    "ssh-keygen -q -t ed25519 -N '' -f /etc/gpu-sandbox/ssh_host_ed25519_key")
    sessions = len(net.t1.sessions())
    r = u("-H", "lab", "facts")
    assert r.returncode == 1 and "host key changed" in r.stderr
    assert f"the jump host jump1 (jumper@{net.b1.host}:{net.b1.port})" in r.stderr
    assert "gpu-provision -H lab repin --hop jump1" in r.stderr
    assert len(net.t1.sessions()) == sessions and pins(u.state) == before
    u.ok("-H", "lab", "repin", "--hop", "jump1")
    assert pins(u.state)[f"[{net.b1.host}]:{net.b1.port}"] == host_key(net.b1)
    assert pins(u.state)[f"[{net.t1.host}]:{net.t1.port}"] == \
        before[f"[{net.t1.host}]:{net.t1.port}"]
    assert json.loads(u.ok("-H", "lab", "facts", "--json").stdout)["hostname"] == net.t1.id


def test_failures_name_the_leg(net: Net, tmp_path: Path) -> None:
    """A bastion that never answers, a bastion that cannot reach the target, a target that
    refuses the key: each message says which machine on the way it was."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the TCP handshake completes, no SSH banner ever comes
    u = User(tmp_path, net, keep=False, extra=f"""
Host lab-silent
  HostName {net.t1.host}
  ProxyJump root@127.0.0.1:{silent.getsockname()[1]}
  IdentityFile {net.target_key}
Host lab-nothing
  HostName {net.t1.host}
  Port 1
  ProxyJump jump1
  IdentityFile {net.target_key}
Host lab-wrongkey
  HostName {net.t1.host}
  Port {net.t1.port}
  ProxyJump jump1
  IdentityFile {net.bastion_key}
  IdentitiesOnly yes
""")
    try:
        r = u("-H", "lab-silent", "-t", "3", "facts")
        port = silent.getsockname()[1]
        assert r.returncode == 1 and f": timeout: the jump host root@127.0.0.1:{port}" in r.stderr
        r = u("-H", "lab-nothing", "facts")
        assert r.returncode == 1 and "connection refused" in r.stderr
        assert f"the jump host jump1 (jumper@{net.b1.host}:{net.b1.port}) could not reach" \
            in r.stderr
        r = u("-H", "lab-wrongkey", "facts")
        assert r.returncode == 1 and ": auth refused: " in r.stderr
        assert "at the target itself, reached through jump1" in r.stderr
        assert "Traceback" not in r.stderr
    finally:
        silent.close()


def test_identity_agent_by_path(net: Net, tmp_path: Path) -> None:
    """The target's key only in an agent that IdentityAgent names ($SSH_AUTH_SOCK unset), as
    1Password's or Secretive's agent is set up."""
    sock = tmp_path / "agent.sock"
    started = subprocess.run(["ssh-agent", "-a", str(sock)], capture_output=True, text=True,
                             check=True)
    pid = started.stdout.split("SSH_AGENT_PID=", 1)[1].split(";", 1)[0]
    try:
        subprocess.run(["ssh-add", str(net.target_key)], env={"SSH_AUTH_SOCK": str(sock)},
                       check=True, capture_output=True)
        u = User(tmp_path, net, keep=False, extra=f"""
Host lab-agent
  HostName {net.t1.host}
  Port {net.t1.port}
  ProxyJump jump1
  IdentityAgent {sock}
""")
        r = u.ok("-H", "lab-agent", "shell", "--", "hostname", env={"SSH_AUTH_SOCK": ""})
        assert r.stdout.strip() == net.t1.id
    finally:
        subprocess.run(["ssh-agent", "-k"], env={"SSH_AGENT_PID": pid}, capture_output=True)


def test_two_routes_to_one_target_are_two_keepers(net: Net, tmp_path: Path) -> None:
    u = User(tmp_path, net, keep=True)
    ssh = _proxy_ssh(net, tmp_path)
    u.config.write_text(f"Host lab-pc\n  HostName {net.t1.host}\n  Port {net.t1.port}\n"
                        f"  IdentityFile {net.target_key}\n  ProxyCommand {ssh} -W %h:%p\n"
                        + u.config.read_text())
    try:
        assert u.ok("-H", "lab", "shell", "--", "hostname").stdout.strip() == net.t1.id
        assert u.ok("-H", "lab-pc", "shell", "--", "hostname").stdout.strip() == net.t1.id
        assert len(u.keepers()) == 2
        jumps = accepted(net.b1, "jumper")
        u.ok("-H", "lab", "shell", "--", "true")  # each finds its own again
        u.ok("-H", "lab-pc", "shell", "--", "true")
        assert len(u.keepers()) == 2 and accepted(net.b1, "jumper") == jumps
    finally:
        u.stop()


def test_ssh_config_blocks_go_the_same_way(net: Net, tmp_path: Path) -> None:
    """`ssh-config --write` for a host behind two bastions: plain OpenSSH, through our blocks,
    takes the route and trusts exactly our pin at every hop."""
    u = User(tmp_path, net, keep=False)
    u.ok("-H", "lab2", "facts")
    u.ok("-H", "lab2", "ssh-config", "--write")
    alias = f"{net.t2.host}-{net.t2.port}"

    def plain_ssh() -> subprocess.CompletedProcess[str]:
        # -F: OpenSSH reads the passwd entry's home, not $HOME; it passes -F on to each jump
        return subprocess.run(["ssh", "-F", str(u.config), "-o", "BatchMode=yes", alias,
                               "hostname"], capture_output=True, text=True, timeout=60)
    r = plain_ssh()
    assert r.returncode == 0 and r.stdout.strip() == net.t2.id, r.stderr
    # the second bastion's key is no longer the pinned one: ssh refuses that hop
    harness.in_host(net.b2, "sh", "-c", "rm /etc/gpu-sandbox/ssh_host_ed25519_key* && "
                    "ssh-keygen -q -t ed25519 -N '' -f /etc/gpu-sandbox/ssh_host_ed25519_key")
    r = plain_ssh()
    assert r.returncode != 0 and "Host key verification failed" in r.stderr


def test_an_open_openssh_master_is_refused_and_none_is_fine(net: Net, tmp_path: Path) -> None:
    """ssh would send its session over a master open at ControlPath (and so neither log in
    nor follow the configuration's route): we stop, naming the line; without one, we go."""
    u = User(tmp_path, net, keep=False)
    cm = tmp_path / "cm"
    known = tmp_path / "known"
    known.write_text(f"[{net.b1.host}]:{net.b1.port} {host_key(net.b1)}\n")
    u.config.write_text(f"Host jump1\n  ControlMaster auto\n  ControlPath {cm}\n"
                        f"  UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n"
                        + u.config.read_text())
    ssh = ["ssh", "-F", str(u.config), "-o", "BatchMode=yes"]
    subprocess.run([*ssh, "-M", "-N", "-f", "jump1"], check=True, timeout=60,
                   capture_output=True)
    try:
        assert cm.is_socket()
        r = u("-H", "lab", "facts")
        assert r.returncode == 1
        assert f"~/.ssh/config:3: ControlPath: '{cm}' (for jump1) cannot be honoured" in r.stderr
        assert "ssh -O exit jump1" in r.stderr
    finally:
        subprocess.run([*ssh, "-O", "exit", "jump1"], timeout=60, capture_output=True)
    assert not cm.exists()
    assert json.loads(u.ok("-H", "lab", "facts", "--json").stdout)["hostname"] == net.t1.id
