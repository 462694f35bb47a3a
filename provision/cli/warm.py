"""The warm start, client side: a command is handed to a server of ours that has the whole
program imported already (``warm_server.py``) and forks a worker for it, so that a command over a
kept connection costs its round trip and its own work, not half a second of imports each time
(Mercurial's chg does the same for hg).

The worker is this command in all that a user can see: it gets our argv, working folder,
environment and umask, and our stdin, stdout and stderr themselves (passed over the Unix socket,
SCM_RIGHTS), so a terminal stays a terminal and a pipe a pipe; Ctrl-C and the other ending signals
are passed on to it; its exit code is ours. When anything here fails the command runs in this
process, as without a warm start: a warm start is never a new way to fail.

It is on when connections are kept (not with --no-keep, --keep 0, $GPU_PROVISION_KEEP=0;
$GPU_PROVISION_WARM=0 turns off this part alone), for commands to hosts (-H); without Unix
sockets or fork (Windows) never; ``shell`` and password prompts run here (they need this
terminal as their controlling one). The server starts after a
command that ran here, lives for the keep time since its last command, and its socket sits
beside the keepers' (0600 in a 0700 folder of ours), named by a hash of the interpreter and of
this copy of the program (every file's size and time): an upgrade or an edit never runs old code.

Standard library only: this runs before anything heavy is imported.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from ..remote.rundir import SAFE_PATH, connect_ours, remove_stale, run_dir

PREFIX = "w-"  # a warm server's socket name: w- and 17 hex digits (a keeper's is 20 hex digits)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
INTERACTIVE = frozenset({"shell", "authorize"})  # tasks that need our terminal as their controlling one
DEFAULT_IDLE = 600
ANSWER = 10.0  # seconds a server may take to fork the worker and say its pid (it takes ms)


class Abandoned(Exception):
    """An ending signal came before the worker was known: the client stops waiting at once."""


def idle_seconds() -> int | None:
    """How long a warm server waits for the next command: the keep time of $GPU_PROVISION_KEEP,
    else 10 minutes; None when keeping is off or the value is not whole seconds."""
    raw = os.environ.get("GPU_PROVISION_KEEP", "").strip()
    if not raw:
        return DEFAULT_IDLE
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def wanted(argv: list[str]) -> bool:
    """Whether this command line may be served warm (see the module's docstring)."""
    if not (hasattr(os, "fork") and hasattr(socket, "AF_UNIX") and hasattr(socket, "send_fds")):
        return False
    if idle_seconds() is None or os.environ.get("GPU_PROVISION_WARM", "").strip() == "0":
        return False
    words = argv[:argv.index("--")] if "--" in argv else argv
    has_host = False
    for i, w in enumerate(words):
        if w in ("--no-keep", "--keep=0") or (w == "--keep" and words[i + 1:i + 2] == ["0"]):
            return False
        if w.startswith("--prompt") or w in INTERACTIVE:
            return False
        has_host = has_host or w in ("-H", "--hosts") or w.startswith(("-H", "--hosts="))
    return has_host


def code_key(root: Path | None = None) -> str:
    """This interpreter and this copy of the program (``root``: its package folder), down to
    each file's size and time, and every distribution installed beside it (each one's
    ``*.dist-info`` folder names its version and is rewritten by an install): an upgrade of
    paramiko or fabric never runs in a server that loaded the old one."""
    root = root or Path(__file__).resolve().parents[1]
    h = hashlib.sha256(f"{os.getuid()} {sys.executable} {root} "
                       f"{os.environ.get('PYTHONPATH', '')}".encode())
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            st = os.stat(os.path.join(folder, name))
            h.update(f"{folder}/{name} {st.st_size} {st.st_mtime_ns}\n".encode())
    for entry in sys.path:
        try:
            names = sorted(n for n in os.listdir(entry or ".") if n.endswith(".dist-info"))
        except OSError:
            continue
        for name in names:
            st = os.stat(os.path.join(entry or ".", name))
            h.update(f"{entry}/{name} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def socket_for(argv: list[str]) -> str | None:
    """The warm server's socket for this command line; None when it may not be served warm."""
    d = run_dir() if wanted(argv) else None
    return None if d is None else str(d / f"{PREFIX}{code_key()[:17]}")


def _message(argv: list[str]) -> bytes:
    umask = os.umask(0)
    os.umask(umask)
    streams = (sys.stdin, sys.stdout, sys.stderr)
    return json.dumps({"op": "run", "argv0": sys.argv[0], "argv": argv, "cwd": os.getcwd(),
                       "env": dict(os.environ), "umask": umask, "ignored": ignored(),
                       "nice": os.getpriority(os.PRIO_PROCESS, 0), "limits": limits(),
                       "encodings": [getattr(s, "encoding", None) for s in streams]}).encode()


def limits() -> dict[str, list[int]]:
    """Our resource limits (``ulimit``): the worker takes them, as a child of ours would."""
    import resource  # (POSIX only, as the warm start is)
    found = {}
    for name in dir(resource):
        if name.startswith("RLIMIT_"):
            try:
                found[name] = list(resource.getrlimit(getattr(resource, name)))
            except (OSError, ValueError):
                continue
    return found


def ignored() -> list[int]:
    """The ending signals this process was told to ignore (``nohup``: SIGHUP; a background job
    of a script: SIGINT, SIGQUIT): the worker ignores them too, and we pass none of them on."""
    return [int(sig) for sig in (*FORWARDED, signal.SIGTSTP)
            if signal.getsignal(sig) == signal.SIG_IGN]


def send(sock: socket.socket, message: bytes, fds: list[int]) -> None:
    """One request: its length with the file descriptors, then its body."""
    socket.send_fds(sock, [struct.pack("!I", len(message))], fds)
    sock.sendall(message)


class Relay:
    """Our signals, passed on to the worker. Installed before the request goes out: the worker
    may write to our terminal before we read its pid, and a Ctrl-C or Ctrl-Z in that moment
    must reach it, not end or stop this process alone. Until the pid is known a Ctrl-Z waits,
    and an ending signal ends the wait (the worker has not started the command) and then this
    process. Signals we were told to ignore stay ignored, here and in the worker."""

    def __init__(self) -> None:
        self.worker: int | None = None
        self.waiting: list[int] = []
        self.abandon = True  # until the worker is known, an ending signal ends the wait
        self.passed: int | None = None  # the last ending signal passed on to the worker
        skip = ignored()
        self.before = {sig: signal.getsignal(sig) for sig in (*FORWARDED, signal.SIGTSTP)
                       if sig not in skip}
        for sig in self.before:
            signal.signal(sig, self.on_signal)

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.worker is None:
            self.waiting.append(signum)
            if signum != signal.SIGTSTP and self.abandon:
                raise Abandoned  # a server that does not answer must not hold Ctrl-C
        elif signum == signal.SIGTSTP:
            self.suspend()
        else:
            self.pass_on(signum)

    def pass_on(self, signum: int) -> None:
        if self.worker is None:
            return
        if signum != signal.SIGCONT and signum != signal.SIGSTOP:
            self.passed = signum
        try:
            os.kill(self.worker, signum)
        except ProcessLookupError:
            pass

    def suspend(self) -> None:
        """Ctrl-Z: the worker stops with us (it is not in the terminal's foreground group, so
        the terminal's SIGTSTP never reaches it), and goes on when we are resumed."""
        self.pass_on(signal.SIGSTOP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stopped here until `fg` or `bg`
        signal.signal(signal.SIGTSTP, self.on_signal)
        self.pass_on(signal.SIGCONT)

    def attach(self, worker: int) -> None:
        self.worker = worker
        for signum in self.waiting:
            self.on_signal(signum, None)
        self.waiting = []

    def restore(self) -> None:
        """No worker after all: our own handlers back, and what came meanwhile delivered here."""
        for sig, handler in self.before.items():
            signal.signal(sig, handler)
        for signum in self.waiting:
            os.kill(os.getpid(), signum)


def run_warm(path: str, argv: list[str]) -> int | None:
    """Run this command through the warm server at ``path`` and return its exit code; None when
    there is no server to take it (the caller runs it here)."""
    if not os.path.exists(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # bounded: a frozen or wedged server is given up after ANSWER seconds, and a Ctrl-C, SIGTERM
    # or SIGHUP meanwhile ends the wait at once. The worker had not said its pid, so it had not
    # started the command; and it never will: its first word would go to a closed socket.
    sock.settimeout(ANSWER)
    relay: Relay | None = None
    try:
        relay = Relay()
        connect_ours(sock, path)  # another user's socket: neither our env nor our stdio
        send(sock, _message(argv), [])
        reader = sock.makefile("rb")
        # our stdin, stdout and stderr once the server asks: never in flight to one that does
        # not read them (a frozen server would hold our pipes open, and whoever reads our
        # output to its end would wait with it)
        if reader.readline() == b"fds\n":
            socket.send_fds(sock, [b"F"], [0, 1, 2])
        first = reader.readline()
    except (OSError, Abandoned):  # none there, a stale socket, a closed stdin: run it here
        first = b""
    if relay is None:  # a signal before its handlers were all in place: ours now
        sock.close()
        raise Abandoned
    relay.abandon = False
    if not first.startswith(b"pid "):  # or the server is ending
        sock.close()
        relay.restore()  # a signal that came meanwhile is ours now: it ends this process
        return None
    sock.settimeout(None)
    relay.attach(int(first.split()[1]))
    last = reader.readline()
    sock.close()
    if last.startswith(b"exit "):
        return int(last.split()[1])
    # the worker ended without its exit code: killed (it says nothing more then). By the signal
    # we passed on: we end by it too, as the command would have without a warm start
    if relay.passed is not None and relay.passed != signal.SIGINT:
        signal.signal(relay.passed, signal.SIG_DFL)
        os.kill(os.getpid(), relay.passed)
    print("gpu-provision: the command ended without an exit status (killed?)", file=sys.stderr)
    return 1


def start_server(path: str) -> None:
    """After a command that ran here: start a warm server at ``path`` for the next one (it
    imports the program in the background and ends by itself). A server already there holds its
    lock, and the new one ends at once; a socket left by a killed one is replaced."""
    idle = idle_seconds()
    if idle is None:
        return
    root = str(Path(__file__).resolve().parents[2])
    rest = os.environ.get("PYTHONPATH")
    try:
        subprocess.Popen([sys.executable, *SAFE_PATH, "-m", "provision.cli.warm_server", path,
                          str(idle)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, cwd="/", start_new_session=True,
                         env={**os.environ,
                              "PYTHONPATH": f"{root}{os.pathsep}{rest}" if rest else root})
    except OSError:
        pass


def ask(path: str, op: str, timeout: float = 5.0) -> dict[str, Any] | None:
    """A warm server's answer to ``status`` or ``stop``; None when nobody answers."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        connect_ours(sock, path)
        send(sock, json.dumps({"op": op}).encode(), [])
        line = sock.makefile("rb").readline()
        answer = json.loads(line) if line else None
    except (OSError, ValueError):
        return None
    finally:
        sock.close()
    return answer if isinstance(answer, dict) else None


def servers() -> list[dict[str, Any]]:
    """What each warm server of this user says about itself; stale sockets are removed."""
    d = run_dir()
    if d is None:
        return []
    found = []
    for p in sorted(d.glob(f"{PREFIX}*")):
        if not p.is_socket():
            continue
        answer = ask(str(p), "status")
        if answer is None:
            remove_stale(p)  # a killed server's (a slow one keeps its socket)
            continue
        found.append({**answer, "path": str(p)})
    return found
