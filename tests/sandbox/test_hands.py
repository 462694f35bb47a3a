"""The renter's hands on a sandbox host, with the real programs: `shell -- CMD` and an interactive
`shell` through a real pty (a typed command, the window size and its change, Ctrl-C, the exit
code), `ssh-config` driven by the real OpenSSH client with StrictHostKeyChecking yes, and
`forward` to a real HTTP server on the host (and to a model server's stand-in).

The host gets what a bootstrap leaves for these tasks to find: a real venv (python3 -m venv) and
~/.gpu-provision/expected.json naming it. (Bootstrap itself is test_bootstrap.py's; a full one
costs a minute of CPU that adds nothing here.)"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.ops.login import login_block_script
from tests.conftest import ROOT, Hosts, Link, gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox
ENV = "/root/envs/torch"
WORK = "/root/work"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def box(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.HostInfo, str]]:
    """A host with a venv as its env (named where bootstrap names it) and a data dir."""
    info = hosts.fresh("cpu-only")
    harness.in_host(info, "python3", "-m", "venv", "--without-pip", ENV)
    harness.in_host(info, "mkdir", "-p", WORK)
    state = info.path("/root/.gpu-provision")
    state.mkdir(exist_ok=True)
    (state / "expected.json").write_text(json.dumps({"conda_root": ENV, "env_prefix": ENV},
                                                    indent=1))
    inv = info.inventory_with(tmp_path_factory.mktemp("inv") / "box.yaml", data_dir=WORK)
    yield info, inv
    harness.stop(info.id)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- shell ----------------------------------------------------------------------------------

def test_shell_command_runs_in_the_env_in_the_data_dir(box: tuple[harness.HostInfo, str],
                                                       gp_home: Path, tmp_path: Path,
                                                       link: Link) -> None:
    info, inv = box
    hostile = ["a b", "it's", "$(id)", "; rm -rf /"]
    r = gpu_provision("-H", inv, "shell", "--", "python", "-c",
                      "import os, sys; print(sys.prefix); print(os.getcwd()); "
                      "print(sys.argv[1:])", *hostile, home=gp_home, cwd=tmp_path, env=link.env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [ENV, WORK, repr(hostile)]
    # the exit code is the command's; stderr stays stderr; stdin reaches it
    r = gpu_provision("-H", inv, "shell", "--", "bash", "-c", "echo oops >&2; exit 7",
                      home=gp_home, cwd=tmp_path, env=link.env)
    assert (r.returncode, r.stdout, r.stderr.strip().splitlines()[-1]) == (7, "", "oops")
    e = dict(os.environ, GPU_PROVISION_HOME=str(gp_home), **link.env)
    p = subprocess.run([sys.executable, "-m", "provision", "-H", inv, "shell", "--", "wc", "-c"],
                       input="twelve bytes", capture_output=True, text=True, env=e, cwd=tmp_path,
                       timeout=120)
    assert p.stdout.strip() == "12", p.stderr
    # a megabyte each way, whole (through a keeper: relayed frames, their windows)
    blob = os.urandom(1 << 20).hex()
    p = subprocess.run([sys.executable, "-m", "provision", "-H", inv, "shell", "--", "cat"],
                       input=blob, capture_output=True, text=True, env=e, cwd=tmp_path,
                       timeout=120)
    assert p.stdout == blob, p.stderr
    # one word with shell syntax is a command line, as ssh takes it; a program the host lacks
    # is named as such
    r = gpu_provision("-H", inv, "shell", "--", "printf 'a\\nb\\nc\\n' | head -2 | wc -l",
                      home=gp_home, cwd=tmp_path, env=link.env)
    assert (r.returncode, r.stdout.strip()) == (0, "2"), r.stderr
    r = gpu_provision("-H", inv, "shell", "--", "no-such-tool", "--version", home=gp_home,
                      cwd=tmp_path, env=link.env)
    assert r.returncode == 127 and "no-such-tool: command not found on the host (PATH: " \
        in r.stderr and "line " not in r.stderr, r.stderr
    # no run folder for a shell
    assert not (tmp_path / "logs").exists()
    assert link.went_through_a_keeper()


class Terminal:
    """The program on a real pty, as a terminal user runs it."""

    def __init__(self, argv: list[str], env: dict[str, str], rows: int, cols: int):
        self.master, slave = pty.openpty()
        self.resize(rows, cols)
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                     start_new_session=True)
        os.close(slave)
        self.seen = b""

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def expect(self, pattern: str, timeout: float = 30) -> str:
        """Read until ``pattern`` (a regex) shows; returns what was read since the last match."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern.encode(), self.seen)
            if m:
                text, self.seen = self.seen[:m.end()], self.seen[m.end():]
                return text.decode(errors="replace")
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.seen += os.read(self.master, 4096)
                except OSError:  # the program ended and closed the pty
                    break
        raise AssertionError(f"{pattern!r} never showed; the terminal has: {self.seen[-800:]!r}")


