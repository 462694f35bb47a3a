"""The wire between a command and a keeper (see ``keep.py``): one Unix-socket connection per SSH
channel, and on the command's side objects that answer like paramiko's ``Transport`` and
``Channel``, so Fabric's runner, ``SFTPClient`` and port forwards use a kept connection without
knowing it.

A connection starts with one JSON line from the command (what to open: ``exec``, ``shell``,
``subsystem``, ``direct-tcpip``, or ``status``/``stop``/``probe``) and one JSON line back
(``ok``, or the error and whether the SSH connection behind it is gone). An ``exec`` or
``shell`` carries an ``id``: a command whose answer is late asks ``probe`` with it whether it
went out to the host, and the keeper withdraws it if it had not (at most once). After that:

- ``subsystem`` (SFTP) and ``direct-tcpip`` (forwards) carry the channel's bytes as they are;
- ``exec`` and ``shell`` carry frames (one type byte, a 4-byte big-endian length, the bytes):
  ``o`` stdout, ``e`` stderr, ``x`` the exit status, from the keeper; ``i`` stdin, ``f`` end of
  stdin, ``w`` a window size (JSON ``[cols, rows]``), ``s`` a signal for the remote command (its
  name: ``INT``), from the command. Closing the Unix socket
  closes the one channel it carries and nothing else.
"""

from __future__ import annotations

import functools
import json
import re
import select
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import paramiko

from .rundir import connect_ours

HEADER = struct.Struct(">cI")
# Output a channel holds for a reader that does not read: past it the relay stops reading the
# keeper's socket, the keeper blocks on it and stops reading the SSH channel, whose window then
# stops the host's writer, as paramiko's own window (2 MiB) does over a fresh connection.
BUFFERED = 4 << 20
STDOUT, STDERR, STATUS, STDIN, EOF, WINDOW = b"o", b"e", b"x", b"i", b"f", b"w"
SIGNAL = b"s"
# A framed channel's keeper says it is there every HEARTBEAT seconds (an empty BEAT frame),
# when its answer offers it; a client that then hears nothing for MISSED beats takes the keeper
# for gone (frozen, wedged) and the channel for lost, as a dead link is taken on a fresh
# connection. An older keeper offers none and is waited for as before.
BEAT = b"h"
# In the keeper's socket name (keep.socket_for): a keeper speaking another version of this is
# never asked (one from before an upgrade cannot say whether a command went out)
PROTOCOL = 2
# how many timeouts a command whose exec went out waits for its answer while the keeper's link
# answers, before it fails saying it may have started
LATE_ROUNDS = 6
HEARTBEAT = 5.0
MISSED = 4


def honours_signals(banner: str, user: str | None) -> bool | None:
    """Does this server send a "signal" request on to the command? From its version banner
    (``SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u10``) and the login; None: not known (try it).

    OpenSSH acts on them since 7.9 (openssh-portable cd98925c, session.c
    ``session_signal_req``), only for a session that runs in a post-auth privilege-separated
    child: before 9.8 a root login had none (sshd.c ``privsep_postauth``: "root login",
    ``use_privsep = 0``) and the request is refused ("session signalling requires privilege
    separation"); 9.8 separates every login (sshd-session.c). Forced commands are refused in
    every version, which no client can see beforehand."""
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", banner)
    if m is None:
        return None
    version = (int(m.group(1)), int(m.group(2)))
    if version < (7, 9):
        return False
    return not (user == "root" and version < (9, 8))


def send_signal(chan: Any, name: str) -> bool:
    """The SSH "signal" channel request (RFC 4254 6.9: the name without "SIG", no reply asked)
    for a command's channel, direct or kept (then the keeper sends it). False, and nothing sent,
    where the server is known to ignore it (``honours_signals``). paramiko has no call for it,
    and a failed request that asked for a reply closes paramiko's channel."""
    transport = chan.get_transport()
    if honours_signals(getattr(transport, "remote_version", "") or "",
                       transport.get_username()) is False:
        return False
    if isinstance(chan, RelayChannel):
        chan._frame(SIGNAL, name.encode())  # noqa: SLF001 - the channel's own frame writer
        return True
    m = paramiko.Message()
    m.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
    m.add_int(chan.remote_chanid)
    m.add_string("signal")
    m.add_boolean(False)
    m.add_string(name)
    chan.transport._send_user_message(m)  # noqa: SLF001 - what paramiko's own requests call
    return True


