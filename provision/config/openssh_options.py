"""One reading of the ssh configuration (``Reading``: what it set for a name, and where), and
the options that change where or how ssh would connect and that this program cannot honour:
each stops the command with its name, value and file:line, and what to do (``refuse``). The
options we honour, and those that change neither and are not used, are in docs/ssh-config.md.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError


@dataclass(frozen=True)
class Reading:
    """What the configuration says about one name: ``values`` holds what it set beyond
    OpenSSH's defaults (lowercase keywords, every value as a tuple), ``locate`` says where."""

    name: str
    hostname: str
    values: Mapping[str, tuple[str, ...]]
    locate: Callable[[str], str | None] = field(compare=False)
    reader: str = "ssh -G"

    def first(self, key: str) -> str | None:
        v = self.values.get(key)
        return v[0] if v else None

    def where(self, key: str) -> str:
        return self.locate(key) or f"your ssh configuration ({self.reader} {self.name})"


def shown(path: str) -> str:
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if home != "~" and path.startswith(home + os.sep) else path


def keyword_line(path: str, start: int, key: str) -> int | None:
    """The line after line ``start`` of ``path`` (0: the top) that sets ``key``, before the
    block ends (the next Host or Match)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for n in range(start + 1, len(lines) + 1):
        word = keyword(lines[n - 1])
        if word in ("host", "match"):
            return None
        if word == key:
            return n
    return None


def keyword(line: str) -> str | None:
    """The keyword of an ssh_config line (``Key value`` or ``Key=value``), lowercased."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    return re.split(r"[\s=]", text, maxsplit=1)[0].lower()



Check = Callable[[Reading], str | None]


def _fdpass(r: Reading) -> str | None:
    if (r.first("proxyusefdpass") or "no").lower() in ("yes", "true"):
        return ("the ProxyCommand would hand ssh a connected socket (ssh_config(5)); our SSH "
                "library reads and writes the command's stdin/stdout: remove ProxyUseFdpass "
                "for this host, or use ProxyJump")
    return None


def _proxy_command(r: Reading) -> str | None:
    value = r.first("proxycommand")
    if not value or value.lower() == "none":
        return None
    if value.strip() == "-":
        return ("`ProxyCommand -` means the connection is ssh's own stdin/stdout, which only "
                "an ssh started by another program has")
    if os.name == "nt":  # paramiko's ProxyCommand, and ours, wait on the pipes with select()
        return ("a command's pipes cannot be waited on here (Windows' select() takes sockets "
                "only): use ProxyJump, which needs no command")
    if not shutil.which("sh"):
        return ("ssh runs ProxyCommand with `sh -c` (ssh_config(5)) and this machine has no "
                "POSIX shell: use ProxyJump, which needs none")
    return None


def _certificate(r: Reading) -> str | None:
    keys = {os.path.expanduser(k) for k in r.values.get("identityfile", ())}
    for cert in r.values.get("certificatefile", ()):
        path = os.path.expanduser(cert)
        if path.endswith("-cert.pub") and path[:-len("-cert.pub")] in keys:
            continue  # KEY-cert.pub beside an IdentityFile: paramiko loads it with the key
        return ("our SSH library uses a certificate only as KEY-cert.pub beside its "
                "IdentityFile KEY: name the key with IdentityFile and put its certificate "
                "beside it under that name")
    return None


def _pkcs11(r: Reading) -> str | None:
    value = r.first("pkcs11provider")
    if value and value.lower() != "none":
        return ("keys on a smart card or token (PKCS#11) are not supported by our SSH library: "
                "load them into ssh-agent (ssh-add -s PROVIDER) and drop PKCS11Provider here")
    return None


def _agent(r: Reading) -> str | None:
    value = r.first("identityagent")
    if not value or value.lower() == "none" or value.startswith("$") or \
            value == "SSH_AUTH_SOCK" or hasattr(socket, "AF_UNIX"):
        return None
    return ("an agent socket by path needs Unix sockets, which this system lacks: start the "
            "agent so that $SSH_AUTH_SOCK names it, and use IdentityAgent SSH_AUTH_SOCK")


def _family(r: Reading) -> str | None:
    value = (r.first("addressfamily") or "any").lower()
    if value != "any":
        return (f"we connect to whichever address {r.hostname} resolves to first, IPv4 or "
                f"IPv6; give HostName the {'IPv4' if value == 'inet' else 'IPv6'} address "
                "itself instead")
    return None


def _bind(key: str) -> Check:
    def check(r: Reading) -> str | None:
        if r.first(key):
            return ("we cannot choose the local address or interface a connection leaves "
                    "from: remove it for this host (or run where the default route is right)")
        return None
    return check


def _master(r: Reading) -> str | None:
    """ssh goes through an open master at ControlPath when ControlMaster is no, auto or autoask
    (mux.c muxclient), and then neither logs in nor follows this configuration's route."""
    path = r.first("controlpath")
    mode = (r.first("controlmaster") or "false").lower()
    if not path or path.lower() == "none" or mode not in ("false", "no", "auto", "autoask"):
        return None
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return None
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(path)
    except OSError:
        return None  # no master there: ssh would connect by itself, as we do
    return (f"an OpenSSH master connection is open at {path}, and ssh would send this "
            "command over it; we cannot use an OpenSSH master (our own kept connection plays "
            f"that part): close it (ssh -O exit {r.name}) and run again")


CHECKS: tuple[tuple[str, Check], ...] = (
    ("ProxyUseFdpass", _fdpass),
    ("ProxyCommand", _proxy_command),
    ("CertificateFile", _certificate),
    ("PKCS11Provider", _pkcs11),
    ("IdentityAgent", _agent),
    ("AddressFamily", _family),
    ("BindAddress", _bind("bindaddress")),
    ("BindInterface", _bind("bindinterface")),
    ("ControlPath", _master),
)


def refuse(r: Reading) -> None:
    """Raise for the first option of ``r`` that cannot be honoured (ConfigError naming it, its
    value, the file and line, the host, and what to do)."""
    for name, check in CHECKS:
        why = check(r)
        if why:
            value = " ".join(r.values.get(name.lower(), ()))
            raise ConfigError(r.where(name.lower()), f"{value!r} (for {r.name}) cannot be "
                              f"honoured: {why}", key=name)
