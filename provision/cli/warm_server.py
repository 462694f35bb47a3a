"""The warm start, server side (``warm.py`` says what it is for): ``python -m
provision.cli.warm_server SOCKET IDLE`` imports the whole program once, then for each command
forks a worker that becomes that command (its argv, folder, environment, umask and standard
streams), runs it and reports its exit code; it ends once no command came for IDLE seconds.

It stays single-threaded (a fork copies one thread only: a lock held by another thread would stay
locked in the worker for ever), and answers only its own user (``rundir.caller_is_ours``; the
socket's folder is 0700 everywhere).
"""

from __future__ import annotations

import atexit
import fcntl
import io
import json
import os
import pkgutil
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from importlib import import_module
from typing import IO, Any

from ..remote.rundir import caller_is_ours

WAIT = 1.0  # seconds between looks at the idle clock and at finished workers
SKIP = ("provision.cli.warm_server", "provision.remote.keeper")  # programs, not libraries


def preload() -> None:
    """Every module of the program, so that no worker pays for an import."""
    import provision
    for mod in pkgutil.walk_packages(provision.__path__, "provision."):
        if mod.name.endswith("__main__") or mod.name in SKIP:
            continue
        try:
            import_module(mod.name)
        except Exception:  # an optional extra not installed: its worker imports it, as today
            pass


def receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    head, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
    if len(head) != 4:
        raise OSError("short request")
    size = struct.unpack("!I", head)[0]
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise OSError("short request")
        body += chunk
    request = json.loads(body)
    if not isinstance(request, dict):
        raise OSError("bad request")
    return request, list(fds)


def become_limited(request: dict[str, Any]) -> bool:
    """The client's priority (nice) and resource limits (ulimit). False where the kernel
    refuses one (a server started under `nice` or a lower hard limit, which a user may not
    undo): then the worker does not run the command, and the client runs it by itself."""
    import resource
    try:
        os.setpriority(os.PRIO_PROCESS, 0, int(request.get("nice", 0)))
    except (OSError, ValueError):
        pass
    same = os.getpriority(os.PRIO_PROCESS, 0) == int(request.get("nice", 0))
    for name, (soft, hard) in (request.get("limits") or {}).items():
        which = getattr(resource, str(name), None)
        if not isinstance(which, int):
            continue
        try:
            resource.setrlimit(which, (int(soft), int(hard)))
        except (OSError, ValueError):
            pass
        same = same and list(resource.getrlimit(which)) == [int(soft), int(hard)]
    return same


def _stream(fd: int, mode: str, encoding: str | None) -> Any:
    """A fresh standard stream on ``fd``: buffered as Python buffers a terminal or a pipe."""
    raw = io.FileIO(fd, mode[0], closefd=False)
    if mode == "r":
        return io.TextIOWrapper(io.BufferedReader(raw), encoding=encoding)
    buffered = io.BufferedWriter(raw)
    line = raw.isatty() or fd == 2 or bool(os.environ.get("PYTHONUNBUFFERED"))
    return io.TextIOWrapper(buffered, encoding=encoding, line_buffering=line,
                            write_through=fd == 2,
                            errors="backslashreplace" if fd == 2 else None)


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def work(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> int:
    """In the forked worker: become the client's command, run it, return its exit code."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()  # the client's $TZ: run ids and "newest" are in its time, not the server's
    os.umask(int(request["umask"]))
    if not become_limited(request):  # before our pid is said: the client runs it by itself
        raise OSError("the client's priority or limits cannot be taken here")
    sys.argv = [request.get("argv0") or "gpu-provision", *request["argv"]]
    encodings = request.get("encodings") or [None, None, None]
    sys.stdin = _stream(0, "r", encodings[0])
    sys.stdout = _stream(1, "w", encodings[1])
    sys.stderr = _stream(2, "w", encodings[2])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD, signal.SIGTSTP):
        signal.signal(sig, signal.SIG_DFL)
    ignored = [int(s) for s in request.get("ignored") or []]
    for num in ignored:  # as the client's were (nohup, a script's background job)
        signal.signal(num, signal.SIG_IGN)
    conn.sendall(f"pid {os.getpid()}\n".encode())

    def client_gone() -> None:  # the client was killed: end as if Ctrl-C had been pressed
        try:
            gone = conn.recv(1) == b""
        except OSError:
            gone = True
        if gone:  # (SIGTERM where the client ignored Ctrl-C: it still ends)
            os.kill(os.getpid(), signal.SIGTERM if signal.SIGINT in ignored else signal.SIGINT)

    threading.Thread(target=client_gone, daemon=True).start()
    from .main import main
    try:
        main()
        code = 0
    except SystemExit as e:
        code = _exit_code(e)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    return code


def finish(conn: socket.socket, code: int) -> None:
    """What the interpreter does on its way out (other threads joined, atexit, flushed), then
    the exit code to the client."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client closing now is no Ctrl-C
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except (OSError, ValueError):
            pass
    try:
        conn.sendall(f"exit {code}\n".encode())
    except OSError:
        pass


class Server:
    def __init__(self, path: str, idle: int, lock: IO[str]):
        self.path, self.idle, self.lock = path, idle, lock
        self.started = self.last = time.time()
        self.served = 0
        self.workers: set[int] = set()

    def reap(self) -> None:
        for pid in list(self.workers):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.workers.discard(pid)

    def status(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "started": self.started, "last": self.last,
                "now": time.time(), "served": self.served, "running": len(self.workers),
                "keep": self.idle}

    def serve(self, listener: socket.socket) -> None:
        listener.settimeout(WAIT)
        while True:
            self.reap()
            if time.time() - self.last > self.idle:
                return
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            if not self.handle(conn, listener):
                return

    def handle(self, conn: socket.socket, listener: socket.socket) -> bool:
        """One request; False when the server should end."""
        fds: list[int] = []
        try:
            conn.settimeout(5.0)
            if not caller_is_ours(conn):
                return True  # (the client runs the command by itself)
            request, fds = receive(conn)
            op = request.get("op")
            if op in ("status", "stop"):
                conn.sendall(json.dumps(self.status()).encode() + b"\n")
                return bool(op == "status")
            if op != "run" or fds:
                return True
            # the client's stdin, stdout and stderr only now, asked for: descriptors in flight
            # to a server that never reads them (stopped, wedged) would hold the client's pipes
            # open, and a caller reading its output to the end would wait for ever
            conn.sendall(b"fds\n")
            _, fds, _flags, _addr = socket.recv_fds(conn, 1, 3)
            if len(fds) != 3:
                return True
            conn.settimeout(None)
            pid = os.fork()
            if pid == 0:  # the worker
                listener.close()
                # a flock lasts while any copy of its descriptor is open: a worker that runs
                # for hours (logs -f) must not keep the next server of this code from starting
                self.lock.close()
                code = 1
                try:
                    code = work(conn, request, fds)
                finally:
                    try:
                        finish(conn, code)
                    finally:  # whatever failed: a worker never goes back to serving
                        os._exit(code & 0xFF)
            self.workers.add(pid)
            self.served += 1
            self.last = time.time()
            return True
        except (OSError, ValueError, KeyError):
            return True
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            conn.close()


def main() -> None:
    path, idle = sys.argv[1], int(sys.argv[2])
    lock = open(f"{path}.lock", "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # a server of this code runs (it holds the lock while it lives)
    # holding the lock, a socket at ``path`` is a killed server's: bind replaces it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # ends through the finally below
    preload()
    from ..remote.rundir import bind
    listener = bind(path)
    try:
        Server(path, idle, lock).serve(listener)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        listener.close()


if __name__ == "__main__":
    main()
