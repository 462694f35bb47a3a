"""The keeper: a background process that holds one authenticated SSH connection to one host and
serves the channels of later commands over a Unix socket (``relay.py`` says how), until it has
been idle for its ``keep`` seconds.

Started by ``keep.py`` as ``python -m provision.remote.keeper RUN_DIR``; it reads the target
(JSON) on stdin, connects with ``connection.connect`` (so the pinned host-key check and the named
failures are those of any connection), writes ``ready PATH`` (or ``error {...}``, or ``notify
TEXT`` lines on the way) to stdout, and then detaches from the command that started it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import paramiko

from . import relay
from .relay import BEAT, EOF, HEARTBEAT, SIGNAL, STATUS, STDERR, STDIN, STDOUT, WINDOW
from .rundir import caller_is_ours

if TYPE_CHECKING:
    from ..config.inventory import Target

POLL = 0.5  # seconds between looks at the idle clock and the connection
# ask the server for an answer this often; without one in time (longer behind a busy transfer)
# the connection is taken for dead
PROBE_EVERY, PROBE_WAIT, PROBE_WAIT_BUSY = 20.0, 10.0, 60.0
# A command's request id is either ISSUED (its exec went out on the link: the host may run it) or
# WITHDRAWN (its client asked about it first: it will never go out), whichever comes first; the
# last REMEMBERED ids are kept, far more than a client waits for its answer.
ISSUED, WITHDRAWN = "issued", "withdrawn"
REMEMBERED = 4096


class Withdrawn(Exception):
    """The command asked about this request before its exec went out: it is never sent."""


def _hung_up(client: socket.socket) -> bool:
    """Whether the command at ``client`` closed its end (it sends nothing until its answer)."""
    try:
        if not select.select([client], [], [], 0)[0]:
            return False
        return client.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class Keeper:
    def __init__(self, conn: Any, transport: paramiko.Transport, info: dict[str, Any],
                 keep: int, timeout: int):
        self.conn, self.transport, self.info = conn, transport, info
        self.keep, self.timeout = keep, timeout
        self.started = self.last = time.time()
        self.channels = 0
        self.lock = threading.Lock()
        self.spare: paramiko.Channel | None = None
        self.stopping = False
        self.probed = time.monotonic()
        self.probe: tuple[threading.Event, float, float] | None = None
        self.requests: OrderedDict[str, str] = OrderedDict()
        # the clients waiting for the answer to an exec or shell, by request id: each gets one
        # answer, from its channel's thread or, when we end first, from the end (_end_waiting)
        self.waiting: dict[str, socket.socket] = {}

    def _settle(self, request: str, state: str) -> str:
        """The request's state: ``state`` if it had none yet, else the one it has (the exec
        going out and its client asking about it cannot both win)."""
        with self.lock:
            settled = self.requests.setdefault(request, state)
            self.requests.move_to_end(request)
            while len(self.requests) > REMEMBERED:
                oldest, state = self.requests.popitem(last=False)
                if oldest in self.waiting:  # still waited for: its state must hold
                    self.requests[oldest] = state
                    break
        return settled

    def _answer(self, header: dict[str, Any], answer: dict[str, Any]) -> bool:
        """Send a waiting client its one answer; False when it had one already, or is gone."""
        request = header.get("id")
        with self.lock:
            client = self.waiting.pop(str(request), None) if request is not None else None
        if request is not None and client is None:
            return False
        try:
            header["client"].sendall(json.dumps(answer).encode() + b"\n")
        except OSError:
            return False
        return True

    def _end_waiting(self) -> None:
        """We end (the link is dead, a stop) with commands still waiting for their answer: each
        is told, and told truly whether its exec went out (a client that hears nothing must
        assume it may have)."""
        with self.lock:
            waiting, self.waiting = dict(self.waiting), {}
        for request, client in waiting.items():
            issued = self._settle(request, WITHDRAWN) == ISSUED
            try:
                client.sendall(json.dumps({"ok": False, "lost": True, "issued": issued,
                                           "error": "the kept connection ended"}).encode()
                               + b"\n")
            except OSError:
                pass


    def _issued(self, header: dict[str, Any]) -> bool:
        request = header.get("id")
        with self.lock:
            return request is not None and self.requests.get(str(request)) == ISSUED

    # a spare session channel, opened ahead: a command's exec then costs one round trip, not two
    def _fill_spare(self) -> None:
        try:
            chan = self.transport.open_session(timeout=self.timeout)
        except (paramiko.SSHException, OSError, EOFError):
            return
        with self.lock:
            old, self.spare = self.spare, chan
        if old is not None:
            old.close()

    def _session(self) -> paramiko.Channel:
        with self.lock:
            chan, self.spare = self.spare, None
        threading.Thread(target=self._fill_spare, daemon=True).start()
        if chan is not None and not chan.closed and self.transport.is_active():
            return chan
        return self.transport.open_session(timeout=self.timeout)

    def status(self) -> dict[str, Any]:
        return {**self.info, "pid": os.getpid(), "started": self.started, "last": self.last,
                "channels": self.channels, "keep": self.keep,
                "alive": self.transport.is_active() and not self.stopping}

    def serve(self, listener: socket.socket) -> None:
        threading.Thread(target=self._fill_spare, daemon=True).start()
        listener.settimeout(POLL)
        while not self.stopping:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                if self._should_end():
                    break
                continue
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()
        self._end_waiting()

    def _should_end(self) -> bool:
        if not self.transport.is_active():
            return True  # the host went away: the next command connects afresh
        with self.lock:
            busy = self.channels > 0
        if not busy and time.time() - self.last >= self.keep:
            return True
        now = time.monotonic()
        if self.probe is not None:
            answered, asked, wait = self.probe
            if answered.is_set():
                self.probe = None
            elif now - asked > wait:
                return True  # no answer: the link is dead, though nothing said so
        elif now - self.probed >= PROBE_EVERY:
            # also while busy: a channel stuck on a dead link would otherwise hold us forever
            self.probed = now
            self.probe = (self._ask_server(), now, PROBE_WAIT_BUSY if busy else PROBE_WAIT)
        return False

    def _ask_server(self) -> threading.Event:
        """A link that a proxy or NAT dropped sends no reset: ask the server for a reply (any
        reply, even a refusal, says it is there); the event is set when one comes."""
        answered = threading.Event()

        def probe() -> None:
            self.transport.global_request("keepalive@openssh.com", wait=True)
            if self.transport.is_active():
                answered.set()
        threading.Thread(target=probe, daemon=True).start()
        return answered

    def _handle(self, client: socket.socket) -> None:
        try:
            if not caller_is_ours(client):
                # (the socket is 0600 in a 0700 folder: this is the second guard; a process of
                # ours in another mount namespace, a sandbox sharing /tmp, holds no key either)
                return
            header = json.loads(relay.read_line(client))
            op = header.get("op")
            if op == "status":
                client.sendall(json.dumps(self.status()).encode() + b"\n")
            elif op == "stop":
                self.stopping = True
                client.sendall(b'{"ok": true}\n')
            elif op == "probe":
                # a command whose answer came too late asks (relay.py: at most once) whether its
                # exec went out (then the host may be running it), withdrawing it if not, and
                # whether the host answers on our link now
                request = header.get("id")
                issued = request is not None and self._settle(str(request), WITHDRAWN) == ISSUED
                asked = header.get("wait")
                wait = float(asked) if isinstance(asked, (int, float)) else float(self.timeout)
                answered: bool | None = None  # wait 0: a withdrawal, the link not asked about
                if wait > 0:
                    answered = self._ask_server().wait(min(wait, self.timeout))
                    with self.lock:  # (the asking command's own channel is not "busy")
                        busy = self.channels - (str(request) in self.waiting) > 0
                    if not answered and not busy:
                        self.stopping = True  # a dead link: the next command connects afresh
                    # (busy: a link full of others' data answers late; our own check, with its
                    # longer wait, judges it, not one command's probe)
                client.sendall(json.dumps({"answered": answered, "issued": issued}).encode()
                               + b"\n")
            else:
                self._channel(client, header)
        except (OSError, ValueError, relay.Gone):
            pass
        finally:
            client.close()

    def _open(self, header: dict[str, Any]) -> paramiko.Channel:
        op = header["op"]
        if op == "direct-tcpip":
            return self.transport.open_channel("direct-tcpip", tuple(header["dest"]),
                                               tuple(header["src"]), timeout=self.timeout)
        chan = self._session()
        try:
            if header.get("pty"):
                term, cols, rows = header["pty"]
                chan.get_pty(term, cols, rows)
            if header.get("env"):
                chan.update_environment(header["env"])
            if op in ("exec", "shell"):
                request = header.get("id")
                if request is not None and (_hung_up(header["client"])
                                            or self._settle(str(request), ISSUED) != ISSUED):
                    # its command asked about it, or went away (a Ctrl-C): never sent
                    self._settle(str(request), WITHDRAWN)
                    raise Withdrawn(f"request {request} was withdrawn by its command")
                if op == "exec":
                    chan.exec_command(header["command"])
                else:
                    chan.invoke_shell()
            elif op == "subsystem":
                chan.invoke_subsystem(header["name"])
            else:
                raise ValueError(f"unknown request {op!r}")
        except BaseException:
            chan.close()
            raise
        return chan

    def _channel(self, client: socket.socket, header: dict[str, Any]) -> None:
        header = {**header, "client": client}
        with self.lock:
            ended = self.stopping
            if not ended:
                self.channels += 1
                self.last = time.time()
                if header.get("id") is not None:
                    self.waiting[str(header["id"])] = client
        if ended:  # accepted as we end: nothing of it was sent
            client.sendall(json.dumps({"ok": False, "lost": True, "issued": False,
                                       "error": "the kept connection ended"}).encode() + b"\n")
            return
        try:
            try:
                chan = self._open(header)
            except paramiko.ChannelException as exc:  # the host said no: the link is fine
                self._answer(header, {"ok": False, "lost": False, "code": exc.code,
                                      "error": exc.text})
                return
            except Withdrawn:
                self._answer(header, {"ok": False, "lost": False, "withdrawn": True,
                                      "error": "withdrawn by its command"})
                return
            except (paramiko.SSHException, OSError, EOFError) as exc:
                lost = not self.transport.is_active() or isinstance(exc, (EOFError, OSError))
                # issued: the exec went out before the link failed, so the host may run it
                self._answer(header, {"ok": False, "lost": lost, "error": str(exc),
                                      "issued": self._issued(header)})
                if lost:
                    self.stopping = True
                return
            # the server's banner and the login: whether it acts on signal requests
            # (relay.honours_signals), as the command would read them from its own Transport
            framed = header["op"] in ("exec", "shell")
            if not self._answer(header, {"ok": True, "server": self.transport.remote_version,
                                         "user": self.transport.get_username(),
                                         "heartbeat": HEARTBEAT if framed else 0}):
                chan.close()  # its command is gone (a Ctrl-C) or was told we ended: end it
                return
            if framed:
                _framed(chan, client)
            else:
                _spliced(chan, client)
        finally:
            with self.lock:
                self.channels -= 1
                self.last = time.time()
                self.waiting.pop(str(header.get("id")), None)


def _framed(chan: paramiko.Channel, client: socket.socket) -> None:
    """stdout and stderr to the command as frames, then the exit status; stdin, its end and
    window sizes from the command. The command closing its socket (Ctrl-C, a timeout) closes
    this channel alone."""
    lock = threading.Lock()

    def pump(read: Any, kind: bytes) -> None:
        try:
            while data := read(1 << 15):
                relay.send_frame(client, kind, data, lock)
        except (OSError, paramiko.SSHException):
            chan.close()

    def commands() -> None:
        try:
            while (frame := relay.recv_frame(client)) is not None:
                kind, data = frame
                if kind == STDIN:
                    chan.sendall(data)
                elif kind == EOF:
                    chan.shutdown_write()
                elif kind == WINDOW:
                    cols, rows = json.loads(data)
                    chan.resize_pty(cols, rows)
                elif kind == SIGNAL:
                    relay.send_signal(chan, data.decode())
        except (OSError, ValueError, paramiko.SSHException):
            pass
        chan.close()  # the command went away: end what it ran (it alone)

    readers = [threading.Thread(target=pump, args=(chan.recv, STDOUT), daemon=True),
               threading.Thread(target=pump, args=(chan.recv_stderr, STDERR), daemon=True)]
    done = threading.Event()

    def beat() -> None:  # we are here (relay.HEARTBEAT): the client tells us from a frozen keeper
        try:
            while not done.wait(HEARTBEAT):
                relay.send_frame(client, BEAT, b"", lock)
        except OSError:
            pass

    for t in readers:
        t.start()
    threading.Thread(target=commands, daemon=True).start()
    threading.Thread(target=beat, daemon=True).start()
    for t in readers:
        t.join()
    # beats go on until the status is sent: a command that closed its own output (exec >log)
    # runs on silently, and its client must not take that for a frozen keeper
    code = chan.recv_exit_status()
    try:
        if code != -1:
            relay.send_frame(client, STATUS, str(code).encode(), lock)
        client.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    done.set()
    chan.close()


def _spliced(chan: paramiko.Channel, client: socket.socket) -> None:
    """Bytes both ways as they are (SFTP, a forwarded port)."""
    def up() -> None:
        try:
            while data := client.recv(1 << 16):
                chan.sendall(data)
            chan.shutdown_write()
        except (OSError, paramiko.SSHException):
            chan.close()

    t = threading.Thread(target=up, daemon=True)
    t.start()
    try:
        while data := chan.recv(1 << 16):
            client.sendall(data)
    except (OSError, paramiko.SSHException):
        pass
    try:
        client.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    chan.close()


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@dataclass(frozen=True)
class Login:
    """What ``connect`` reads of an inventory's Target, as the command that started us resolved
    it (pin name included): the inventory is not read again, and its modules are not loaded."""

    name: str
    host: str
    port: int
    user: str
    key: str | None
    password_env: str | None
    source: Path | None
    connect_timeout: int | None
    password: str | None
    passphrase: str | None
    pin_name: str
    # what the ssh configuration added (inventory.Target has the same fields); the route's
    # hops as JSON (connection.connect takes either)
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    agent: bool | str = True
    proxy_command: str | None = None
    alias: str | None = None
    route: tuple[dict[str, Any], ...] = ()
    algorithms: tuple[tuple[str, str, tuple[str, ...]], ...] = ()


def main() -> int:
    from ..errors import SSHError
    from .connection import connect
    from .keep import socket_for
    from .rundir import bind

    if os.fork() > 0:  # detach before any thread exists: the command waits only for this exit
        os._exit(0)
    spec = json.loads(sys.stdin.readline())
    source = spec["target"].pop("source")
    t = spec["target"]
    target = Login(**{**t, "source": Path(source) if source else None,
                      "identity_files": tuple(t.get("identity_files") or ()),
                      "route": tuple(t.get("route") or ()),
                      "algorithms": tuple((c, m, tuple(p)) for c, m, p in t.get("algorithms") or ())})
    try:
        conn = connect(cast("Target", target), notify=lambda m: _say("notify " + m),
                       timeout=spec["timeout"], keep=False)
    except SSHError as exc:
        message = str(exc).removeprefix(f"{exc.host}: {exc.kind}: ")
        _say("error " + json.dumps({"host": exc.host, "kind": exc.kind, "message": message}))
        return 1
    transport = conn.client.get_transport()
    assert transport is not None
    server_key = transport.get_remote_server_key()
    path = socket_for(spec["identity"], server_key.get_base64())
    listener = bind(path)
    ino = os.stat(path).st_ino
    info = {"host": target.name, "address": f"{target.user}@{target.host}:{target.port}",
            "pin": target.pin_name, "known_hosts": spec["known_hosts"], "path": path}
    keeper = Keeper(conn, transport, info, spec["keep"], spec["timeout"])
    signal.signal(signal.SIGTERM, lambda *_: setattr(keeper, "stopping", True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal that started us
    _say("ready " + path)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the command that started us may wait for its pipes to close
        os.dup2(devnull, fd)
    try:
        keeper.serve(listener)
    finally:
        try:
            if os.stat(path).st_ino == ino:  # not a newer keeper's socket at the same path
                os.unlink(path)
        except OSError:
            pass
        listener.close()
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