def test_interactive_shell_through_a_pty(box: tuple[harness.HostInfo, str], gp_home: Path,
                                        link: Link) -> None:
    """A typed command runs in the env and the data dir; the host's pty has this window's size
    and follows it; Ctrl-C interrupts what runs there (not us); `exit 5` is our exit code."""
    _, inv = box
    env = dict(os.environ, GPU_PROVISION_HOME=str(gp_home), TERM="xterm", **link.env)
    t = Terminal([sys.executable, "-m", "provision", "-H", inv, "shell"], env, 40, 120)
    try:
        t.expect(r"[#$] ")
        t.type("stty size; echo $((6*7)) $GPU_PROVISION_ENV; pwd\r")
        out = t.expect(rf"{WORK}\r\n")
        assert "40 120" in out and f"42 {ENV}" in out
        t.resize(50, 150)
        t.proc.send_signal(signal.SIGWINCH)  # what the terminal sends its foreground program
        time.sleep(0.5)
        t.type("stty size\r")
        t.expect(r"\b50 150\r\n")
        t.type("echo sleep-$((1+1)); sleep 30; echo not-interrupted\r")
        t.expect(r"[\r\n]sleep-2\r\n")  # (the typed line echoes "$((1+1))"; its output says 2)
        time.sleep(0.5)
        started = time.monotonic()
        t.type("\x03")  # Ctrl-C, as the keyboard sends it
        t.type("echo rc=$?\r")
        out = t.expect(r"rc=\d+")
        # (the typed line echoes the word; the command's own output would be a line of it)
        assert out.endswith("rc=130") and not re.search(r"\nnot-interrupted", out)
        assert time.monotonic() - started < 10  # not the sleep's 30 s
        assert t.proc.poll() is None  # Ctrl-C went to the host, not to us
        # SIGINT sent to the program itself (kill -INT, a terminal multiplexer): passed on as
        # the key, so it interrupts what runs on the host and the login goes on
        t.type("echo sleep-$((2+1)); sleep 30; echo not-interrupted\r")
        t.expect(r"[\r\n]sleep-3\r\n")
        time.sleep(0.5)
        t.proc.send_signal(signal.SIGINT)
        t.type("echo rc=$?\r")
        out = t.expect(r"rc=\d+")
        assert out.endswith("rc=130") and not re.search(r"\nnot-interrupted", out)
        assert t.proc.poll() is None
        t.type("exit 5\r")
        assert t.proc.wait(30) == 5
        assert link.went_through_a_keeper()
    finally:
        if t.proc.poll() is None:
            t.proc.kill()
        os.close(t.master)


def test_shell_needs_a_terminal_or_a_command(box: tuple[harness.HostInfo, str],
                                             gp_home: Path) -> None:
    _, inv = box
    r = gpu_provision("-H", inv, "shell", home=gp_home)  # stdin is no terminal here
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: shell: an interactive login needs a terminal (stdin and "
                                "stdout); for a script give the command: shell -- CMD ...")


