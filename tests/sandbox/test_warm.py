"""The warm start (provision/cli/warm.py): with connections kept, a command to a host is served
by a worker forked from a loaded copy of the program, and it is that command in all a user sees:
output, errors, exit code, working folder, environment, Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Hosts
from tests.sandbox import harness
from tests.sandbox.test_keep import Kept

pytestmark = pytest.mark.sandbox


@pytest.fixture()
def kept(gp_home: Path) -> Iterator[Kept]:
    k = Kept(gp_home)
    yield k
    harness.stop_keepers(k.run_dir)
    assert k.pids() == [] and warm_pids(k) == []


def warm_pids(k: Kept) -> list[int]:
    """The warm server and its workers (a worker is a fork: the same command line)."""
    return harness.keeper_pids(k.run_dir, harness.WARM)


def warm_rows(k: Kept) -> list[dict[str, Any]]:
    rows = json.loads(k.ok("keepers", "--json").stdout)
    return [r for r in rows if r.get("warm_start")]


def served(k: Kept) -> int:
    [row] = warm_rows(k)
    return int(row["served"])


def warmed(k: Kept, *args: str) -> None:
    """Run a first command here; it leaves a warm server, which this waits for."""
    k.ok(*args)
    harness.wait_until(lambda: len(warm_pids(k)) == 1 and warm_rows(k), "the warm server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def popen(k: Kept, *args: str, ignore: tuple[signal.Signals, ...] = ()) -> subprocess.Popen[str]:
    """``ignore``: signals the program starts with ignored (as `nohup` starts it: SIGHUP)."""
    env = {**os.environ, **k.env, "GPU_PROVISION_HOME": str(k.home), "COLUMNS": "200"}
    # a process group of its own, as a shell gives each job: a group whose parent is in the same
    # session is not orphaned, so Ctrl-Z (SIGTSTP) stops it; the kernel discards SIGTSTP in an
    # orphaned group, which is what a test run started by setsid or nohup would otherwise be
    return subprocess.Popen([sys.executable, "-m", "provision", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            process_group=0,
                            preexec_fn=lambda: [signal.signal(g, signal.SIG_IGN) for g in ignore])


def test_a_warm_worker_is_the_command_itself(hosts: Hosts, kept: Kept, tmp_path: Path) -> None:
    info = hosts.get("cpu-only")
    warmed(kept, "-H", info.inventory, "jobs", "--json")
    before = served(kept)
    facts = json.loads(kept.ok("-H", info.inventory, "facts", "--json").stdout)
    assert facts["hostname"] == info.id
    assert served(kept) == before + 1  # that one was served warm

    # the client's own folder: a relative inventory path is read from there
    here = tmp_path / "project"
    here.mkdir()
    shutil.copy(info.inventory, here / "box.yaml")
    r = kept("-H", "box.yaml", "jobs", "--json", cwd=here)
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stderr
    # an error: its words on stderr, its exit code ours
    r = kept("-H", str(here / "missing.yaml"), "jobs", cwd=here)
    assert r.returncode == 1 and "missing.yaml: inventory file not found" in r.stderr
    assert "Traceback" not in r.stderr
    # the client's environment, read when the command runs (not when the server started)
    r = kept("-H", "box.yaml", "jobs", cwd=here, extra={"GPU_PROVISION_CONNECT_TIMEOUT": "soon"})
    assert r.returncode != 0 and "GPU_PROVISION_CONNECT_TIMEOUT" in r.stderr, r.stderr
    assert served(kept) == before + 4
    # off with --no-keep: runs here (and serves nothing warm)
    kept.ok("-H", info.inventory, "--no-keep", "jobs", "--json")
    assert served(kept) == before + 4


def server(k: Kept) -> int:
    [row] = warm_rows(k)
    return int(row["pid"])


def state(pid: int) -> str:
    """A process's state letter (/proc/PID/stat): R running, S sleeping, T stopped."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_ctrl_c_and_a_killed_client_end_their_worker(hosts: Hosts, kept: Kept) -> None:
    info = hosts.get("cpu-only")
    warmed(kept, "-H", info.inventory, "jobs", "--json")
    port = free_port()
    forwarder = popen(kept, "-H", info.inventory, "forward", f"8999:{port}")
    assert forwarder.stdout is not None
    assert f"http://127.0.0.1:{port}" in forwarder.stdout.readline()
    assert "forwarding until Ctrl-C" in forwarder.stdout.readline()
    # the host refusing the tunnel (nothing listens there) is not a lost connection
    assert "nothing listens on" in forwarder.stdout.readline()
    assert len(warm_pids(kept)) == 2 and not free(port)  # the worker holds the local port
    [worker] = [p for p in warm_pids(kept) if p != server(kept)]
    forwarder.send_signal(signal.SIGTSTP)  # Ctrl-Z: the worker stops with us ...
    harness.wait_until(lambda: state(worker) == "T", "the worker to stop", timeout=30)
    forwarder.send_signal(signal.SIGCONT)  # ... and goes on with us
    harness.wait_until(lambda: state(worker) in "RS", "the worker to go on", timeout=30)
    forwarder.send_signal(signal.SIGINT)  # to our process: passed on to the worker
    assert forwarder.wait(timeout=30) == 0
    assert "stopped forwarding" in forwarder.stdout.read()
    harness.wait_until(lambda: len(warm_pids(kept)) == 1 and free(port), "the worker to end",
                       timeout=20)

    killed = popen(kept, "-H", info.inventory, "forward", f"8999:{port}")
    assert killed.stdout is not None and "http://" in killed.stdout.readline()
    killed.kill()  # no chance to say anything: the worker notices its client is gone
    killed.wait(timeout=10)
    harness.wait_until(lambda: len(warm_pids(kept)) == 1 and free(port),
                       "the orphan worker to end and let go of the port", timeout=20)