class Gone(paramiko.SSHException):
    """The keeper, or the SSH connection it held, is not there any more. ``sent``: the request
    had gone out before (the keeper may have acted on it)."""

    def __init__(self, message: str, sent: bool = False):
        super().__init__(message)
        self.sent = sent


def send_frame(sock: socket.socket, kind: bytes, data: bytes, lock: threading.Lock) -> None:
    with lock:
        sock.sendall(HEADER.pack(kind, len(data)) + data)


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def recv_frame(sock: socket.socket) -> tuple[bytes, bytes] | None:
    head = recv_exact(sock, HEADER.size)
    if head is None:
        return None
    kind, size = HEADER.unpack(head)
    data = recv_exact(sock, size) if size else b""
    return None if data is None else (kind, data)


def read_line(sock: socket.socket, limit: int = 1 << 20) -> bytes:
    """One line, read a byte at a time so that nothing after it is consumed."""
    return _read_line(sock, bytearray(), limit)


class Sock(socket.socket):
    """A Unix socket that carries one channel as it is (SFTP, a forward), with the Channel
    members its callers ask of a channel besides recv/send/close: paramiko's SFTP code
    (sftp_client.py: get_name in its log lines; sftp_file.py: recv_ready in a pipelined write)
    and a forward's pump (closed, shutdown_write: the keeper passes a half-close on to the
    host's channel, as it passes the host's end back)."""

    heartbeat = 0.0  # seconds between the keeper's BEAT frames on this channel; 0: none

    def get_name(self) -> str:
        return "kept"

    def recv_ready(self) -> bool:
        return bool(select.select([self], [], [], 0)[0])

    @property
    def closed(self) -> bool:
        """As ``Channel.closed``: this end was closed (a closed socket has no descriptor)."""
        return self.fileno() == -1

    def shutdown_write(self) -> None:
        self.shutdown(socket.SHUT_WR)


def ask(path: str, header: dict[str, Any], timeout: float,
        track: Callable[[socket.socket], None] | None = None,
        late: Callable[[], bool] | None = None) -> tuple[socket.socket, dict[str, Any]]:
    """Open a connection to the keeper at ``path``, send ``header``, read its answer (at most
    ``timeout`` seconds: a keeper whose link died silently must not hold the command).

    ``track``: given the socket before it connects (so that a close() elsewhere, a Ctrl-C,
    ends the wait). ``late``: asked each time ``timeout`` passes with no answer: True waits on
    for it on the same socket (the command is known to be on its way); else Gone."""
    sock = Sock(socket.AF_UNIX, socket.SOCK_STREAM)
    if track is not None:
        track(sock)
    sent = False
    buf = bytearray()
    try:
        sock.settimeout(timeout)
        connect_ours(sock, path)  # another user's socket where ours should be: not a byte
        sent = True  # from here on the keeper may act on it, even if its answer never comes
        sock.sendall(json.dumps(header).encode() + b"\n")
        while True:
            try:
                answer = json.loads(_read_line(sock, buf))
                break
            except TimeoutError:
                if late is None or not late():
                    raise
        sock.settimeout(None)
    except (OSError, ValueError, Gone) as exc:
        sock.close()
        raise Gone(f"keeper {path}: {type(exc).__name__}: {exc}", sent=sent) from None
    except BaseException:
        sock.close()
        raise
    return sock, answer


def _read_line(sock: socket.socket, buf: bytearray, limit: int = 1 << 20) -> bytes:
    """read_line, into ``buf``, which keeps what came before a timeout."""
    while not buf.endswith(b"\n"):
        b = sock.recv(1)
        if not b or len(buf) > limit:
            raise Gone("the keeper closed the connection")
        buf += b
    return bytes(buf)


_REPEATABLE = threading.local()


@contextmanager
def repeatable() -> Iterator[None]:
    """Commands started in this thread inside only read (facts, listings): where the keeper's
    link died with one in flight, it runs again on a fresh connection rather than failing."""
    before = getattr(_REPEATABLE, "on", False)
    _REPEATABLE.on = True
    try:
        yield
    finally:
        _REPEATABLE.on = before


