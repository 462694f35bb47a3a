"""``ssh-config``: a ``Host`` block per host for plain OpenSSH (ssh, scp, rsync, VS Code
Remote-SSH) that trusts exactly the key this tool pinned, and nothing else.

Our pins live in our own known_hosts file under the pin's name (``inventory:/path.yaml`` or
``[host]:port``), not under the address, so plain ssh finds them only through ``HostKeyAlias``
(ssh_config(5): "Specifies an alias that should be used instead of the real host name when
looking up or saving the host key in the host key database files") with ``UserKnownHostsFile``
naming our file. ``StrictHostKeyChecking yes`` makes ssh refuse any other key instead of asking;
``UpdateHostKeys no`` keeps ssh from writing into our file; ``GlobalKnownHostsFile /dev/null``
keeps the system's file out of the decision.

``--write`` keeps every block in one file of ours and adds, once, an ``Include`` of it at the
top of ``~/.ssh/config`` with a marker comment: ssh_config(5) says an Include inside a ``Host``
or ``Match`` block applies only to that block, so it must come before the first of them. The
user's own lines are never changed; only that one marked line is added.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from paramiko.hostkeys import HostKeys

from ..config.inventory import Target
from ..config.shipped import state_dir
from ..errors import ProvisionError

MARKER = "# gpu-provision: the hosts it provisions (gpu-provision ssh-config --write)"
# names ssh_config(5) gives a special meaning in a Host pattern
_PATTERN_CHARS = re.compile(r"[*?!,\s]")
# ssh-keygen's names for the key types paramiko pins, as HostKeyAlgorithms wants them; an RSA
# key is offered with SHA-2 signatures (OpenSSH 8.8 refuses ssh-rsa's SHA-1 by default)
_ALGORITHMS = {"ssh-rsa": "rsa-sha2-512,rsa-sha2-256,ssh-rsa"}


@dataclass(frozen=True)
class HostBlock:
    alias: str  # what the user types: ssh ALIAS
    text: str  # the whole block, "Host ALIAS" first

    def as_json(self) -> dict[str, str]:
        return {"alias": self.alias, "config": self.text}


def our_file() -> Path:
    """The one file of ours that ``~/.ssh/config`` includes."""
    return state_dir() / "ssh_config"


def pinned_types(target: Target, known_hosts: Path) -> list[str]:
    """The key types pinned for ``target`` in our known_hosts file (none: never connected)."""
    keys = HostKeys(str(known_hosts)) if known_hosts.exists() else HostKeys()
    found = keys.lookup(target.pin_name)
    return list(found.keys()) if found else []


def _value(text: str) -> str:
    """One ssh_config value: double-quoted when it holds a space (ssh_config(5): "Arguments may
    optionally be enclosed in double quotes (") in order to represent arguments containing
    spaces")."""
    if '"' in text or "\n" in text:
        raise ProvisionError(f"{text!r}: ssh_config cannot hold a double quote or a newline")
    return f'"{text}"' if re.search(r"\s", text) else text


def alias_of(target: Target) -> str:
    """The Host name: the inventory's name, else ``host-port`` of an ad-hoc host."""
    name = target.name if target.source else f"{target.host}-{target.port}"
    return _PATTERN_CHARS.sub("-", name)


def host_block(target: Target, known_hosts: Path, key_types: Sequence[str], *,
               alias: str | None = None, jump: str | None = None,
               proxy_command: str | None = None, comment: str | None = None) -> HostBlock:
    """The block for one host whose key is pinned (``key_types``: the pinned key types).
    ``jump``/``proxy_command``: the way in its ssh configuration gave (``blocks_for``)."""
    if not key_types:
        raise ProvisionError(f"{target.name}: no host key pinned yet; connect once first "
                             f"(gpu-provision -H {target.name} facts) so there is a key to trust")
    alias = alias or alias_of(target)
    lines = [f"Host {alias}",
             f"  HostName {_value(target.host)}",
             f"  Port {target.port}",
             f"  User {_value(target.user)}"]
    keys = [os.path.expanduser(target.key)] if target.key else []
    keys += [k for k in target.identity_files if k not in keys]
    if keys:
        lines += [f"  IdentityFile {_value(k)}" for k in keys] + ["  IdentitiesOnly yes"]
    if jump:
        lines.append(f"  ProxyJump {jump}")
    elif proxy_command:  # already expanded: a % left in it must stay one (ssh_config(5) TOKENS)
        lines.append(f"  ProxyCommand {proxy_command.replace('%', '%%')}")
    algorithms = ",".join(_ALGORITHMS.get(k, k) for k in key_types)
    lines += [f"  HostKeyAlias {_value(target.pin_name)}",
              f"  UserKnownHostsFile {_value(str(known_hosts))}",
              "  GlobalKnownHostsFile /dev/null",
              "  StrictHostKeyChecking yes",
              "  UpdateHostKeys no",
              "  CheckHostIP no",
              f"  HostKeyAlgorithms {algorithms}"]
    source = f" ({target.source})" if target.source else ""
    return HostBlock(alias, f"# {comment or target.name + source}\n" + "\n".join(lines) + "\n")


def blocks_for(target: Target, known_hosts: Path) -> list[HostBlock]:
    """``target``'s block, and one per jump host on its way (each trusting its own pin, as our
    connection does), the target's ``ProxyJump`` naming them in order: plain ssh then goes
    the way we go, never straight to the address."""
    out: list[HostBlock] = []
    for i, hop in enumerate(target.route):
        t = Target(name=hop.label(), host=hop.host, port=hop.port, user=hop.user,
                   identity_files=hop.keys)
        out.append(host_block(t, known_hosts, pinned_types(t, known_hosts),
                              alias=_PATTERN_CHARS.sub("-", f"gpu-provision-hop-{hop.user}-"
                                                       f"{hop.host}-{hop.port}"),
                              proxy_command=hop.proxy_command if i == 0 else None,
                              comment=f"jump host {hop.label()} on the way to {target.name}"))
    jump = ",".join(b.alias for b in out) or None
    out.append(host_block(target, known_hosts, pinned_types(target, known_hosts), jump=jump,
                          proxy_command=target.proxy_command))
    return out


def parse_blocks(text: str) -> dict[str, str]:
    """Our file's blocks by alias (each a ``# name`` comment and its ``Host`` lines)."""
    blocks: dict[str, str] = {}
    current: list[str] = []
    alias = None
    for line in text.splitlines(keepends=True):
        if line.startswith("# "):
            if alias is not None:
                blocks[alias] = "".join(current)
            current, alias = [], None  # (the file's own head comment is dropped)
        if line.startswith("Host "):
            alias = line.split(None, 1)[1].strip()
        current.append(line)
    if alias is not None:
        blocks[alias] = "".join(current)
    return blocks


def _atomic_write(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_ours(path: Path, blocks: Sequence[HostBlock]) -> list[str]:
    """Put ``blocks`` in our file, replacing those of the same alias and keeping the others.
    Returns the aliases the file holds."""
    kept = parse_blocks(path.read_text()) if path.exists() else {}
    for b in blocks:
        kept[b.alias] = b.text
    head = "# Written by gpu-provision ssh-config --write; rewritten on each --write.\n\n"
    _atomic_write(path, head + "\n".join(kept[a] for a in sorted(kept)), 0o600)
    return sorted(kept)


def include_line(ours: Path) -> str:
    return f"Include {_value(str(ours))}"


def add_include(user_config: Path, ours: Path) -> bool:
    """Add ``Include <ours>`` with its marker at the top of ``user_config`` unless it is there
    already; True when it was added. The rest of the file is kept byte for byte (and its mode)."""
    line = include_line(ours)
    text = user_config.read_text() if user_config.exists() else ""
    if any(ln.strip() == line for ln in text.splitlines()):
        return False
    mode = user_config.stat().st_mode & 0o777 if user_config.exists() else 0o600
    if not user_config.parent.exists():
        user_config.parent.mkdir(mode=0o700, parents=True)
    _atomic_write(user_config, f"{MARKER}\n{line}\n\n{text}", mode)
    return True


def remove_include(user_config: Path, ours: Path) -> bool:
    """Take our marker and Include line out again (``--remove``); True when they were there."""
    if not user_config.exists():
        return False
    line = include_line(ours)
    text = user_config.read_text()
    lines = text.splitlines(keepends=True)
    kept = [ln for ln in lines if ln.strip() not in (line, MARKER)]
    if len(kept) == len(lines):
        return False
    if kept and kept[0].strip() == "" and lines[0].strip() == MARKER:
        kept = kept[1:]  # the blank line add_include put after them
    _atomic_write(user_config, "".join(kept), user_config.stat().st_mode & 0o777)
    return True
