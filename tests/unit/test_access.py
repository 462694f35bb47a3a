"""shell, forward and ssh-config on this machine: the port specs and the local ports (real
sockets), the ssh_config blocks and the Include in a real ~/.ssh/config file, and the login block
and the shell's script run by real bash in a temporary home."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from provision.access import forward as fwd
from provision.access import shell as sh
from provision.access import sshconfig
from provision.config.inventory import Target
from provision.errors import ProvisionError, UsageError
from provision.ops.login import forget_login_step, login_block_script
from provision.remote.runtime import foreground_script, split_result

# --- forward: specs and local ports -------------------------------------------------------------

def test_port_specs() -> None:
    assert fwd.parse_specs(["8888", "6006:7000"]) == [fwd.PortSpec(8888, 8888, False),
                                                       fwd.PortSpec(6006, 7000, True)]


@pytest.mark.parametrize("text,says", [
    ("70000", "the host's port 70000 is out of range (a port is 1-65535)"),
    ("0", "the host's port 0 is out of range"),
    ("8888:0", "the local port 0 is out of range"),
    ("http", "the host's port 'http' is not a port number"),
    ("8888:x", "the local port 'x' is not a port number"),
])
def test_bad_port_is_one_line(text: str, says: str) -> None:
    with pytest.raises(UsageError) as e:
        fwd.parse_specs([text])
    assert says in str(e.value) and "\n" not in str(e.value)


def test_same_port_twice_is_refused() -> None:
    with pytest.raises(UsageError, match="named twice"):
        fwd.parse_specs(["8888", "8888:9000"])


def _busy() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def test_busy_local_port_asked_for_is_an_error_naming_a_free_one() -> None:
    held = _busy()
    port = held.getsockname()[1]
    try:
        with pytest.raises(UsageError) as e:
            fwd.bind_all(fwd.parse_specs([f"8888:{port}"]))
        text = str(e.value)
        assert f"local port {port} is in use on this machine; pick another, e.g. 8888:" in text
        suggested = int(text.rsplit(":", 1)[1])
        with socket.socket() as probe:  # the one it names is free
            probe.bind(("127.0.0.1", suggested))
    finally:
        held.close()


def test_busy_local_port_that_followed_the_hosts_moves_on_and_binds_loopback_only() -> None:
    held = _busy()
    port = held.getsockname()[1]
    try:
        [b] = fwd.bind_all(fwd.parse_specs([str(port)]))
        try:
            assert b.moved and b.local > port and b.url == f"http://127.0.0.1:{b.local}"
            assert b.sock.getsockname() == ("127.0.0.1", b.local)
        finally:
            b.sock.close()
    finally:
        held.close()


def test_jupyter_token_url_is_rewritten_to_the_local_port() -> None:
    bound = [fwd.Bound(fwd.PortSpec(8888, 9000, True), 9000, socket.socket())]
    try:
        line = "    http://gpu-box:8888/lab?token=9f86d081884c7d659a2feaa0c55ad015"
        assert fwd.jupyter_url(line, bound) == \
            "http://127.0.0.1:9000/lab?token=9f86d081884c7d659a2feaa0c55ad015"
        assert fwd.jupyter_url("http://127.0.0.1:8890/tree?token=abc", bound) is None
        assert fwd.jupyter_url("[I 12:00] Serving notebooks", bound) is None
    finally:
        bound[0].sock.close()


def test_serving_answers_in_a_few_words() -> None:
    # the shapes of vLLM's /v1/models (OpenAI's list) and Ollama's /api/tags
    assert fwd.summary('{"object": "list", "data": [{"id": "Qwen/Qwen2.5-0.5B", "object": '
                       '"model"}]}') == "models: Qwen/Qwen2.5-0.5B"
    assert fwd.summary('{"models": [{"name": "llama3.2:1b", "model": "llama3.2:1b"}]}') == \
        "models: llama3.2:1b"


# --- ssh-config ---------------------------------------------------------------------------------

def _target(tmp_path: Path, name: str = "my-4090") -> Target:
    inv = tmp_path / f"{name}.yaml"
    inv.write_text("host: 203.0.113.10\n")
    return Target(name=name, host="203.0.113.10", port=2222, user="root", key="~/.ssh/id_ed25519",
                  source=inv)


def test_host_block_points_at_our_pin(tmp_path: Path) -> None:
    t = _target(tmp_path)
    known = tmp_path / "state dir" / "known_hosts"
    b = sshconfig.host_block(t, known, ["ssh-ed25519"])
    lines = [ln.strip() for ln in b.text.splitlines()]
    assert lines[1] == "Host my-4090"
    assert f"HostKeyAlias inventory:{(tmp_path / 'my-4090.yaml').resolve()}" in lines
    assert f'UserKnownHostsFile "{known}"' in lines  # a path with a space, quoted
    assert {"StrictHostKeyChecking yes", "UpdateHostKeys no", "HostName 203.0.113.10",
            "Port 2222", "User root", "HostKeyAlgorithms ssh-ed25519",
            f"IdentityFile {os.path.expanduser('~/.ssh/id_ed25519')}"} <= set(lines)


def test_no_pin_no_block(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError, match="no host key pinned yet; connect once first"):
        sshconfig.host_block(_target(tmp_path), tmp_path / "known_hosts", [])


def test_include_goes_first_once_and_leaves_the_users_lines(tmp_path: Path) -> None:
    config = tmp_path / ".ssh" / "config"
    config.parent.mkdir()
    own = "Host work\n  HostName work.example.com\n  User me\n"
    config.write_text(own)
    config.chmod(0o644)
    ours = tmp_path / "state" / "ssh_config"
    assert sshconfig.add_include(config, ours)
    text = config.read_text()
    assert text.startswith(f"{sshconfig.MARKER}\nInclude {ours}\n")  # before any Host block
    assert text.endswith(own)
    assert config.stat().st_mode & 0o777 == 0o644  # its mode kept
    assert not sshconfig.add_include(config, ours)  # once
    assert config.read_text() == text
    assert sshconfig.remove_include(config, ours)
    assert config.read_text() == own


def test_our_file_keeps_other_hosts_blocks(tmp_path: Path) -> None:
    ours = tmp_path / "ssh_config"
    a, b = _target(tmp_path, "a"), _target(tmp_path, "b")
    sshconfig.write_ours(ours, [sshconfig.host_block(a, tmp_path / "k", ["ssh-ed25519"])])
    held = sshconfig.write_ours(ours, [sshconfig.host_block(b, tmp_path / "k", ["ssh-rsa"])])
    assert held == ["a", "b"]
    text = ours.read_text()
    assert text.count("Host a\n") == 1 and "HostKeyAlgorithms rsa-sha2-512,rsa-sha2-256,ssh-rsa" \
        in text
    assert ours.stat().st_mode & 0o777 == 0o600


# --- the login block and the shell's script, in real bash ---------------------------------------

@pytest.fixture()
def home(tmp_path: Path) -> Path:
    """A home whose bootstrap made an env: expected.json names a prefix with a python in it."""
    h = tmp_path / "home"
    prefix = h / "miniconda3" / "envs" / "torch"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(sys.executable)
    (h / ".gpu-provision").mkdir()
    (h / ".gpu-provision" / "expected.json").write_text(
        f'{{\n "conda_root": "{h / "miniconda3"}",\n "env_prefix": "{prefix}",\n "python": "3.11"\n}}')
    return h


def _bash(home: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "TERM": "dumb"}
    return subprocess.run(["bash", *args, "-c", script], capture_output=True, text=True, env=env,
                          cwd=home, timeout=60)


def test_login_block_is_added_once_activates_and_is_removed(home: Path) -> None:
    bashrc = home / ".bashrc"
    mine = "# my own\nalias ll='ls -l'\nexport EDITOR=vim"  # no newline at its end
    bashrc.write_text(mine)
    for _ in range(2):  # bootstrap run twice: one block
        r = _bash(home, login_block_script())
        assert r.returncode == 0, r.stderr
    assert bashrc.read_text().count("# >>> gpu-provision env >>>") == 1
    assert (home / ".profile").read_text().count("# >>> gpu-provision env >>>") == 1
    prefix = home / "miniconda3/envs/torch"
    # a login shell, as a plain ssh login starts one: the env's python first on PATH
    r = _bash(home, 'command -v python; echo "$GPU_PROVISION_ENV"', "-l")
    assert r.stdout.split() == [f"{prefix}/bin/python", str(prefix)], r.stderr
    r = _bash(home, "command -v python", "-i")  # an interactive shell (a terminal in VS Code)
    assert r.stdout.split()[-1] == f"{prefix}/bin/python"
    # forget-login: the blocks go, the user's lines stay as they were
    step = forget_login_step()
    assert step.body is not None
    r = _bash(home, foreground_script(step.name, step.body))
    out, result = split_result(r.stdout)
    assert result is not None and result["exit"] == 0, r.stdout + r.stderr
    assert bashrc.read_text() == mine + "\n" and (home / ".profile").read_text() == ""
    assert result["result"]["removed"] == "~/.bashrc ~/.profile"


def test_activation_is_silent_and_harmless_without_an_env(tmp_path: Path) -> None:
    r = _bash(tmp_path, sh.shell_script([], ["bash", "-c", 'echo "[$GPU_PROVISION_ENV]"']))
    assert r.stdout == "[]\n"
    assert "no env bootstrap made on this host" in r.stderr


def test_shell_command_runs_in_the_env_in_the_data_dir_words_as_given(home: Path) -> None:
    data = home / "data dir"
    data.mkdir()
    hostile = ["; rm -rf /", "it's", "a b", "$(id)", "`id`"]
    script = sh.shell_script(["/nonexistent", str(data)],
                             ["python", "-c", "import os, sys; print(sys.argv[1:]); "
                              "print(os.getcwd()); print(os.environ['PATH'].split(':')[0])",
                              *hostile])
    r = _bash(home, script)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == repr(hostile) and lines[1] == str(data)
    assert lines[2] == f"{home}/miniconda3/envs/torch/bin"
    r = _bash(home, sh.shell_script([], ["bash", "-c", "exit 7"]))
    assert r.returncode == 7


@pytest.mark.parametrize(("argv", "line"), [
    (["ls ~ | head -3"], "ls ~ | head -3"),  # as `ssh HOST 'ls ~ | head -3'`
    (["python train.py --lr 3e-4"], "python train.py --lr 3e-4"),
    (["nvidia-smi"], None), (["a b", "c"], None),  # words as given: more than one, or plain
])
def test_one_word_with_shell_syntax_is_a_command_line(argv: list[str], line: str | None) -> None:
    assert sh.shell_line(argv) == line


def test_a_command_line_runs_in_bash_and_a_missing_program_is_named(home: Path) -> None:
    r = _bash(home, sh.shell_script([], ["echo one two | wc -w; exit 3"]))
    assert (r.returncode, r.stdout.strip()) == (3, "2")
    r = _bash(home, sh.shell_script([], ["no-such-tool", "-v"]))
    assert r.returncode == 127 and "no-such-tool: command not found on the host" in r.stderr
    assert "line " not in r.stderr


# --- serving recipes --------------------------------------------------------------------------

def test_the_vllm_recipe_serves_on_the_loopback_and_says_how_to_check_it() -> None:
    from provision.config.recipes import Serve, load_recipe
    r = load_recipe("vllm")
    assert r.serve == Serve(8000, "/v1/models")
    i = r.job.index("--host")
    assert r.job[i + 1] == "127.0.0.1" and r.job[r.job.index("--port") + 1] == "8000"
    assert "vllm" in r.packages and r.torch


def test_a_serve_entry_needs_its_port(tmp_path: Path) -> None:
    from provision.config.recipes import load_recipe
    from provision.errors import ConfigError
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "srv.yaml").write_text("serve:\n  check: /health\n")
    with pytest.raises(ConfigError, match="serve: needs port:"):
        load_recipe("srv", tmp_path)
    (tmp_path / "recipes" / "srv.yaml").write_text("serve:\n  port: 8000\n  check: health\n")
    with pytest.raises(ConfigError, match="a path, e.g. /v1/models"):
        load_recipe("srv", tmp_path)


@pytest.mark.parametrize("banner,user,honoured", [
    ("SSH-2.0-OpenSSH_7.4", "alice", False),  # CentOS 7: before signal requests existed
    ("SSH-2.0-OpenSSH_7.9p1 Debian-10+deb10u2", "alice", True),
    ("SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u10", "root", False),  # root: no post-auth privsep
    ("SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u10", "ubuntu", True),
    ("SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5", "root", False),
    ("SSH-2.0-OpenSSH_9.8", "root", True),
    ("SSH-2.0-OpenSSH_10.0", "root", True),
    ("SSH-2.0-dropbear_2022.83", "root", None),  # not known: sent, and the fallback behind it
    ("", None, None),
])
def test_which_servers_act_on_signal_requests(banner: str, user: str | None,
                                              honoured: bool | None) -> None:
    from provision.remote.relay import honours_signals
    assert honours_signals(banner, user) is honoured
