"""The user's OpenSSH client configuration, read as ``ssh HOST`` reads it: the route (ProxyJump,
ProxyCommand), each machine's address, login and keys.

Where an ``ssh`` client is installed, OpenSSH itself answers: ``ssh -G NAME`` "causes ssh to
print its configuration after evaluating Host and Match blocks and exit" (ssh(1)), so Include,
Match (exec, tagged, localnetwork...), canonicalisation and first-match-wins are OpenSSH's own.
Its ``-vvv`` trace says which blocks applied, which is how an option is named with its file and
line. Without a client (Windows without OpenSSH, ``$GPU_PROVISION_SSH=none``), paramiko's
``SSHConfig`` reads it (``openssh_paramiko.py``), and what that reader cannot do is refused there.

ProxyJump is followed as ssh.c does: ``ProxyJump a,b`` reaches ``b`` through ``a`` and the target
through ``b``; the first hop's own ProxyJump/ProxyCommand apply, the later hops' do not (ssh runs
them as ``ssh -J a -W target b``), and a hop equal to the machine it serves is "jumphost loop".

An option that changes where or how we connect and that this program cannot honour stops the
command with the option's name and its file:line (``refuse``); docs/ssh-config.md lists them.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .openssh_options import Reading, keyword_line, refuse, shown

UNSET = "GPU-PROVISION-UNSET"  # what our wrapper's last `Host *` gives: the configuration set none
MAX_HOPS = 10
# ssh_config keyword -> paramiko's name in ``disabled_algorithms``
ALGORITHMS = {"ciphers": "ciphers", "macs": "macs", "kexalgorithms": "kex",
              "hostkeyalgorithms": "keys", "pubkeyacceptedalgorithms": "pubkeys"}


@dataclass(frozen=True)
class Hop:
    """One machine of the route: a jump host, or (the last leg) the target itself.

    ``keys``: the IdentityFiles that exist, tokens expanded, in order (ssh skips missing ones);
    ``agent``: the agent whose keys may be offered: True the one at ``$SSH_AUTH_SOCK``, False
    none (IdentityAgent none), or the socket IdentityAgent names;
    ``proxy_command``: only on the first leg, ready for ``sh -c``; ``algorithms``: the lists
    the configuration narrowed, as (paramiko category, "only"/"not", patterns); ``where``: which
    line brought this hop in, for messages.
    """

    name: str
    host: str
    port: int
    user: str
    keys: tuple[str, ...] = ()
    identities_only: bool = False
    agent: bool | str = True
    proxy_command: str | None = None
    connect_timeout: int | None = None
    algorithms: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    where: str = ""

    @property
    def pin_name(self) -> str:
        """Its key's name in our known_hosts: as a machine met directly is pinned."""
        return f"[{self.host}]:{self.port}"

    def label(self) -> str:
        addr = f"{self.user}@{self.host}:{self.port}"
        return addr if self.name in (self.host, addr) else f"{self.name} ({addr})"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Hop:
        d = dict(data)
        d["keys"] = tuple(d.get("keys") or ())
        d["algorithms"] = tuple((c, m, tuple(p)) for c, m, p in d.get("algorithms") or ())
        return cls(**d)


def ssh_client() -> str | None:
    """The OpenSSH client that reads the configuration: ``$GPU_PROVISION_SSH`` (``none``: use
    the built-in reader), else ``ssh`` on PATH."""
    env = os.environ.get("GPU_PROVISION_SSH")
    if env is not None and env.strip():
        return None if env.strip() == "none" else env.strip()
    return shutil.which("ssh")


def config_files(explicit: str | None) -> list[Path]:
    """``-S FILE`` alone (as ``ssh -F``), else the user's file, then the system's (ssh_config(5):
    "command-line options, user's configuration file, system-wide configuration file")."""
    if explicit:
        path = Path(os.path.expanduser(explicit))
        if not path.is_file():
            from ..errors import UsageError
            raise UsageError(f"-S {explicit}: no such file (give the ssh_config file to read)")
        return [path]
    system = Path(os.environ.get("PROGRAMDATA", "C:/ProgramData"), "ssh/ssh_config") \
        if os.name == "nt" else Path("/etc/ssh/ssh_config")  # Win32-OpenSSH's place for it
    return [Path(os.path.expanduser("~/.ssh/config")), system]


