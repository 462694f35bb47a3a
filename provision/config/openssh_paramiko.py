"""The ssh configuration read without an OpenSSH client (Windows without it, or
``$GPU_PROVISION_SSH=none``): paramiko's ``SSHConfig``, which evaluates Host patterns (with
``!`` negation) and Match (all, canonical, final, host, originalhost, user, localuser, exec) in
first-match-wins order and expands some tokens, but reads no ``Include`` and takes any other
Match criterion as matching.

So, before paramiko sees the text: an ``Include`` outside any block is put in place (its files
globbed, relative to ~/.ssh for the user's file and /etc/ssh for the system's, as ssh_config(5)
says, and the top level re-opened after them with ``Host *``); an Include inside a Host or
Match block (conditional inclusion), one whose path holds a token or a variable, and a Match
criterion paramiko does not know are refused with their file and line: OpenSSH's client reads
them. Where an option was set is found by taking lines out one at a time until the answer
changes (only on the way to an error).
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

from ..errors import ConfigError
from .openssh_options import Reading, keyword, shown

KNOWN_MATCH = {"all", "canonical", "final", "host", "originalhost", "user", "localuser", "exec"}
NEEDS_SSH = "OpenSSH's client reads it (install it, or set GPU_PROVISION_SSH to its path)"
Line = tuple[str, str, int]  # text, file, line


def _lines(path: Path, system: bool, depth: int = 0) -> list[Line]:
    if depth > 16:  # readconf.c READCONF_MAX_DEPTH
        raise ConfigError(shown(str(path)), "Include nested deeper than 16 files")
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out: list[Line] = []
    in_block = False
    for n, raw in enumerate(text.splitlines(), 1):
        word = keyword(raw)
        where = shown(str(path))
        if word in ("host", "match"):
            in_block = True
            if word == "match":
                _check_match(raw, where, n)
        if word != "include":
            out.append((raw, str(path), n))
            continue
        if in_block:
            raise ConfigError(where, f"an Include inside a Host or Match block (conditional "
                              f"inclusion) cannot be read without OpenSSH: {NEEDS_SSH}, or "
                              "move the Include above the first Host line", key="Include",
                              line=n)
        for pattern in shlex.split(raw.strip()[len("include"):].lstrip(" \t=")):
            if "%" in pattern or "${" in pattern:
                raise ConfigError(where, f"{pattern!r}: a token or variable in an Include path "
                                  f"cannot be read without OpenSSH: {NEEDS_SSH}",
                                  key="Include", line=n)
            full = os.path.expanduser(pattern)
            if not os.path.isabs(full):
                full = os.path.join("/etc/ssh" if system else os.path.expanduser("~/.ssh"), full)
            for found in sorted(glob.glob(full)):
                out += _lines(Path(found), system, depth + 1)
        out.append(("Host *", str(path), n))  # back at the top level, as after OpenSSH's Include
    return out


def _check_match(raw: str, where: str, n: int) -> None:
    try:
        words = shlex.split(raw.strip()[len("match"):].lstrip(" \t="))
    except ValueError:
        raise ConfigError(where, "unbalanced quotes", key="Match", line=n) from None
    i = 0
    while i < len(words):
        word = words[i].lstrip("!").lower()
        if word not in KNOWN_MATCH:
            raise ConfigError(where, f"Match {words[i]}: our built-in reader (paramiko) cannot "
                              f"evaluate this criterion (it would take it as matching): "
                              f"{NEEDS_SSH}", key="Match", line=n)
        i += 1 if word in ("all", "canonical", "final") else 2


class _MatchExec:
    """Stands in for the ``invoke`` module that paramiko's ``Match exec`` calls: invoke.run would
    read our own stdin (a `shell -- CMD` fed by a pipe would lose it). The command runs as ssh
    runs it, ``sh -c`` (readconf.c execute_in_shell), with stdin and stdout on /dev/null."""

    @staticmethod
    def run(command: str, hide: object = None, warn: bool = True) -> SimpleNamespace:
        shell = shutil.which("sh")
        if shell is None:
            raise ConfigError("your ssh configuration", f"Match exec {command!r} needs a POSIX "
                              f"shell, and there is none here: {NEEDS_SSH}")
        try:
            done = subprocess.run([shell, "-c", command], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, timeout=30)
        except subprocess.TimeoutExpired:
            raise ConfigError("your ssh configuration", f"Match exec {command!r}: no end "
                              "within 30s") from None
        return SimpleNamespace(ok=done.returncode == 0)


def read_with_paramiko(name: str, user: str | None, port: int | None,
                       files: list[Path]) -> Reading:
    """The same Reading as ``ssh -G`` gives, from paramiko's lookup of ``name``. ``user`` and
    ``port`` (from the command line) beat the files, as they do for ssh."""
    import paramiko
    import paramiko.config

    setattr(paramiko.config, "invoke", _MatchExec)  # noqa: B010 (the stubs have no such name)

    lines: list[Line] = []
    for i, path in enumerate(files):
        lines += _lines(path, system=i > 0 and len(files) > 1)

    def lookup(skip: int | None = None) -> dict[str, object]:
        text = "\n".join(t for j, (t, _, _) in enumerate(lines) if j != skip)
        try:
            found = paramiko.SSHConfig.from_text(text).lookup(name)
        except paramiko.ssh_exception.ConfigParseError as exc:
            raise ConfigError("your ssh configuration", str(exc)) from None
        return dict(found)

    got = lookup()
    values: dict[str, tuple[str, ...]] = {}
    for key, value in got.items():
        if key == "hostname" or value is None:
            continue
        values[key] = tuple(str(v) for v in value) if isinstance(value, list) else (str(value),)
    if user:
        values["user"] = (user,)
    if port:
        values["port"] = (str(port),)
    hostname = str(got.get("hostname") or name)

    def locate(key: str) -> str | None:
        for j, (text, path, n) in enumerate(lines):
            if keyword(text) == key and lookup(skip=j).get(key) != got.get(key):
                return f"{shown(path)}:{n}"
        return None
    return Reading(name, hostname, values, locate, "paramiko")
