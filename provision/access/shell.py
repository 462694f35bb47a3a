"""``shell``: a login on the host over our pinned connection, in the env bootstrap made, in the
data dir; or one command there (``shell -- CMD``), its exit code returned.

Interactive: a real pty on the host (``get_pty`` with this terminal's size, resized on SIGWINCH),
this terminal in raw mode, so every key reaches the host as typed: Ctrl-C is the byte 0x03 and
the host's pty turns it into SIGINT for whatever runs there, as plain ``ssh -t`` does. The exit
code is the remote shell's.

One command: no pty (as ``ssh host CMD``), stdout and stderr kept apart, this side's stdin
passed on when it is not a terminal (``shell -- tar x < a.tar``). Ctrl-C (SIGINT here) is sent
on as SIGINT to the command's process group on the host: the SSH "signal" channel request (RFC
4254 6.9; which servers act on it: ``relay.honours_signals``); where the server ignores it (a
root login before OpenSSH 9.8, a forced command), a second session signals the group the script
recorded. The command's exit code comes back (130 after SIGINT); a second Ctrl-C closes
the session.
"""

from __future__ import annotations

import os
import re
import secrets
import select
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Sequence
from typing import Any

import paramiko
from fabric import Connection

from ..errors import ConnectionLost
from ..remote.command import bash_script
from ..remote.relay import send_signal
from ..remote.templating import render
from .channels import open_channel

CHUNK = 1 << 16
GRACE = 3.0  # seconds a signalled command has to end before the next way is tried


def new_token() -> str:
    """Names one ``shell -- CMD`` session's process-group file on the host."""
    return secrets.token_hex(8)


# what makes one word a command line, as `ssh HOST 'a | b'` hands it to the host's shell
SHELL_LINE = re.compile(r"[\s|&;<>()$`*?~{}\[\]'\"\\]")


def shell_line(argv: Sequence[str] | None) -> str | None:
    """A command given as ONE word holding spaces or shell syntax (`shell -- 'ls ~ | head -3'`,
    as every ssh user types it): that line, for bash to read on the host as ssh's remote shell
    does; None for words run as given."""
    if argv is not None and len(argv) == 1 and SHELL_LINE.search(argv[0]):
        return argv[0]
    return None


def shell_script(data_dirs: Sequence[str], argv: Sequence[str] | None, token: str = "") -> str:
    """What runs on the host: the env's activation (the same file bootstrap's login block
    sources), the data dir (the first of ``data_dirs`` that exists, else the home), then a login
    shell, ``argv`` (words as given, never re-split), or one command line (``shell_line``).
    ``token``: names the file the command's process group is written to (``new_token``)."""
    return render("access/shell.sh.j2", data_dirs=list(data_dirs),
                  argv=list(argv) if argv is not None else None, line=shell_line(argv),
                  activate=render("setup/activate.sh"), token=token or new_token())


class Interrupter:
    """What Ctrl-C does to a running ``shell -- CMD``: the first sends SIGINT through the
    channel, then (the command still running after GRACE seconds, or at once where the server
    ignores such requests) signals its process group from a second session; a second Ctrl-C, or
    no end GRACE seconds after that, gives up. The command gets one SIGINT either way: a program
    that saves its work on the first and quits on the second is not cut short."""

    def __init__(self, conn: Connection, host: str, chan: paramiko.Channel, token: str):
        self.conn, self.host, self.chan, self.token = conn, host, chan, token
        self.deadline: float | None = None
        self.tried_group = False

    def interrupt(self) -> None:
        if self.deadline is not None:  # the second Ctrl-C
            raise KeyboardInterrupt
        # through the keeper when the connection is kept; not sent where the server is known
        # to ignore it (an OpenSSH before 9.8 and a root login): the group's turn at once
        sent = send_signal(self.chan, "INT")
        self.deadline = time.monotonic() + (GRACE if sent else 0)

    def check(self) -> None:
        """Called while waiting: the next way once the last one's time is up."""
        if self.deadline is None or time.monotonic() < self.deadline:
            return
        if self.tried_group:
            raise KeyboardInterrupt
        self.tried_group = True
        self.deadline = time.monotonic() + GRACE
        side = open_channel(self.conn, self.host)
        side.exec_command(bash_script(render("access/shell_signal.sh.j2", token=self.token,
                                             signal="INT")).render())
        side.recv_exit_status()
        side.close()


def _lost(host: str) -> ConnectionLost:
    return ConnectionLost(host, "the shell")


