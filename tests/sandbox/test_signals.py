"""Ctrl-C on `shell -- CMD` and connections to addresses nothing answers, with the real programs:
the OpenSSH server of sandbox hosts (which passes a signal request on, or refuses it, as its
version and the login decide), and network namespaces whose routes lead nowhere."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Hosts
from tests.sandbox import harness
from tests.sandbox.test_hands import Running

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def box(hosts: Hosts) -> Iterator[tuple[harness.HostInfo, str]]:
    """A host that root logs in to."""
    info = hosts.fresh("cpu-only")
    yield info, info.inventory
    harness.stop(info.id)


# --- shell -- CMD and Ctrl-C ------------------------------------------------------------------

def _processes(*argv: str) -> list[int]:
    """Pids whose argv is exactly ``argv`` (the sandbox hosts share this machine's pids)."""
    want = ("\0".join(argv) + "\0").encode()
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "cmdline").read_bytes() == want:
                found.append(int(p.name))
        except OSError:
            continue
    return found


def _until(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _ctrl_c_shell_command(inv: str, home: Path, cwd: Path, seconds: str) -> tuple[int, float,
                                                                                  Running]:
    """`shell -- sleep SECONDS` (stdin not a terminal: no pty), SIGINT sent to our program once
    the sleep runs on the host; (its exit code, seconds from SIGINT to its end, its output)."""
    env = dict(os.environ, GPU_PROVISION_HOME=str(home), COLUMNS="200")
    gp = Running([sys.executable, "-m", "provision", "-H", inv, "shell", "--", "sleep", seconds],
                 env, cwd)
    try:
        _until(lambda: _processes("sleep", seconds), 60, f"sleep {seconds} never started: "
               f"{gp.err}")
        started = time.monotonic()
        gp.proc.send_signal(signal.SIGINT)
        code = gp.proc.wait(30)
        return code, time.monotonic() - started, gp
    finally:
        if gp.proc.poll() is None:
            gp.proc.kill()


def _sshd_log(info: harness.HostInfo) -> str:
    log = Path(info.root) / "upper/var/log/gpu-sandbox-sshd.log"
    return log.read_text(errors="replace") if log.exists() else ""


ALICE = {"user": "alice", "uid": 2003, "sudo": False}


def test_ctrl_c_reaches_the_command_through_sshd(hosts: Hosts, gp_home: Path,
                                                 tmp_path: Path) -> None:
    """A login that is not root: the host's sshd (OpenSSH 9.2, post-auth privilege separated)
    acts on the SSH "signal" request and sends SIGINT to the command's process group; the
    command is gone at once and the exit code says so (130 = 128 + SIGINT)."""
    info = hosts.fresh("cpu-only", login=ALICE)
    try:
        code, took, gp = _ctrl_c_shell_command(info.inventory, gp_home, tmp_path, "6017")
        assert code == 130, gp.err
        assert took < 2.5, took  # the signal itself, not the second session GRACE later
        _until(lambda: not _processes("sleep", "6017"), 10, "the sleep outlived Ctrl-C")
        # nothing to say: the command ended, its code came back, as with plain ssh
        assert not any("interrupted" in line for line in gp.err), gp.err
        assert "signal" not in _sshd_log(info)  # no refusal
    finally:
        harness.stop(info.id)


def test_ctrl_c_as_root_where_sshd_refuses_signals(box: tuple[harness.HostInfo, str],
                                                   gp_home: Path, tmp_path: Path) -> None:
    """root on OpenSSH 9.2: sshd refuses signal requests for root logins before 9.8, so the
    command's process group is signalled from a second session at once (no request sent)."""
    info, inv = box
    code, took, gp = _ctrl_c_shell_command(inv, gp_home, tmp_path, "6018")
    assert code == 130, gp.err
    assert took < 2.5, took
    _until(lambda: not _processes("sleep", "6018"), 10, "the sleep outlived Ctrl-C")
    assert "session signalling requires privilege separation" not in _sshd_log(info)
    assert not list(info.path("/root/.gpu-provision/shells").iterdir())  # its note removed


def test_ctrl_c_where_sshd_refuses_the_signal_request(hosts: Hosts, gp_home: Path,
                                                      tmp_path: Path) -> None:
    """A key with a forced command (authorized_keys command="..."): sshd refuses the signal
    request (session.c session_signal_req, any version), which the client cannot know before;
    a few seconds later the command's process group is signalled from a second session."""
    info = hosts.fresh("cpu-only", login=ALICE)
    try:
        keys = info.path("/home/alice/.ssh/authorized_keys")
        keys.write_text(f'command="eval \\"$SSH_ORIGINAL_COMMAND\\"" {keys.read_text()}')
        code, took, gp = _ctrl_c_shell_command(info.inventory, gp_home, tmp_path, "6019")
        assert code == 130, gp.err
        assert 2.5 < took < 10, took  # the request's GRACE, then the second session
        _until(lambda: not _processes("sleep", "6019"), 10, "the sleep outlived Ctrl-C")
        assert "refusing to send signal INT to forced-command session" in _sshd_log(info)
    finally:
        harness.stop(info.id)


# --- an address nothing answers ---------------------------------------------------------------

# A network namespace whose only way out is a gateway that swallows every packet (a veth pair,
# the gateway's MAC pinned so no ARP is asked): a SYN to 10.255.255.1 leaves and nothing ever
# comes back, as on a real network where an address is routed nowhere.
BLACKHOLE = ("ip link set lo up && ip link add v0 type veth peer name v1 && ip link set v0 up && "
             "ip link set v1 up && ip addr add 192.0.2.1/24 dev v0 && "
             "ip route add default via 192.0.2.254 dev v0 && "
             "ip neigh add 192.0.2.254 lladdr 02:00:00:00:00:01 dev v0 nud permanent && "
             'exec "$@"')


needs_netns = pytest.mark.skipif(shutil.which("ip") is None or shutil.which("unshare") is None,
                                 reason="needs iproute2 and unshare (make system-deps)")


def _connect_in_blackhole(host: str, limit: int, home: Path, cwd: Path) -> tuple[str, float]:
    """`facts` against ``host`` from inside the namespace: (its one error line, seconds run)."""
    argv = [sys.executable, "-m", "provision", "-H", f"root@{host}", "-i",
            str(harness.client_key()), "-t", str(limit), "facts"]
    env = dict(os.environ, GPU_PROVISION_HOME=str(home), COLUMNS="200")
    started = time.monotonic()
    r = subprocess.run(["unshare", "--net", "bash", "-c", BLACKHOLE, "blackhole", *argv],
                       capture_output=True, text=True, env=env, cwd=cwd, timeout=60)
    took = time.monotonic() - started
    assert r.returncode == 1, r.stderr
    [line] = r.stderr.strip().splitlines()
    return line, took


@needs_netns
@pytest.mark.parametrize("limit", [2, 4])
def test_an_unroutable_address_is_a_timeout_of_the_wait_it_was(gp_home: Path, tmp_path: Path,
                                                               limit: int) -> None:
    line, took = _connect_in_blackhole("10.255.255.1", limit, gp_home, tmp_path)
    m = re.fullmatch(r"error: root@10\.255\.255\.1:22: timeout: no answer from 10\.255\.255\.1:22 "
                     r"(within|after) (\d+)s .*", line)
    assert m, line
    said = int(m.group(2))
    # the seconds it names are the wait there was: at least that long, and the rest of the run
    # (the program's start, under load) is the difference
    assert said == limit and said <= took < said + 4, (line, took)


@needs_netns
def test_an_address_on_the_link_that_nobody_has_is_no_route_after_the_wait(
        gp_home: Path, tmp_path: Path) -> None:
    """192.0.2.77 is on the namespace's own link and nobody answers ARP for it: the kernel gives
    up after its neighbour probes (about 3 s, EHOSTUNREACH), well before -t 20: the message
    names that wait, not -t, and says it is no route rather than a refusal."""
    line, took = _connect_in_blackhole("192.0.2.77", 20, gp_home, tmp_path)
    m = re.fullmatch(r"error: root@192\.0\.2\.77:22: unreachable: no route to 192\.0\.2\.77:22 "
                     r"after (\d+)s \(.*", line)
    assert m, line
    said = int(m.group(1))
    assert 1 <= said <= took < 20 and took < said + 4, (line, took)