def test_keepers_stop_ends_the_warm_start(hosts: Hosts, kept: Kept) -> None:
    info = hosts.get("cpu-only")
    warmed(kept, "-H", info.inventory, "jobs", "--json")
    r = kept.ok("keepers", "--stop")
    assert "1 warm start" in r.stdout
    harness.wait_until(lambda: not warm_pids(kept), "the warm server to end", timeout=20)
    assert warm_rows(kept) == []
    start = time.monotonic()
    kept.ok("-H", info.inventory, "jobs", "--json")  # runs here again, and warms up anew
    assert time.monotonic() - start < 60
    harness.wait_until(lambda: len(warm_pids(kept)) == 1, "a new warm server")


def test_a_killed_servers_socket_is_replaced(hosts: Hosts, kept: Kept) -> None:
    info = hosts.get("cpu-only")
    warmed(kept, "-H", info.inventory, "jobs", "--json")
    [pid] = warm_pids(kept)
    [sock] = [p for p in kept.run_dir.glob("w-*") if p.is_socket()]
    os.kill(pid, signal.SIGKILL)  # no chance to remove its socket
    harness.wait_until(lambda: not warm_pids(kept), "the server to die", timeout=10)
    assert sock.exists()
    kept.ok("-H", info.inventory, "jobs", "--json")  # runs here, and starts a new server
    harness.wait_until(lambda: warm_rows(kept), "a new warm server at the same socket")
    [row] = warm_rows(kept)
    assert row["pid"] != pid and row["served"] == 0
    kept.ok("-H", info.inventory, "jobs", "--json")
    assert served(kept) == 1


def test_a_frozen_server_holds_neither_ctrl_c_nor_the_command(hosts: Hosts, kept: Kept) -> None:
    """A warm server that never answers (stopped, wedged): Ctrl-C ends the client at once; a
    command left alone runs here after a bounded wait; and when the server wakes, the requests
    it then reads run nowhere (at most once: the worker's first word goes to a closed socket)."""
    info = hosts.fresh("cpu-only")  # with an env (as test_hands' box), for `run`
    harness.in_host(info, "python3", "-m", "venv", "--without-pip", "/root/envs/torch")
    info.path("/root/.gpu-provision").mkdir(exist_ok=True)
    info.path("/root/.gpu-provision/expected.json").write_text(json.dumps(
        {"conda_root": "/root/envs/torch", "env_prefix": "/root/envs/torch"}, indent=1))
    warmed(kept, "-H", info.inventory, "jobs", "--json")
    pid = server(kept)
    once = info.path("/root/once.txt")
    once.unlink(missing_ok=True)
    os.kill(pid, signal.SIGSTOP)
    try:
        for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM),
                          (signal.SIGHUP, -signal.SIGHUP)):
            waiting = popen(kept, "-H", info.inventory, "jobs", "--json")
            time.sleep(1.5)  # it has sent its request and waits for the worker's pid
            asked = time.monotonic()
            waiting.send_signal(sig)
            out, _ = waiting.communicate(timeout=10)
            assert time.monotonic() - asked < 2, f"{sig.name} waited for the frozen server"
            assert waiting.returncode == code and "Traceback" not in out, (sig.name, out)
        started = time.monotonic()
        alone = kept("-H", info.inventory, "run", "--json", "--no-code", "--workdir", "/root",
                     "--", "bash", "-c", "echo ran >> /root/once.txt")
        assert alone.returncode == 0, alone.stderr
        assert time.monotonic() - started < 60  # the wait for the server is bounded (10 s)
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        harness.wait_until(lambda: once.exists() and once.read_text() == "ran\n",
                           "the job's line")
        time.sleep(3)  # the woken server has read both requests by now
        assert once.read_text() == "ran\n"  # the job ran once, not again from the woken server
    finally:
        harness.stop(info.id)


def test_signals_the_shell_told_it_to_ignore_stay_ignored(hosts: Hosts, kept: Kept) -> None:
    """`nohup gpu-provision ... &`: a hangup reaches neither the client nor its warm worker."""
    info = hosts.get("cpu-only")
    warmed(kept, "-H", info.inventory, "jobs", "--json")
    port = free_port()
    hup = popen(kept, "-H", info.inventory, "forward", f"8999:{port}", ignore=(signal.SIGHUP,))
    assert hup.stdout is not None and "http://" in hup.stdout.readline()
    assert len(warm_pids(kept)) == 2  # served warm
    hup.send_signal(signal.SIGHUP)
    time.sleep(2)
    assert hup.poll() is None and len(warm_pids(kept)) == 2 and not free(port)
    hup.send_signal(signal.SIGINT)
    assert hup.wait(timeout=30) == 0
    harness.wait_until(lambda: len(warm_pids(kept)) == 1 and free(port), "the worker to end",
                       timeout=20)