def run_command(conn: Connection, host: str, script: str, token: str) -> int:
    """Run ``script`` (made with ``token``) without a pty; stream its stdout and stderr here as
    they come; pass this side's stdin on when it is a pipe or file. Returns its exit code.
    Ctrl-C: see ``Interrupter``; KeyboardInterrupt when it gives up (the session closed)."""
    chan = open_channel(conn, host)
    chan.exec_command(bash_script(script).render())
    stop = Interrupter(conn, host, chan, token)
    fd_in = sys.stdin.fileno() if sys.stdin is not None else -1
    feeding = [fd_in >= 0 and not os.isatty(fd_in)]  # still passing this side's stdin on
    if not feeding[0]:
        chan.shutdown_write()
    while True:
        try:
            return _pump(chan, host, stop, fd_in, feeding)
        except KeyboardInterrupt:
            try:
                stop.interrupt()
            except KeyboardInterrupt:
                chan.close()  # the host's sshd ends the session: its command loses its pipes
                raise


def _pump(chan: paramiko.Channel, host: str, stop: Interrupter, fd_in: int,
          feeding: list[bool]) -> int:
    """Stream until the command ends; returns its exit code. Called again after a Ctrl-C:
    ``feeding`` keeps whether stdin is still passed on."""
    out, err = sys.stdout.buffer, sys.stderr.buffer
    try:
        while True:
            waits: list[Any] = [chan, *([fd_in] if feeding[0] else [])]
            ready, _, _ = select.select(waits, [], [], 0.2)
            while chan.recv_ready():
                out.write(chan.recv(CHUNK))
                out.flush()
            while chan.recv_stderr_ready():
                err.write(chan.recv_stderr(CHUNK))
                err.flush()
            if feeding[0] and fd_in in ready:
                data = os.read(fd_in, CHUNK)
                if data:
                    chan.sendall(data)
                else:
                    chan.shutdown_write()
                    feeding[0] = False
            if chan.exit_status_ready() and (chan.eof_received or chan.closed) and \
                    not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            if chan.closed and not chan.exit_status_ready():
                raise _lost(host)
            stop.check()
    except OSError as exc:
        transport = chan.get_transport()
        if transport is None or not transport.is_active():
            raise _lost(host) from exc
        raise
    code = chan.recv_exit_status()
    if code < 0:
        raise _lost(host)
    return code


def _size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
        return size.columns, size.lines
    except OSError:
        return 80, 24


def interactive(conn: Connection, host: str, script: str) -> int:
    """A login through a pty on the host; this terminal raw until it ends. Returns the remote
    shell's exit code. Needs stdin to be a terminal (the caller checks)."""
    fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
    cols, rows = _size(fd_in)
    chan = open_channel(conn, host)
    chan.get_pty(term=os.environ.get("TERM") or "xterm-256color", width=cols, height=rows)
    chan.exec_command(bash_script(script).render())
    saved = termios.tcgetattr(fd_in)
    main = threading.current_thread() is threading.main_thread()

    def resized(signum: int, frame: object) -> None:
        c, r = _size(fd_in)
        try:
            chan.resize_pty(width=c, height=r)
        except Exception:  # noqa: BLE001 - a resize racing the end of the session: nothing to do
            pass

    previous = signal.signal(signal.SIGWINCH, resized) if main else None
    try:
        tty.setraw(fd_in)
        reading = True
        while True:
            try:
                ready, _, _ = select.select([chan, *([fd_in] if reading else [])], [], [], 0.5)
            except KeyboardInterrupt:  # SIGINT sent to us (the raw terminal sends no signal):
                chan.sendall(b"\x03")  # passed on as the key, which the host's pty turns
                continue               # into SIGINT for what runs there
            if chan in ready or chan.recv_ready():
                data = chan.recv(CHUNK)
                if not data:
                    break
                os.write(fd_out, data)
            if reading and fd_in in ready:
                typed = os.read(fd_in, CHUNK)
                if typed:
                    chan.sendall(typed)
                else:  # this side's terminal went away
                    chan.shutdown_write()
                    reading = False
            if chan.closed:
                break
    except OSError as exc:
        raise _lost(host) from exc
    finally:
        termios.tcsetattr(fd_in, termios.TCSADRAIN, saved)
        if main:
            signal.signal(signal.SIGWINCH, previous)
    code = chan.recv_exit_status()
    if code < 0:
        raise _lost(host)
    return code
