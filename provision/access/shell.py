"""``shell``: a login on the host over our pinned connection, in the env bootstrap made, in the
data dir; or one command there (``shell -- CMD``), its exit code returned.

Interactive: a real pty on the host (``get_pty`` with this terminal's size, resized on SIGWINCH),
this terminal in raw mode, so every key reaches the host as typed: Ctrl-C is the byte 0x03 and
the host's pty turns it into SIGINT for whatever runs there, as plain ``ssh -t`` does. The exit
code is the remote shell's.

One command: no pty (as ``ssh host CMD``), stdout and stderr kept apart, this side's stdin
passed on when it is not a terminal (``shell -- tar x < a.tar``).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import termios
import threading
import tty
from collections.abc import Sequence

from fabric import Connection

from ..errors import ConnectionLost
from ..remote.command import bash_script
from ..remote.templating import render
from .channels import open_channel

CHUNK = 1 << 16


def shell_script(data_dirs: Sequence[str], argv: Sequence[str] | None) -> str:
    """What runs on the host: the env's activation (the same file bootstrap's login block
    sources), the data dir (the first of ``data_dirs`` that exists, else the home), then a login
    shell or ``argv`` (words as given, never re-split)."""
    return render("access/shell.sh.j2", data_dirs=list(data_dirs),
                  argv=list(argv) if argv is not None else None,
                  activate=render("setup/activate.sh"))


def _lost(host: str) -> ConnectionLost:
    return ConnectionLost(host, "the shell")


def run_command(conn: Connection, host: str, script: str) -> int:
    """Run ``script`` without a pty; stream its stdout and stderr here as they come; pass this
    side's stdin on when it is a pipe or file. Returns its exit code."""
    chan = open_channel(conn, host)
    chan.exec_command(bash_script(script).render())
    fd_in = sys.stdin.fileno() if sys.stdin is not None else -1
    feeding = fd_in >= 0 and not os.isatty(fd_in)
    if not feeding:
        chan.shutdown_write()
    out, err = sys.stdout.buffer, sys.stderr.buffer
    try:
        while True:
            ready, _, _ = select.select([chan, *([fd_in] if feeding else [])], [], [], 0.2)
            while chan.recv_ready():
                out.write(chan.recv(CHUNK))
                out.flush()
            while chan.recv_stderr_ready():
                err.write(chan.recv_stderr(CHUNK))
                err.flush()
            if feeding and fd_in in ready:
                data = os.read(fd_in, CHUNK)
                if data:
                    chan.sendall(data)
                else:
                    chan.shutdown_write()
                    feeding = False
            if chan.exit_status_ready() and (chan.eof_received or chan.closed) and \
                    not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            if chan.closed and not chan.exit_status_ready():
                raise _lost(host)
    except KeyboardInterrupt:
        chan.close()  # the host's sshd ends the session: its command loses its pipes
        raise
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
            ready, _, _ = select.select([chan, *([fd_in] if reading else [])], [], [], 0.5)
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