# --- reading with OpenSSH ---------------------------------------------------------------------

_LINE = re.compile(r"^(\S.*?):? line (\d+): (.+)$")
_TRACE_READ = re.compile(r"^debug\d: Reading configuration data (.+)$")
_TRACE_INCLUDE = re.compile(r"^debug\d: (.+) line \d+: Including file (.+) depth \d+(.*)$")
_TRACE_APPLY = re.compile(r"^debug\d: (.+) line (\d+): Applying options for ")
_TRACE_MATCHED = re.compile(r"^debug\d: (.+) line (\d+): matched '")
_DEFAULTS: dict[str, dict[str, tuple[str, ...]]] = {}


def _run_g(ssh: str, args: list[str], name: str) -> tuple[dict[str, tuple[str, ...]], str]:
    try:
        proc = subprocess.run([ssh, "-G", *args, "--", name], capture_output=True, text=True,
                              timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{ssh} -G {name}", "no answer within 30s (a `Match exec` command "
                          "that does not end?)") from None
    except OSError as exc:
        raise ConfigError(ssh, f"cannot run it: {exc.strerror}; set GPU_PROVISION_SSH=none to "
                          "read the configuration without it") from None
    if proc.returncode != 0:
        said = [ln for ln in proc.stderr.splitlines() if ln and not ln.startswith("debug")]
        for ln in said:
            m = _LINE.match(ln)
            if m and os.path.isfile(m.group(1)):
                raise ConfigError(shown(m.group(1)), f"{m.group(3)} (ssh -G {name})",
                                  line=int(m.group(2)))
        raise ConfigError(f"ssh -G {name}", "; ".join(said[-3:]) or f"exit {proc.returncode}")
    values: dict[str, list[str]] = {}
    for ln in proc.stdout.splitlines():
        key, _, value = ln.partition(" ")
        values.setdefault(key.lower(), []).append(value)
    return {k: tuple(v) for k, v in values.items()}, proc.stderr


def _defaults(ssh: str) -> dict[str, tuple[str, ...]]:
    """OpenSSH's built-in values (``-F none``: no file read), once per client."""
    if ssh not in _DEFAULTS:
        _DEFAULTS[ssh] = _run_g(ssh, ["-F", "none"], "gpu-provision-defaults")[0]
    return _DEFAULTS[ssh]


def _quoted(path: Path) -> str:
    return '"' + str(path) + '"'


def read_with_ssh(ssh: str, name: str, user: str | None, port: int | None,
                  files: list[Path]) -> Reading:
    """``ssh -G`` on a wrapper that includes ``files`` in OpenSSH's order and ends with a
    ``Host *`` block setting User and IdentityFile to a marker: a marker in the answer means
    no file set it (``-G`` would print the local user and the default keys alike)."""
    with tempfile.TemporaryDirectory(prefix="gpu-provision-ssh-") as tmp:
        wrapper = Path(tmp) / "config"
        wrapper.write_text("".join(f"Include {_quoted(f)}\n" for f in files)
                           + f"Host *\n  User {UNSET}\n  IdentityFile {UNSET}\n")
        args = ["-vvv", "-F", str(wrapper), *(["-l", user] if user else []),
                *(["-p", str(port)] if port else [])]
        got, trace = _run_g(ssh, args, name)
    base = _defaults(ssh)
    values: dict[str, tuple[str, ...]] = {}
    for key, value in got.items():
        if key == "user":
            if value[0] != UNSET:
                values[key] = value
        elif key == "identityfile":
            mine = tuple(v for v in value if v != UNSET)
            if mine:
                values[key] = mine
        elif key not in ("hostname", "host") and value != base.get(key):
            values[key] = value
    hostname = got.get("hostname", (name,))[0]
    return Reading(name, hostname, values, _tracer(trace, wrapper), "ssh -G")


def _tracer(trace: str, wrapper: Path) -> Callable[[str], str | None]:
    """``keyword -> "FILE:LINE"`` from ``ssh -G -vvv``'s trace: the blocks that applied, in the
    order OpenSSH read them (the lines above a file's first Host/Match apply as well), searched
    for the first line that sets the keyword (the first obtained value is used)."""
    blocks: list[tuple[str, int]] = []
    parse_only: set[str] = set()
    pending: tuple[str, int] | None = None  # a Match line whose criteria are being checked

    def add(block: tuple[str, int]) -> None:
        if block not in blocks:
            blocks.append(block)
    for ln in trace.splitlines():
        if m := _TRACE_INCLUDE.match(ln):
            if "parse only" in m.group(3):
                parse_only.add(m.group(2))
        elif m := _TRACE_READ.match(ln):
            if m.group(1) not in parse_only:
                add((m.group(1), 0))
        elif m := _TRACE_APPLY.match(ln):
            add((m.group(1), int(m.group(2))))
        elif m := _TRACE_MATCHED.match(ln):
            pending = (m.group(1), int(m.group(2)))
        elif ln.startswith("debug2: match found") and pending:
            add(pending)
        elif "not matched" in ln or ln.startswith("debug2: checking match"):
            pending = None

    def locate(key: str) -> str | None:
        for path, start in blocks:
            if path == str(wrapper):
                continue
            found = keyword_line(path, start, key)
            if found:
                return f"{shown(path)}:{found}"
        return None
    return locate


def read(name: str, user: str | None = None, port: int | None = None,
         explicit: str | None = None) -> Reading:
    """What the configuration says about ``name``, with ``user``/``port`` as ``-l``/``-p``
    (the command line beats the files, as in ssh)."""
    files = config_files(explicit)
    ssh = ssh_client()
    if ssh is not None:
        return read_with_ssh(ssh, name, user, port, files)
    from .openssh_paramiko import read_with_paramiko
    return read_with_paramiko(name, user, port, files)


# --- from a reading to the route --------------------------------------------------------------

@dataclass(frozen=True)
class Jump:
    user: str | None
    host: str
    port: int | None


def parse_jump(text: str, where: str) -> list[Jump]:
    """ProxyJump's ``[user@]host[:port]`` or ``ssh://[user@]host[:port]``, comma-separated
    (ssh_config(5))."""
    out = []
    for part in text.split(","):
        spec = part.strip().removeprefix("ssh://").rstrip("/")
        user, _, hostport = spec.rpartition("@")
        m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", hostport) or \
            re.fullmatch(r"([^:@/\s\[\]]+)(?::(\d+))?", hostport)
        if not m or (user and not re.fullmatch(r"[^@\s:/]+", user)):
            raise ConfigError(where, f"ProxyJump {text!r}: {part!r} is not [user@]host[:port]")
        out.append(Jump(user or None, m.group(1), int(m.group(2)) if m.group(2) else None))
    return out


def expand(value: str, tokens: Mapping[str, str], allowed: str, key: str, where: str) -> str:
    """ssh_config(5) TOKENS: ``%x`` for the letters in ``allowed`` (``%%`` is %), ``${VAR}``
    from the environment, a leading ``~``."""
    def one(m: re.Match[str]) -> str:
        letter = m.group(1)
        if letter == "%":
            return "%"
        if letter not in allowed or letter not in tokens:
            raise ConfigError(where, f"{key} {value!r}: %{letter} is not a token we can expand "
                              f"here (we expand %{' %'.join(allowed)})")
        return tokens[letter]

    def env(m: re.Match[str]) -> str:
        if m.group(1) not in os.environ:
            raise ConfigError(where, f"{key} {value!r}: ${{{m.group(1)}}} is not set")
        return os.environ[m.group(1)]
    text = re.sub(r"%(.)", one, value)
    text = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", env, text)
    return os.path.expanduser(text) if text.startswith("~") else text


def _tokens(r: Reading, host: str, port: int, user: str) -> dict[str, str]:
    local = socket.gethostname()
    jump = r.first("proxyjump") or ""
    return {"h": host, "p": str(port), "r": user, "n": r.name, "k": r.name,
            "u": getpass.getuser(), "d": os.path.expanduser("~"), "L": local.split(".")[0],
            "l": local, "i": str(os.getuid()) if hasattr(os, "getuid") else "",
            "j": jump, "C": hashlib.sha1(f"{local}{host}{port}{user}{jump}".encode()).hexdigest()}


def hop_of(r: Reading, user: str, where: str, proxy: bool = True) -> Hop:
    """The Hop a reading describes (``user``: as decided by the caller's precedence)."""
    port = int(r.first("port") or 22)
    tok = _tokens(r, r.hostname, port, user)
    keys = tuple(k for k in (expand(v, tok, "%dhiklLnprujC", "IdentityFile",
                                    r.where("identityfile"))
                             for v in r.values.get("identityfile", ())) if os.path.isfile(k))
    agent_path = r.first("identityagent")
    timeout = r.first("connecttimeout")
    command = r.first("proxycommand") if proxy else None
    if command and command.lower() != "none":
        command = expand(command, tok, "hnpr", "ProxyCommand", r.where("proxycommand"))
    else:
        command = None
    return Hop(name=r.name, host=r.hostname, port=port, user=user, keys=keys,
               identities_only=(r.first("identitiesonly") or "no").lower() in ("yes", "true"),
               agent=agent_of(agent_path), proxy_command=command,
               connect_timeout=int(timeout) if timeout and timeout.isdigit() else None,
               algorithms=_narrowed(r), where=where)


def agent_of(value: str | None) -> bool | str:
    """IdentityAgent as ssh.c reads it: ``none``, ``SSH_AUTH_SOCK`` (the variable), ``$VAR``
    (another variable; unset: no agent), else a socket path (``~`` and ``${VAR}`` expanded)."""
    if not value or value in ("SSH_AUTH_SOCK", "$SSH_AUTH_SOCK"):
        return True
    if value.lower() == "none":
        return False
    if value.startswith("$") and not value.startswith("${"):
        value = os.environ.get(value[1:]) or ""
        if not value:
            return False
    path = os.path.expanduser(os.path.expandvars(value))
    return True if path == os.environ.get("SSH_AUTH_SOCK") else path


def _narrowed(r: Reading) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    out = []
    for key, category in ALGORITHMS.items():
        value = r.first(key)
        if not value:
            continue
        if r.reader == "ssh -G":  # OpenSSH printed the list it settled on
            out.append((category, "only", tuple(value.split(","))))
        elif value.startswith("-"):
            out.append((category, "not", tuple(value[1:].split(","))))
        elif not value.startswith(("+", "^")):  # adding or reordering narrows nothing
            out.append((category, "only", tuple(value.split(","))))
    return tuple(out)


def legs(name: str, user: str | None = None, port: int | None = None,
         explicit: str | None = None, *, depth: int = 0, proxy: bool = True,
         where: str = "", default_user: str | None = None) -> list[Hop]:
    """Every machine on the way to ``name``, in order, ``name``'s own Hop last. A machine's
    user: ``user`` (``-l``), else the configuration's User, else ``default_user``, else the
    local user (ssh's default)."""
    if depth > MAX_HOPS:
        raise ConfigError(where, f"ProxyJump: more than {MAX_HOPS} hops on the way to {name} "
                          "(a loop, e.g. a `Host *` ProxyJump that also matches the jump host?)")
    r = read(name, user, port, explicit)
    refuse(r)
    hop = hop_of(r, r.first("user") or default_user or getpass.getuser(), where, proxy)
    jump = r.first("proxyjump") if proxy else None
    if not jump or jump.lower() == "none":
        return [hop]
    at = r.where("proxyjump")
    specs = parse_jump(jump, at)
    last = specs[-1]
    if last.host == hop.host and (last.port or 22) == hop.port and \
            (last.user or hop.user) == hop.user:
        raise ConfigError(at, f"ProxyJump {jump}: jumphost loop via {last.host} (ssh stops "
                          "here too)")
    chain = legs(specs[0].host, specs[0].user, specs[0].port, explicit, depth=depth + 1,
                 where=f"ProxyJump {jump} ({at})")
    for s in specs[1:]:  # reached with -J: their own ProxyJump/ProxyCommand do not apply
        chain += legs(s.host, s.user, s.port, explicit, depth=depth + 1, proxy=False,
                      where=f"ProxyJump {jump} ({at})")
    return [*chain, replace(hop, proxy_command=None)]


def describe(route: tuple[Hop, ...] | list[Hop], proxy_command: str | None) -> str:
    """The way in, for messages: ``through bastion (root@10.0.0.1:22)``."""
    if route:
        return "through " + " then ".join(h.label() for h in route)
    return f"through ProxyCommand {proxy_command}" if proxy_command else "directly"
