"""``forward``: ports on this machine (127.0.0.1 only) to ports on the host, over our pinned
connection, as ``ssh -L 127.0.0.1:LOCAL:localhost:PORT`` would, several at once.

Each local port is taken (bound) before the connection is made, so a busy one is known at once:
one asked for explicitly (``8888:9000``) is an error; one that only followed the host's port
(``8888``) moves to the next free port, and the line says so. Each connection accepted there
becomes a ``direct-tcpip`` channel (RFC 4254 7.2) to ``localhost:PORT`` as the host sees it, so a
server bound to the host's loopback only (the safe default) is reached. A watcher per port says
when nothing listens there yet, keeps trying, and says when it answers; with a check path
(``/v1/models``, ``/api/tags``) it also says what the server answered there.
"""

from __future__ import annotations

import errno
import re
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import paramiko
from fabric import Connection

from ..errors import SSHError, UsageError
from .channels import NothingListens, open_channel

LOOPBACK = "127.0.0.1"  # never another address: the host's ports are not this machine's to share
REMOTE_HOST = "localhost"  # as the host resolves it: 127.0.0.1 or ::1, whichever the server took
NEXT_FREE_TRIES = 100
POLL = 1.0  # seconds between tries while nothing listens on the host's port
CHUNK = 1 << 16
Note = Callable[[str], None]


@dataclass(frozen=True)
class PortSpec:
    remote: int
    local: int
    asked: bool  # the local port was given (``PORT:LOCAL``): never moved to another


