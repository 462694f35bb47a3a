"""Host-key pinning and classified SSH failures, against real sshd."""

from __future__ import annotations

import socket
import subprocess
import threading
from pathlib import Path

import pytest

from tests.conftest import Hosts, gpu_provision
from tests.sandbox import harness
from tests.sandbox.remote import wait_for_boot

pytestmark = pytest.mark.sandbox


def test_first_use_pins_then_changed_key_stops_then_repin(hosts: Hosts, gp_home: Path) -> None:
    info = hosts.fresh("cpu-only")
    try:
        r = gpu_provision("-H", info.inventory, "facts", home=gp_home)
        assert r.returncode == 0, r.stderr
        assert "pinned on first use" in r.stderr
        known = (gp_home / "known_hosts").read_text()
        assert "inventory:" in known and "ssh-ed25519" in known

        r = gpu_provision("-H", info.inventory, "facts", home=gp_home)
        assert r.returncode == 0 and "pinned" not in r.stderr  # silent once pinned

        # the machine behind the same address and port is replaced: a new host key
        harness.in_host(info, "sh", "-c", "rm /etc/gpu-sandbox/ssh_host_ed25519_key* && ssh-keygen"
                        " -q -t ed25519 -N '' -f /etc/gpu-sandbox/ssh_host_ed25519_key")
        harness.in_host(info, "reboot", check=False)  # a reboot may kill its caller
        wait_for_boot(info, 1)
        sessions = len(info.sessions())
        r = gpu_provision("-H", info.inventory, "facts", home=gp_home)
        assert r.returncode == 1
        assert "host key changed" in r.stderr and "re-pin with: gpu-provision -H" in r.stderr
        assert "repin" in r.stderr and "Traceback" not in r.stderr
        assert len(info.sessions()) == sessions, "nothing may run on a host with a changed key"
        assert (gp_home / "known_hosts").read_text() == known

        r = gpu_provision("-H", info.inventory, "repin", home=gp_home)
        assert r.returncode == 0 and "re-pinned" in r.stderr
        r = gpu_provision("-H", info.inventory, "facts", home=gp_home)
        assert r.returncode == 0, r.stderr
    finally:
        harness.stop(info.id)


def test_adhoc_host_is_pinned_by_host_and_port(hosts: Hosts, gp_home: Path) -> None:
    info = hosts.get("cpu-only")
    r = gpu_provision("-i", info.key, "-H", f"root@{info.host}:{info.port}", "facts",
                      home=gp_home)
    assert r.returncode == 0, r.stderr
    assert f"[{info.host}]:{info.port}" in (gp_home / "known_hosts").read_text()


def test_auth_refused_is_named(hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    info = hosts.get("cpu-only")
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    r = gpu_provision("-i", str(other), "-H", f"root@{info.host}:{info.port}", "facts",
                      home=gp_home, env={"HOME": str(tmp_path)})
    assert r.returncode == 1 and ": auth refused:" in r.stderr and "Traceback" not in r.stderr
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]  # one, with the fix
    assert r.stderr.endswith(line + "\n")
    assert f"refused key {other} and the agent's and ~/.ssh/id_* keys" in line
    assert "pass the right key with -i KEY" in line
    assert line.endswith(f"gpu-provision -H root@{info.host}:{info.port} authorize")


def any_key(tmp_path: Path) -> str:
    """A key file for a login that never gets as far as using it (without one the tool stops
    before connecting: no usable key)."""
    key = tmp_path / "id_unused"
    key.write_text("unused\n")
    return str(key)


def test_connection_refused(gp_home: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = gpu_provision("-i", any_key(tmp_path), "-H", f"root@127.0.0.1:{port}", "facts",
                      home=gp_home)
    assert r.returncode == 1 and "connection refused" in r.stderr


def test_timeout_on_a_silent_server(gp_home: Path, tmp_path: Path) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    conns = []
    t = threading.Thread(target=lambda: conns.append(srv.accept()), daemon=True)
    t.start()
    try:
        r = gpu_provision("-i", any_key(tmp_path), "-H", f"root@127.0.0.1:{srv.getsockname()[1]}",
                          "facts", home=gp_home, env={"GPU_PROVISION_CONNECT_TIMEOUT": "2"})
        assert r.returncode == 1 and ": timeout:" in r.stderr and "within 2s" in r.stderr
    finally:
        srv.close()


def test_name_not_resolved(gp_home: Path, tmp_path: Path) -> None:
    r = gpu_provision("-i", any_key(tmp_path), "-H", "root@no-such-host.invalid:22", "facts",
                      home=gp_home)
    assert r.returncode == 1 and "name not resolved" in r.stderr


def test_nothing_listens_outside_loopback(hosts: Hosts) -> None:
    hosts.get("cpu-only")
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
    ours = [ln for ln in out.splitlines() if "sshd" in ln or "python" in ln]
    assert ours
    for line in ours:
        local = line.split()[3]
        assert local.startswith("127.") or local.startswith("[::1]"), line