# --- ssh-config with the real OpenSSH client ---------------------------------------------------

needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None or shutil.which("scp") is None,
                               reason="no OpenSSH client here (make system-deps)")


@needs_ssh
def test_ssh_config_lets_plain_ssh_trust_exactly_our_pin(box: tuple[harness.HostInfo, str],
                                                         gp_home: Path, tmp_path: Path) -> None:
    info, inv = box
    home = tmp_path / "user"
    (home / ".ssh").mkdir(parents=True)
    config = home / ".ssh" / "config"
    own = "Host *\n  ServerAliveInterval 30\n"
    config.write_text(own)
    env = {"HOME": str(home)}
    # before any connection there is no key to trust: said, nothing written
    r = gpu_provision("-H", inv, "ssh-config", "--write", home=gp_home, env=env)
    assert r.returncode == 1 and "no host key pinned yet; connect once first" in r.stderr
    assert config.read_text() == own
    gpu_provision("-H", inv, "shell", "--", "true", home=gp_home)  # pins the key
    for _ in range(2):
        r = gpu_provision("-H", inv, "ssh-config", "--write", home=gp_home, env=env)
        assert r.returncode == 0, r.stderr
    text = config.read_text()
    assert text.count("Include ") == 1 and text.endswith(own)
    assert text.index("Include ") < text.index("Host *")  # before any Host block
    alias = "box"
    ssh = ["ssh", "-F", str(config), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    r = subprocess.run([*ssh, alias, "echo", "hello-from", "$(hostname)"], capture_output=True,
                       text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, f"hello-from {info.id}"), r.stderr
    # scp through the same block
    local = tmp_path / "weights.bin"
    local.write_bytes(os.urandom(4096))
    r = subprocess.run(["scp", "-F", str(config), "-o", "BatchMode=yes", str(local),
                        f"{alias}:/tmp/weights.bin"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert info.path("/tmp/weights.bin").read_bytes() == local.read_bytes()
    # a login shell over plain ssh gets the env once the login block is there (bootstrap's
    # validation adds it; here the same script, run through `shell`)
    login = ["bash -lc 'command -v python || echo none'"]  # ssh joins its words for the shell
    assert subprocess.run([*ssh, alias, *login], capture_output=True, text=True,
                          timeout=60).stdout.strip() == "none"
    r = gpu_provision("-H", inv, "shell", "--", "bash", "-c", login_block_script(), home=gp_home)
    assert r.returncode == 0, r.stderr
    assert subprocess.run([*ssh, alias, *login], capture_output=True, text=True,
                          timeout=60).stdout.strip() == f"{ENV}/bin/python"
    r = gpu_provision("-H", inv, "forget-login", "--json", home=gp_home)
    assert json.loads(r.stdout)["removed"] == ["~/.bashrc", "~/.profile"], r.stderr
    assert subprocess.run([*ssh, alias, *login], capture_output=True, text=True,
                          timeout=60).stdout.strip() == "none"
    # a host presenting another key than the pinned one: plain ssh refuses it, never asks
    known = gp_home / "known_hosts"
    pinned = known.read_text()
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    name = pinned.split()[0]
    known.write_text(f"{name} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    r = subprocess.run([*ssh, alias, "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 255 and "Host key verification failed" in r.stderr
    known.write_text(pinned)
    # --remove takes our Include out again, leaving the user's own lines
    r = gpu_provision("ssh-config", "--remove", home=gp_home, env=env)
    assert r.returncode == 0 and config.read_text() == own


# --- forward --------------------------------------------------------------------------------

class Running:
    """A program run in the background, its stdout and stderr lines kept as they come."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, session: bool = False):
        """``session``: in a session (and process group) of its own, as a terminal starts it."""
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, cwd=cwd, start_new_session=session)
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._read, args=(stream, into), daemon=True).start()

    @staticmethod
    def _read(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line.rstrip("\n"))

    def wait_line(self, pattern: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.out + self.err:
                if re.search(pattern, line):
                    return line
            assert self.proc.poll() is None or time.monotonic() < deadline, self.err
            time.sleep(0.1)
        raise AssertionError(f"{pattern!r} never showed: {self.out} {self.err}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(30)


def _get(url: str) -> tuple[int, bytes]:
    with NO_PROXY.open(url, timeout=10) as r:
        return r.status, r.read()


def _get_half_closed(port: int, path: str) -> bytes:
    """A GET whose client ends its sending side after the request (a half-close, as ``nc -N``
    and some proxies do): the answer must still come back through the forward."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(1 << 16):
            got += chunk
    return got


def test_forward_waits_for_the_server_reaches_it_and_ends_with_the_job(
        box: tuple[harness.HostInfo, str], gp_home: Path, tmp_path: Path, link: Link) -> None:
    info, inv = box
    remote, local = free_port(), free_port()
    info.path(f"{WORK}/hello.txt").write_text("served from the host\n")
    big = os.urandom(3 << 20)  # many chunks each way through the pump
    info.path(f"{WORK}/big.bin").write_bytes(big)
    env = dict(os.environ, GPU_PROVISION_HOME=str(gp_home), COLUMNS="200", **link.env)
    gp = [sys.executable, "-m", "provision", "-H", inv]
    # a job that waits for a word from the test (so the forward surely meets a port nobody
    # listens on yet), prints a Jupyter-style token URL, then serves the data dir (its cwd)
    go = info.path(f"{WORK}/go-web")
    go.unlink(missing_ok=True)
    serve = (f'while [ ! -e go-web ]; do sleep 0.1; done; '
             f'echo "    http://{info.id}:{remote}/lab?token=9f86d081884c7d65"; '
             f'exec python -m http.server {remote} --bind 127.0.0.1')
    r = gpu_provision("-H", inv, "run", "--json", "--name", "web", "--no-code", "--workdir",
                      WORK, "--", "bash", "-c", serve, home=gp_home, cwd=tmp_path, env=link.env)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)["id"]
    fwd = Running([*gp, "forward", f"{remote}:{local}", "--job", job], env, tmp_path)
    try:
        assert fwd.wait_line(rf"^http://127\.0\.0\.1:{local} -> box:{remote}$")
        fwd.wait_line(rf"nothing listens on box's port {remote} yet; waiting for it")
        go.touch()
        fwd.wait_line(rf"port {remote} answers now: http://127\.0\.0\.1:{local}")
        assert _get(f"http://127.0.0.1:{local}/hello.txt") == (200, b"served from the host\n")
        for _ in range(3):  # each request a channel of its own, each whole
            assert _get(f"http://127.0.0.1:{local}/big.bin") == (200, big)
        answer = _get_half_closed(local, "/hello.txt")
        assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"served from the host\n")
        assert fwd.wait_line(r"^Jupyter: ") == \
            f"Jupyter: http://127.0.0.1:{local}/lab?token=9f86d081884c7d65"
        # this machine's other addresses do not reach it: 127.0.0.1 only
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(3)
            s.connect(("127.0.0.2", local))
        assert link.went_through_a_keeper()
        # the forward lives as long as the job
        assert gpu_provision("-H", inv, "kill", job, "--grace", "1", home=gp_home,
                             env=link.env).returncode == 0
        assert fwd.proc.wait(60) == 0
        fwd.wait_line(rf"job {job} ended: stopped forwarding")
        assert not [line for line in fwd.err if "Traceback" in line or "Error:" in line], fwd.err
    finally:
        fwd.stop()
        gpu_provision("-H", inv, "kill", job, "--grace", "1", home=gp_home, env=link.env)


def test_forward_checks_that_the_model_server_answers(box: tuple[harness.HostInfo, str],
                                                      gp_home: Path, tmp_path: Path,
                                                      link: Link) -> None:
    """The path a serving recipe's forward takes, with a stand-in for vLLM: the port opens, the
    model list answers 503 while it loads, then 200 with the model (tests/fixtures/serving/)."""
    info, inv = box
    remote, local = free_port(), free_port()  # (the sandbox host shares this machine's ports)
    for name in ("vllm-v1-models.json", "ollama-api-tags.json"):
        shutil.copy(ROOT / "tests/fixtures/serving" / name, info.path(f"{WORK}/{name}"))
    shutil.copy(ROOT / "tests/sandbox/serving_standin.py", info.path(f"{WORK}/standin.py"))
    info.path(f"{WORK}/loaded").unlink(missing_ok=True)
    env = dict(os.environ, GPU_PROVISION_HOME=str(gp_home), COLUMNS="200", **link.env)
    fwd = Running([sys.executable, "-m", "provision", "-H", inv, "forward", f"{remote}:{local}",
                   "--check", "/v1/models", "--json"], env, tmp_path)
    job = ""
    try:
        fwd.wait_line(rf"nothing listens on box's port {remote} yet")
        r = gpu_provision("-H", inv, "run", "--json", "--no-code", "--workdir", WORK, "--",
                          "python", "standin.py", str(remote), WORK, f"{WORK}/loaded",
                          home=gp_home, cwd=tmp_path, env=link.env)
        assert r.returncode == 0, r.stderr
        job = json.loads(r.stdout)["id"]
        fwd.wait_line(r"GET /v1/models: 503 .*; trying again")
        info.path(f"{WORK}/loaded").touch()  # the model has loaded
        fwd.wait_line(r"GET /v1/models: 200 models: facebook/opt-125m", timeout=60)
        shown = json.loads("\n".join(fwd.out))
        [port] = shown["ports"]
        assert port == {"remote": remote, "local": local, "url": f"http://127.0.0.1:{local}",
                        "moved": False}
        status, body = _get(f"http://127.0.0.1:{local}/api/tags")
        assert status == 200 and json.loads(body)["models"][0]["name"] == "gemma3"
        assert link.went_through_a_keeper()
        assert fwd.stop() == 0
        assert not [line for line in fwd.err if "Traceback" in line], fwd.err
    finally:
        fwd.stop()
        if job:
            gpu_provision("-H", inv, "kill", job, "--grace", "1", home=gp_home, env=link.env)


def test_forward_bad_input_is_one_line_before_connecting(box: tuple[harness.HostInfo, str],
                                                         tmp_path: Path) -> None:
    _, inv = box
    home = tmp_path / "never-connected"
    home.mkdir()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        busy = held.getsockname()[1]
        r = gpu_provision("-H", inv, "forward", f"8888:{busy}", home=home)
        assert r.returncode == 2
        [line] = r.stderr.strip().splitlines()
        assert line.startswith(f"error: forward 8888:{busy}: local port {busy} is in use on this "
                               "machine; pick another, e.g. 8888:")
    r = gpu_provision("-H", inv, "forward", "70000", home=home)
    assert (r.returncode, r.stderr.strip()) == (2, "error: forward 70000: the host's port 70000 "
                                                "is out of range (a port is 1-65535)")
    assert not (home / "known_hosts").exists()  # nothing connected


# --- run: the code goes with the job ---------------------------------------------------------

TRAIN = ("import json, os, sys\nprint('cwd', os.getcwd())\n"
         "print('lr', json.load(open('cfg/params.json'))['lr'])\nprint('argv', sys.argv[1:])\n")


def test_run_sends_the_code_and_runs_in_it(box: tuple[harness.HostInfo, str], gp_home: Path,
                                           tmp_path: Path, link: Link) -> None:
    """The working folder goes to <data dir>/<its name> (git's own list: .gitignore'd files
    stay here), the job runs there; a re-run sends only what changed; a script named that is
    nowhere is refused before anything starts, naming it."""
    info, inv = box
    proj = tmp_path / f"proj-{link.name}"  # (each way its own folder on the host)
    (proj / "cfg").mkdir(parents=True)
    (proj / "train.py").write_text(TRAIN)
    (proj / "cfg" / "params.json").write_text('{"lr": 0.01}')
    (proj / ".gitignore").write_text("*.bin\ndata/\n")
    (proj / "weights.bin").write_bytes(os.urandom(1024))
    (proj / "data").mkdir()
    (proj / "data" / "big.csv").write_text("x\n" * 1000)
    (proj / "notes.md").write_text("untracked, not ignored: sent\n")
    git = ["git", "-C", str(proj), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "train.py", "cfg", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-qm", "code"], check=True)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return gpu_provision("-H", inv, "run", *args, home=gp_home, cwd=proj, env=link.env)

    r = run("--json", "--", "python", "train.py", "--epochs", "2")
    assert r.returncode == 0, r.stderr
    there = f"{WORK}/{proj.name}"
    assert f"box: code {proj} -> {there}: sent 4 file(s)" in r.stderr
    job = json.loads(r.stdout)["id"]
    assert json.loads(r.stdout)["hosts"][0]["workdir"] == there
    logs = gpu_provision("-H", inv, "logs", job, "-f", home=gp_home, cwd=proj, env=link.env)
    assert logs.stdout.splitlines() == [f"cwd {there}", "lr 0.01", "argv ['--epochs', '2']"]
    sent = {p.relative_to(info.path(there)).as_posix()
            for p in info.path(there).rglob("*") if p.is_file()}
    assert sent == {"train.py", "cfg/params.json", ".gitignore", "notes.md"}
    # again: nothing changed, nothing sent; then one file changed, that one sent
    r = run("--", "python", "train.py")
    assert "sent 0 file(s) (0 B), 4 unchanged" in r.stderr, r.stderr
    (proj / "cfg" / "params.json").write_text('{"lr": 0.02}')
    os.utime(proj / "cfg" / "params.json", (time.time() + 5, time.time() + 5))
    r = run("--json", "--", "python", "train.py")
    assert "sent 1 file(s)" in r.stderr and "3 unchanged" in r.stderr, r.stderr
    assert r.returncode == 0 and "id" in json.loads(r.stdout), r.stdout + r.stderr
    logs = gpu_provision("-H", inv, "logs", json.loads(r.stdout)["id"], "-f", home=gp_home,
                         env=link.env)
    assert "lr 0.02" in logs.stdout.splitlines()
    # what sync down pulls into the project (a checkpoint) is not code: not sent back up
    r = gpu_provision("-H", inv, "sync", "down", f"{there}/cfg", str(proj / "ckpt"),
                      home=gp_home, cwd=proj, env=link.env)
    assert r.returncode == 0 and (proj / "ckpt" / "params.json").exists(), r.stderr
    r = run("--", "python", "train.py")
    assert "sent 0 file(s) (0 B), 4 unchanged" in r.stderr, r.stderr
    assert "not what sync down pulled here: ckpt/" in r.stderr
    # a script that is neither here nor there: refused before starting, named
    def ids() -> set[str]:
        listed = gpu_provision("-H", inv, "jobs", "--json", "--all", home=gp_home,
                               env=link.env).stdout
        return {j["id"] for j in json.loads(listed)}

    before = ids()
    r = run("--", "python", "tarin.py")
    assert r.returncode == 1
    assert (f"box: tarin.py: no such file in {there} on the host, nor in the folder sent from "
            f"this machine ({proj})") in r.stderr
    assert ids() == before
    assert link.went_through_a_keeper()
    # a --code folder that is not there: one line, before connecting
    r = run("--code", str(tmp_path / "nope"), "--", "python", "train.py")
    assert (r.returncode, r.stderr.strip()) == (
        2, f"error: --code {tmp_path / 'nope'}: no such folder here; give the project's folder "
           "(default: the current one), or --no-code")


def test_sync_takes_src_and_dest_as_scp_does(box: tuple[harness.HostInfo, str], gp_home: Path,
                                             tmp_path: Path, link: Link) -> None:
    info, inv = box
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "a.txt").write_text("a\n")
    big = os.urandom(5 << 20)  # many SFTP requests in flight (through a keeper: relayed)
    (tmp_path / "ds" / "big.bin").write_bytes(big)
    there = f"/root/elsewhere-{link.name}"
    r = gpu_provision("-H", inv, "sync", "up", "ds", there, home=gp_home, cwd=tmp_path,
                      env=link.env)
    assert r.returncode == 0, r.stderr
    assert info.path(f"{there}/a.txt").read_text() == "a\n"
    assert info.path(f"{there}/big.bin").read_bytes() == big
    assert r.stdout.splitlines()[0] == f"sync up: {tmp_path / 'ds'} -> box:{there}"
    r = gpu_provision("-H", inv, "sync", "down", there, "back", home=gp_home,
                      cwd=tmp_path, env=link.env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "back" / "a.txt").read_text() == "a\n"
    assert (tmp_path / "back" / "big.bin").read_bytes() == big
    head, said = r.stdout.splitlines()[:2]
    assert head == f"sync down: box:{there} -> {tmp_path / 'back'}"
    assert said.startswith("fetched 2 file(s), 5.0 MiB in "), said
    assert link.went_through_a_keeper()


def test_demo_runs_again_over_the_pin_its_last_run_left(box: tuple[harness.HostInfo, str],
                                                        tmp_path: Path,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    """`make demo` twice: the second run's host is new but its inventory's path is the first
    run's, so the pin the first left (another key under that name) must not stop it."""
    from tests.sandbox import demo
    info, _ = box
    known = harness.sandbox_dir() / "demo-home" / "known_hosts"
    known.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                    str(tmp_path / "last-run-key")], check=True)
    pub = (tmp_path / "last-run-key.pub").read_text().split()[:2]
    known.write_text(f"inventory:{Path(info.inventory).resolve()} {' '.join(pub)}\n")
    assert demo.run(info, [["facts"]]) == 0, capfd.readouterr()


def test_make_demo_leaves_the_users_sandbox_host_running(box: tuple[harness.HostInfo, str],
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    """`make demo` beside a sandbox host the user started: the demo runs on a host and a mirror of
    its own, stops only those, and says so; the user's host still answers."""
    from tests.sandbox import demo
    info, _ = box
    yours = str(harness.sandbox_dir())
    monkeypatch.setenv("GPU_SANDBOX_DIR", yours)  # the demo sets its own: put back after
    monkeypatch.setattr(demo, "STEPS", (["facts"],))
    assert demo.main() == 0, capfd.readouterr()
    out = capfd.readouterr().out
    assert f"stopped the demo's host cpu-only-1 and its mirror ({demo.DEMO_DIR})" in out
    monkeypatch.setenv("GPU_SANDBOX_DIR", yours)
    assert info.id in [h.id for h in harness.running()]
    with socket.create_connection((info.host, info.port), timeout=5) as c:  # its sshd answers
        assert c.recv(64).startswith(b"SSH-2.0-")
    assert not list((Path(demo.DEMO_DIR) / "hosts").glob("*"))


def test_read_only_tasks_write_no_run_folder(box: tuple[harness.HostInfo, str], gp_home: Path,
                                             tmp_path: Path) -> None:
    """Logs and reports go to one folder of ours (here $GPU_PROVISION_HOME, as the default rule
    has it), never the current folder (a training repo); tasks that only read write none."""
    _, inv = box
    cwd = tmp_path / "repo"
    cwd.mkdir()
    default = {"GPU_PROVISION_WORKDIR": ""}  # the rule, not the tests' own folder
    for task in (["jobs", "--json"], ["cost", "--json"], ["watch", "--once", "--json"],
                 ["shell", "--", "true"], ["ssh-config"], ["keepers", "--json"]):
        r = gpu_provision("-H", inv, *task, home=gp_home, cwd=cwd, env=default)
        assert r.returncode == 0, (task, r.stderr)
        assert list(cwd.iterdir()) == [], task
        assert not (gp_home / "logs").exists() and not (gp_home / "reports").exists(), task
    # a task that does write one: in our folder, not here
    r = gpu_provision("-H", inv, "facts", "--json", home=gp_home, cwd=cwd, env=default)
    assert r.returncode == 0, r.stderr
    assert list(cwd.iterdir()) == []
    assert [p.name for p in (gp_home / "logs" / "box").iterdir()] != []


@pytest.mark.parametrize("transport", ["sftp", "rsync"])
def test_symlinks_in_a_synced_folder(box: tuple[harness.HostInfo, str], gp_home: Path,
                                     tmp_path: Path, transport: str) -> None:
    """PyTorch Lightning's save_last="link" leaves last.ckpt -> epoch=9.ckpt: it arrives as that
    link (or, with --links-as-files, as the file); a link pointing outside the folder is left
    out and named, never followed; both ways, both transports."""
    if transport == "rsync" and (shutil.which("rsync") is None or shutil.which("ssh") is None):
        pytest.skip("no rsync and ssh here (make system-deps)")
    info, inv = box
    ck = tmp_path / "ck"
    (ck / "sub").mkdir(parents=True)
    (ck / "epoch=9.ckpt").write_bytes(os.urandom(2048))
    (ck / "last.ckpt").symlink_to("epoch=9.ckpt")
    (ck / "sub" / "best.ckpt").symlink_to("../epoch=9.ckpt")
    (ck / "logs").symlink_to("sub")
    (ck / "passwd").symlink_to("/etc/passwd")
    there = f"/root/ck-{transport}"
    r = gpu_provision("-H", inv, "sync", "up", "ck", there, "--transport", transport,
                      home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "made 3 symbolic link(s)" in r.stdout
    assert "left out 1 link(s) pointing outside the folder (never followed): passwd -> " \
        "/etc/passwd" in r.stdout
    host = info.path(there)
    assert os.readlink(host / "last.ckpt") == "epoch=9.ckpt"
    assert os.readlink(host / "sub" / "best.ckpt") == "../epoch=9.ckpt"
    assert os.readlink(host / "logs") == "sub"
    assert not os.path.lexists(host / "passwd")
    # again: nothing to do
    r = gpu_provision("-H", inv, "sync", "up", "ck", there, "--transport", transport, "--json",
                      home=gp_home, cwd=tmp_path)
    rep = json.loads(r.stdout)
    assert (rep["files"], rep["links"], rep["skipped_links"]) == (0, 0, ["passwd -> /etc/passwd"])
    # --links-as-files: the file itself
    r = gpu_provision("-H", inv, "sync", "up", "ck", f"{there}-files", "--transport", transport,
                      "--links-as-files", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    copy = info.path(f"{there}-files/last.ckpt")
    assert not copy.is_symlink() and copy.read_bytes() == (ck / "epoch=9.ckpt").read_bytes()
    # down: the host's links arrive as links; one pointing outside its folder is named
    (host / "hostname").symlink_to("/etc/hostname")
    r = gpu_provision("-H", inv, "sync", "down", there, "back", "--transport", transport,
                      home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    back = tmp_path / "back"
    assert os.readlink(back / "last.ckpt") == "epoch=9.ckpt"
    assert (back / "last.ckpt").read_bytes() == (ck / "epoch=9.ckpt").read_bytes()
    assert os.readlink(back / "logs") == "sub" and not os.path.lexists(back / "hostname")
    assert "hostname -> /etc/hostname" in r.stdout