def _repeatable() -> bool:
    return bool(getattr(_REPEATABLE, "on", False))


class RelayTransport:
    """What Fabric and paramiko ask of a ``Transport``, served by a keeper.

    ``renew``: called once when the keeper answers that its SSH connection is gone (the host
    rebooted, the link dropped) before a channel started: it returns the socket of a keeper with
    a fresh connection, so the command goes on without an error (nothing had run yet)."""

    def __init__(self, path: str, timeout: float, renew: Callable[[], str]):
        self.path, self.timeout, self.renew = path, timeout, renew
        self.active = True
        self.remote_version = ""  # the server's banner, once the keeper has said it
        self.username: str | None = None
        self._open: set[socket.socket] = set()
        # reentrant: Ctrl-C's handler (executor._interruptible) calls close() in the main thread,
        # which may be inside _track or forget at that moment
        self._lock = threading.RLock()

    def is_active(self) -> bool:
        return self.active

    def get_username(self) -> str | None:
        return self.username

    def is_authenticated(self) -> bool:
        return self.active

    def set_keepalive(self, interval: int) -> None:
        pass  # the keeper keeps its own connection alive

    def open(self, header: dict[str, Any]) -> socket.socket:
        runs = header.get("op") in ("exec", "shell")
        again = runs and _repeatable()
        for attempt in (1, 2):
            if not self.active:  # closed meanwhile (a Ctrl-C): nothing more is sent
                raise paramiko.SSHException("the connection is closed")
            path = self.path  # the keeper this attempt asks, and the one asked about it
            fate: list[str] = []
            if runs:  # the keeper says by it whether this exec went out (at most once)
                header = {**header, "id": uuid.uuid4().hex}
            try:
                sock, answer = ask(path, header, self.timeout, track=self._track,
                                   late=functools.partial(self._waits_on, path, header, fate)
                                   if runs else None)
            except Gone as exc:
                if not self.active:
                    self._closed_while_asking(path, header)
                if not (exc.sent and runs):
                    answer, sock = {"ok": False, "lost": True, "issued": False,
                                    "error": "no keeper"}, None
                else:
                    known = fate[-1] if fate else self._fate(path, str(header["id"]))
                    if not self.active:  # Ctrl-C while it was asked about
                        self._closed_while_asking(path, header)
                    if known == "withdrawn, link alive":  # it never went out, and never will
                        if attempt == 1:
                            continue  # ask again, once
                        raise paramiko.SSHException(
                            f"the kept connection did not answer within {self.timeout:g}s, "
                            "twice; nothing was run (--no-keep connects afresh)") from None
                    if known == "withdrawn, link dead" or (again and known != "issued, link alive"):
                        # nothing ran, or it only reads: a fresh connection runs it
                        answer, sock = {"ok": False, "lost": True, "issued": False,
                                        "error": "the kept link was lost"}, None
                    else:
                        # at most once: the host may have started it and only the answer was
                        # late or lost; sending it again could run it twice. The keeper is left
                        # to the others sharing it; this command fails, saying so
                        raise paramiko.SSHException(
                            "the kept connection lost the command's answer after it was sent; "
                            "it may have started on the host, so it is not sent again (see "
                            "what runs there before running it again)") from None
            if answer.get("ok") and sock is not None:
                sock.heartbeat = float(answer.get("heartbeat") or 0)  # type: ignore[attr-defined]
                self.remote_version = str(answer.get("server") or "")  # as paramiko names it
                self.username = answer.get("user")
                return sock
            if sock is not None:
                self.forget(sock)
                sock.close()
            if isinstance(answer.get("code"), int):  # the host refused this channel alone
                raise paramiko.ChannelException(answer["code"], str(answer.get("error") or ""))
            if runs and answer.get("lost") and not again and answer.get("issued") is not False:
                # issued (or a keeper too old to say): the exec may have reached the host
                raise paramiko.SSHException(
                    f"the kept connection was lost after the command was sent "
                    f"({answer.get('error') or 'no answer'}); it may have started on the host, "
                    "so it is not sent again (see what runs there before running it again)")
            if not answer.get("lost") or attempt == 2:
                raise paramiko.SSHException(str(answer.get("error") or "refused by the host"))
            self.path = self.renew()
        raise AssertionError("unreachable")

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            if not self.active:
                raise paramiko.SSHException("the connection is closed")
            self._open = {s for s in self._open if s.fileno() != -1}  # the failed attempts'
            self._open.add(sock)

    def _waits_on(self, path: str, header: dict[str, Any], fate: list[str]) -> bool:
        """The answer is late: whether to go on waiting for it. Yes while the keeper says the
        exec went out and its link answers (a host slow to start the command; its answer is on
        its way), up to LATE_ROUNDS timeouts; the fate found is kept in ``fate``."""
        if not self.active or len(fate) >= LATE_ROUNDS:
            return False
        fate.append(self._fate(path, str(header["id"])))
        return fate[-1] == "issued, link alive" and len(fate) < LATE_ROUNDS

    def _closed_while_asking(self, path: str, header: dict[str, Any]) -> NoReturn:
        self._withdraw(path, header)
        raise paramiko.SSHException("the connection is closed")

    def _withdraw(self, path: str, header: dict[str, Any]) -> None:
        """The command was closed while it waited (Ctrl-C): withdraw its request, if it had not
        gone out yet (the keeper also takes a client that hung up for one that withdrew)."""
        if header.get("id"):
            try:
                sock, _ = ask(path, {"op": "probe", "wait": 0, "id": header["id"]}, 2.0)
                sock.close()
            except Gone:
                pass

    def _fate(self, path: str, request: str) -> str:
        """What became of a request whose answer did not come: whether its exec went out
        ("issued": the host may run it; "withdrawn": it never will) and whether the keeper's
        link answers the host's keepalive now ("alive", "dead"); "unknown" when the keeper does
        not answer either (or is too old to say)."""
        try:
            sock, answer = ask(path, {"op": "probe", "wait": self.timeout, "id": request},
                               self.timeout + 5, track=self._track)
        except (Gone, paramiko.SSHException):  # (SSHException: closed meanwhile, a Ctrl-C)
            return "unknown"
        sock.close()
        if "issued" not in answer:
            return "unknown"
        return (f"{'issued' if answer['issued'] else 'withdrawn'}, "
                f"link {'dead' if answer.get('answered') is False else 'alive'}")

    def forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)

    def open_session(self, window_size: int | None = None, max_packet_size: int | None = None,
                     timeout: float | None = None) -> RelayChannel:
        return RelayChannel(self)

    def open_channel(self, kind: str, dest_addr: tuple[str, int] | None = None,
                     src_addr: tuple[str, int] | None = None, window_size: int | None = None,
                     max_packet_size: int | None = None,
                     timeout: float | None = None) -> RelayChannel | socket.socket:
        if kind == "session":
            return RelayChannel(self)
        if kind != "direct-tcpip" or dest_addr is None:
            raise paramiko.SSHException(f"a kept connection does not open {kind!r} channels")
        return self.open({"op": "direct-tcpip", "dest": list(dest_addr),
                          "src": list(src_addr or ("127.0.0.1", 0))})

    def open_sftp_client(self) -> paramiko.SFTPClient:
        # SFTPClient reads and writes any socket-like object (paramiko's sftp_client.py)
        return paramiko.SFTPClient(self.open({"op": "subsystem", "name": "sftp"}))  # type: ignore[arg-type]

    def close(self) -> None:
        """Closes this command's channels; the keeper and its other clients go on."""
        self.active = False
        with self._lock:
            socks, self._open = list(self._open), set()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