def _port(text: str, what: str, spec: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise UsageError(f"forward {spec}: {what} {text!r} is not a port number (1-65535); "
                         "write PORT or PORT:LOCAL, e.g. 8888 or 8888:9000") from None
    if not 1 <= n <= 65535:
        raise UsageError(f"forward {spec}: {what} {n} is out of range (a port is 1-65535)")
    return n


def parse_specs(texts: Sequence[str]) -> list[PortSpec]:
    """``PORT`` or ``PORT:LOCAL`` (the host's port first, as the task's help says)."""
    if not texts:
        raise UsageError("forward: name the host's port(s), e.g. forward 8888 or 8888:9000 "
                         "(or a recipe with serve:)")
    out: list[PortSpec] = []
    for text in texts:
        remote, sep, local = text.partition(":")
        r = _port(remote, "the host's port", text)
        spec = PortSpec(r, _port(local, "the local port", text) if sep else r, bool(sep))
        if any(s.remote == spec.remote for s in out):
            raise UsageError(f"forward {text}: the host's port {r} is named twice")
        if spec.asked and any(s.asked and s.local == spec.local for s in out):
            raise UsageError(f"forward {text}: the local port {spec.local} is named twice")
        out.append(spec)
    return out


def _listen(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((LOOPBACK, port))
        s.listen(16)
    except OSError:
        s.close()
        raise
    return s


@dataclass
class Bound:
    spec: PortSpec
    local: int
    sock: socket.socket
    moved: bool = False  # the port followed the host's, which was busy here

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.local}"

    def as_json(self) -> dict[str, object]:
        return {"remote": self.spec.remote, "local": self.local, "url": self.url,
                "moved": self.moved}


def bind_all(specs: Sequence[PortSpec]) -> list[Bound]:
    """Take every local port now, before connecting (all or none)."""
    bound: list[Bound] = []
    try:
        for spec in specs:
            bound.append(_bind_one(spec, {b.local for b in bound}))
    except BaseException:
        for b in bound:
            b.sock.close()
        raise
    return bound


def _bind_one(spec: PortSpec, taken: set[int]) -> Bound:
    try:
        if spec.local in taken:
            raise OSError(errno.EADDRINUSE, "taken by an earlier port of this forward")
        return Bound(spec, spec.local, _listen(spec.local))
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
            raise UsageError(f"forward: cannot listen on {LOOPBACK}:{spec.local} ({exc.strerror})"
                             ) from None
        why = "is in use on this machine" if exc.errno == errno.EADDRINUSE else \
            "needs root on this machine (below 1024)"
        if spec.asked:
            raise UsageError(f"forward {spec.remote}:{spec.local}: local port {spec.local} {why}; "
                             f"pick another, e.g. {spec.remote}:{_suggest(spec.local, taken)}"
                             ) from None
    start = max(spec.local + 1, 1024)
    for port in range(start, min(start + NEXT_FREE_TRIES, 65536)):
        if port in taken:
            continue
        try:
            return Bound(spec, port, _listen(port), moved=True)
        except OSError:
            continue
    raise UsageError(f"forward {spec.remote}: local port {spec.local} and the next "
                     f"{NEXT_FREE_TRIES} are in use; give one with {spec.remote}:LOCAL")


def _suggest(port: int, taken: set[int]) -> int:
    for p in range(max(port + 1, 1024), 65536):
        if p in taken:
            continue
        try:
            _listen(p).close()
            return p
        except OSError:
            continue
    return 0


def _pump(a: socket.socket, chan: paramiko.Channel) -> None:
    """Bytes both ways between a local socket and a channel until the host's side is done. A
    local client that stops sending (a half-close) has its end passed on to the host, as ssh -L
    does, and the answer still comes back to it."""
    sending = True
    try:
        while not chan.closed:
            watched = [a, chan] if sending else [chan]
            ready, _, _ = select.select(watched, [], [], 1.0)  # type: ignore[type-var]
            if a in ready:
                data = a.recv(CHUNK)
                if data:
                    chan.sendall(data)
                else:
                    sending = False
                    chan.shutdown_write()
            if chan in ready:
                data = chan.recv(CHUNK)
                if not data:
                    break
                a.sendall(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        chan.close()
        a.close()


@dataclass
class Forwarder:
    """Serves every bound port over ``conn`` until ``stop()``."""

    conn: Connection
    host: str
    bound: list[Bound]
    note: Note
    checks: dict[int, str] = field(default_factory=dict)  # host port -> HTTP path to try
    stopped: threading.Event = field(default_factory=threading.Event)
    answering: dict[int, bool] = field(default_factory=dict)
    failure: list[BaseException] = field(default_factory=list)

    def tunnel(self, remote: int) -> paramiko.Channel:
        return open_channel(self.conn, self.host, "direct-tcpip", (REMOTE_HOST, remote))

    def start(self) -> None:
        for b in self.bound:
            threading.Thread(target=self._accept, args=(b,), daemon=True,
                             name=f"forward-{b.local}").start()
            threading.Thread(target=self._watch, args=(b,), daemon=True,
                             name=f"watch-{b.spec.remote}").start()

    def stop(self) -> None:
        self.stopped.set()
        for b in self.bound:
            b.sock.close()

    def _accept(self, b: Bound) -> None:
        while not self.stopped.is_set():
            try:
                ready, _, _ = select.select([b.sock], [], [], 0.5)
                if not ready:
                    continue
                client, _ = b.sock.accept()
            except OSError:
                return
            try:
                chan = self.tunnel(b.spec.remote)
            except NothingListens:
                client.close()  # the browser sees a closed connection, as with ssh -L
                continue
            except SSHError as exc:
                client.close()
                self.failure.append(exc)
                self.stopped.set()
                return
            threading.Thread(target=_pump, args=(client, chan), daemon=True).start()

    def _watch(self, b: Bound) -> None:
        """Say whether the host's port answers; while it does not, say so once and keep
        trying; once it does, check the serving path if one is set."""
        said_waiting = False
        while not self.stopped.is_set():
            try:
                self.tunnel(b.spec.remote).close()
            except NothingListens:
                if not said_waiting:
                    self.note(f"nothing listens on {self.host}'s port {b.spec.remote} yet; "
                              "waiting for it (Ctrl-C stops)")
                    said_waiting = True
                self.stopped.wait(POLL)
                continue
            except SSHError as exc:
                self.failure.append(exc)
                self.stopped.set()
                return
            self.answering[b.spec.remote] = True
            if said_waiting:
                self.note(f"{self.host}'s port {b.spec.remote} answers now: {b.url}")
            path = self.checks.get(b.spec.remote)
            if path:
                self._check(b, path)
            return

    def _check(self, b: Bound, path: str) -> None:
        """GET ``path`` through the tunnel until it answers 200 (a model server takes a while
        to load its model after its port opens); say what it answered."""
        url = b.url + path
        said = ""
        # straight to our own port: an http_proxy in the environment must not take it
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not self.stopped.is_set():
            try:
                with opener.open(url, timeout=10) as r:
                    body = r.read(4096).decode("utf-8", "replace")
                    self.note(f"GET {path}: {r.status} {summary(body)}")
                    return
            except urllib.error.HTTPError as exc:
                why = f"{exc.code} {exc.reason}"
            except (urllib.error.URLError, OSError) as exc:
                why = str(getattr(exc, "reason", exc))
            if why != said:
                self.note(f"GET {path}: {why}; trying again")
                said = why
            self.stopped.wait(2 * POLL)


def summary(body: str) -> str:
    """What a serving check's answer says, in a few words: the model ids of an OpenAI-style
    ``/v1/models`` or Ollama's ``/api/tags``, else the first bytes."""
    ids = re.findall(r'"(?:id|name)"\s*:\s*"([^"]+)"', body)
    if ids:
        return "models: " + ", ".join(dict.fromkeys(ids))
    text = " ".join(body.split())
    return text[:80] + ("..." if len(text) > 80 else "")


TOKEN_URL = re.compile(r"https?://[^\s/]+:(\d+)(/[^\s]*[?&]token=[0-9A-Za-z]+)")


def jupyter_url(line: str, bound: Sequence[Bound]) -> str | None:
    """A Jupyter server's token URL in a log line, rewritten to the local port it is forwarded
    to (None when the line has none, or its port is not forwarded)."""
    m = TOKEN_URL.search(line)
    if not m:
        return None
    port = int(m.group(1))
    for b in bound:
        if b.spec.remote == port:
            return f"{b.url}{m.group(2)}"
    return None


def wait(fwd: Forwarder, alive: Callable[[], bool] = lambda: True) -> None:
    """Until Ctrl-C, a lost connection, or ``alive()`` turning false (a job that ended)."""
    try:
        while not fwd.stopped.is_set() and alive():
            time.sleep(0.2)
    finally:
        fwd.stop()
    if fwd.failure:
        raise fwd.failure[0]
