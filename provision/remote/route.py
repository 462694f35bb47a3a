"""The legs of a connection that goes through jump hosts or a ProxyCommand (the route the
user's ssh configuration gives, ``config/openssh.py``): the socket each login runs over, and
the words for a leg that fails.

A jump host's leg is a ``direct-tcpip`` channel of the previous login (RFC 4254 7.2), as
``ssh -W``/ProxyJump and Fabric's ``gateway=Connection`` make it; unlike Fabric's gateway, every
login on the way is ours, so each host key is checked against our pins (``connection.py``).
A ProxyCommand runs as ssh runs it: ``$SHELL -c "exec COMMAND"`` (sshconnect.c
ssh_proxy_connect; we take ``sh``), its stdin/stdout the connection, its stderr kept for the
message when it ends.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from typing import Any

import paramiko
from fabric import Connection
from paramiko.agent import AgentSSH

_OPEN_FAILED = "open FAILED: "
_LOG_SEQ = iter(range(1, 1 << 62))


class ProxySock(paramiko.ProxyCommand):
    """paramiko's ProxyCommand through the shell, failing at once when the command ends (with
    what it said on stderr) instead of waiting out the banner timeout."""

    def __init__(self, command: str):
        shell = shutil.which("sh") or "/bin/sh"
        self.command = command
        self.cmd = [shell, "-c", f"exec {command}"]
        self.process = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, bufsize=0,
                                        start_new_session=True)
        self.timeout: float | None = None
        self.said: list[bytes] = []
        # drained as it comes: a chatty command (ssh -v) must not block on a full pipe
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.said = [*self.said[-19:], line]

    def stderr(self) -> str:
        self._reader.join(timeout=1)
        return b"".join(self.said).decode(errors="replace").strip()

    def recv(self, size: int) -> bytes:
        """Whatever has come, up to ``size`` (a socket's short read); ``socket.timeout`` when
        nothing came within the timeout; EOFError once the command has closed its stdout."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], wait)
            if ready:
                data = os.read(fd, size)
                if not data:
                    raise EOFError(self.ended())
                return data
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError()

    def ended(self) -> str:
        code = self.process.wait()
        said = self.stderr()
        return f"the ProxyCommand ended (exit {code})" + (f": {said}" if said else "")

    def close(self) -> None:
        if self.process.poll() is None:
            try:  # the command's group: `ssh -W` and what a shell line started with it
                os.killpg(self.process.pid, signal.SIGTERM)
            except OSError:
                self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.process.stdin, self.process.stdout):
            if f is not None:
                f.close()


def command_line(sock: ProxySock) -> str:
    return shlex.join(sock.cmd)


class _Said(logging.Handler):
    """What the server said when it refused a channel (paramiko logs the server's reason and
    raises with the code's name alone)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.reason: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if _OPEN_FAILED in text:  # "Secsh channel 0 open FAILED: Connection refused: Connect failed"
            self.reason = text.split(_OPEN_FAILED, 1)[1].rsplit(": ", 1)[0]


class TunnelFailed(Exception):
    def __init__(self, reason: str, timed_out: bool = False):
        self.reason, self.timed_out = reason, timed_out
        super().__init__(reason)


def tunnel(conn: Any, host: str, port: int, timeout: float) -> paramiko.Channel:
    """A ``direct-tcpip`` channel from the machine ``conn`` is logged into to ``host:port``
    (the jump host resolves the name and connects)."""
    transport: paramiko.Transport = conn.client.get_transport()
    name = f"paramiko.transport.route{next(_LOG_SEQ)}"
    transport.set_log_channel(name)
    said = _Said()
    logger = logging.getLogger(name)
    logger.addHandler(said)
    try:
        return transport.open_channel("direct-tcpip", (host, port), ("", 0), timeout=timeout)
    except paramiko.ChannelException as exc:
        raise TunnelFailed(said.reason or exc.text) from None
    except paramiko.SSHException as exc:
        raise TunnelFailed(str(exc), timed_out="Timeout" in str(exc)) from None
    finally:
        logger.removeHandler(said)


class _AgentAt(AgentSSH):
    """The agent at a socket IdentityAgent names (paramiko's Agent reads $SSH_AUTH_SOCK only)."""

    def __init__(self, path: str):
        super().__init__()
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(10)
        sock.connect(path)
        self._connect(sock)  # type: ignore[attr-defined]  # (not in the stubs)

    def close(self) -> None:
        self._close()  # type: ignore[attr-defined]


def agent_at(path: str) -> AgentSSH | None:
    """That agent, its keys listed; None when nothing answers there."""
    try:
        return _AgentAt(path)
    except (OSError, paramiko.SSHException):
        return None


class Routed(Connection):  # type: ignore[misc]
    """A connection whose socket is a channel of its jump hosts' logins (``hops``, set once
    they are all up): they close with it."""

    def close(self) -> None:
        super().close()
        for hop in reversed(getattr(self, "hops", [])):
            hop.close()


def disabled_algorithms(algorithms: tuple[tuple[str, str, tuple[str, ...]], ...]) -> dict[str, list[str]]:
    """paramiko's ``disabled_algorithms`` for the lists the configuration narrowed: what
    paramiko offers and the list does not allow (``only``), or the list takes away (``not``);
    patterns as ssh_config(5) allows them (``*``, ``?``)."""
    out: dict[str, list[str]] = {}
    for category, mode, patterns in algorithms:
        offered = getattr(paramiko.Transport, f"_preferred_{category}", ())
        listed = [a for a in offered if any(fnmatch.fnmatchcase(a, p) for p in patterns)]
        out[category] = [a for a in offered if (a in listed) != (mode == "only")]
    return out