class RelayChannel:
    """A session channel (exec, shell, subsystem) carried by a keeper: the part of paramiko's
    ``Channel`` that Fabric's runner and ``SFTPClient`` use."""

    def __init__(self, transport: RelayTransport):
        self.transport = transport
        self.sock: socket.socket | None = None
        self.raw = False  # subsystem: bytes pass as they are
        self.pty: list[Any] | None = None
        self.env: dict[str, str] = {}
        self.out, self.err = bytearray(), bytearray()
        self.status: int | None = None
        self.closed = self.eof_received = False
        self.timeout: float | None = None
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()

    # what comes before the start
    def get_pty(self, term: str = "vt100", width: int = 80, height: int = 24,
                width_pixels: int = 0, height_pixels: int = 0) -> None:
        self.pty = [term, width, height]

    def update_environment(self, environment: dict[str, str]) -> None:
        self.env.update(environment)

    def set_environment_variable(self, name: str, value: str) -> None:
        self.env[name] = value

    def exec_command(self, command: str) -> None:
        self._start({"op": "exec", "command": command, "pty": self.pty, "env": self.env})

    def invoke_shell(self) -> None:
        self._start({"op": "shell", "pty": self.pty or ["vt100", 80, 24], "env": self.env})

    def invoke_subsystem(self, subsystem: str) -> None:
        self.sock = self.transport.open({"op": "subsystem", "name": subsystem})
        self.raw = True

    def _start(self, header: dict[str, Any]) -> None:
        self.sock = self.transport.open(header)
        threading.Thread(target=self._pump, daemon=True, name="relay-channel").start()

    def _pump(self) -> None:
        assert self.sock is not None
        beat = float(getattr(self.sock, "heartbeat", 0) or 0)
        try:
            while True:
                if beat and not select.select([self.sock], [], [], beat * MISSED)[0]:
                    # the keeper said nothing for MISSED beats: it is gone, and so is this
                    # channel; a writer blocked on it (stdin) is let go too
                    self.sock.shutdown(socket.SHUT_RDWR)
                    break
                frame = recv_frame(self.sock)
                if frame is None:
                    break
                kind, data = frame
                if kind == BEAT:
                    continue
                with self._cond:
                    while len(self.out) + len(self.err) > BUFFERED and not self.closed:
                        self._cond.wait()  # flow control: until the reader takes some
                    if kind == STDOUT:
                        self.out += data
                    elif kind == STDERR:
                        self.err += data
                    elif kind == STATUS:
                        self.status = int(data)
                    self._cond.notify_all()
        except (OSError, ValueError):  # (ValueError: select on a socket close() closed)
            pass
        finally:  # whatever ended it, the readers and the exit status wait no more
            with self._cond:
                self.closed = self.eof_received = True
                self._cond.notify_all()
            self.transport.forget(self.sock)

    # reading
    def _take(self, buf: bytearray, n: int) -> bytes:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        with self._cond:
            while not buf and not self.closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError()
                self._cond.wait(left)
            data = bytes(buf[:n])
            del buf[:n]
            self._cond.notify_all()  # room again for a pump held back by BUFFERED
            return data

    def recv(self, nbytes: int) -> bytes:
        if self.raw:
            assert self.sock is not None
            return self.sock.recv(nbytes)
        return self._take(self.out, nbytes)

    def recv_stderr(self, nbytes: int) -> bytes:
        return self._take(self.err, nbytes)

    def recv_ready(self) -> bool:
        return bool(self.out)

    def recv_stderr_ready(self) -> bool:
        return bool(self.err)

    def exit_status_ready(self) -> bool:
        return self.status is not None or self.closed

    def recv_exit_status(self) -> int:
        """The exit status; -1 when the channel closed without one (the link was lost)."""
        with self._cond:
            while self.status is None and not self.closed:
                self._cond.wait()
            return -1 if self.status is None else self.status

    # writing
    def _frame(self, kind: bytes, data: bytes) -> None:
        if self.sock is None:
            raise paramiko.SSHException("the channel has not started")
        send_frame(self.sock, kind, data, self._send_lock)

    def send(self, data: bytes | str) -> int:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if self.raw:
            assert self.sock is not None
            return self.sock.send(raw)
        self._frame(STDIN, raw)
        return len(raw)

    def sendall(self, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if self.raw:
            assert self.sock is not None
            self.sock.sendall(raw)
        else:
            self._frame(STDIN, raw)

    def shutdown_write(self) -> None:
        if self.sock is not None and not self.raw:
            self._frame(EOF, b"")

    def resize_pty(self, width: int = 80, height: int = 24, width_pixels: int = 0,
                   height_pixels: int = 0) -> None:
        self._frame(WINDOW, json.dumps([width, height]).encode())

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout
        if self.raw and self.sock is not None:
            self.sock.settimeout(timeout)

    def gettimeout(self) -> float | None:
        return self.timeout

    def fileno(self) -> int:
        assert self.sock is not None
        return self.sock.fileno()

    def get_transport(self) -> RelayTransport:
        return self.transport

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
            self.transport.forget(self.sock)
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    @property
    def active(self) -> bool:
        return not self.closed
