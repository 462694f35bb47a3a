"""Kept connections: the first command to a host starts a keeper (``keeper.py``) that holds the
authenticated SSH connection; later commands of the same local user reach it on a Unix socket
and pay one round trip per channel instead of a whole handshake.

Safety, in the order it is checked:
- the socket lives in a folder of ours, mode 0700 and owned by us, checked without a race (no
  link followed, each folder above it root's or ours and sticky where others may write: see
  ``rundir.run_dir``; else no keeping, said once), and is itself 0600: another local user can
  neither list nor use it;
- every client asks the kernel who listens before it sends a byte, and the keeper who calls
  before it reads one (``rundir.peer_is_us``): a socket another user put where ours would be
  gets nothing, not our environment, not a command;
- its name is a hash of everything that decides what a connection is: our uid, user, address,
  port, key file, password variable, the pin name, our known_hosts file, and the host key the
  keeper verified. Another inventory, user, key or port, or a re-pinned key, never finds it;
- ``repin``, ``forget-host-key`` stop the keepers of that pin (``stop_for``); a keeper whose
  connection died (reboot, dropped link) ends itself, and a command that meets it first gets a
  fresh keeper within the same command (``RelayTransport.renew``);
- the keeper ends once idle for ``keep`` seconds (--keep/--no-keep, $GPU_PROVISION_KEEP, the
  inventory's ``keep:``, else 600).
Without Unix sockets (Windows), or when any of this cannot be had, commands connect fresh.

The socket path is short (``<run dir>/<20 hex>``): macOS allows 104 bytes in ``sun_path``
(ansible#11536 hit this with long ControlPath names); a run dir that would make it longer is not
used.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paramiko
from fabric import Connection
from paramiko.hostkeys import HostKeys

from ..errors import ProvisionError, SSHError
from . import rundir
from .relay import PROTOCOL, Gone, RelayTransport, ask
from .rundir import NAME_LEN, SAFE_PATH, run_dir

if TYPE_CHECKING:
    from ..config.inventory import Target

DEFAULT_KEEP = 600
MAX_KEEP = 86400


_SAID: list[str] = []  # the refused run dir, once said


def keep_seconds(target: Target) -> int:
    """--keep/--no-keep (which set $GPU_PROVISION_KEEP), else the inventory's ``keep:``, else
    600."""
    raw = os.environ.get("GPU_PROVISION_KEEP")
    if raw is not None and raw.strip():
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if not 0 <= value <= MAX_KEEP:
            raise ProvisionError(f"$GPU_PROVISION_KEEP={raw!r}: give whole seconds, 0 to "
                                 f"{MAX_KEEP} (0: connect afresh for every command)")
        return value
    return DEFAULT_KEEP if target.keep is None else target.keep


def identity(target: Target, known_hosts: Path) -> str:
    """The whole route counts: each jump host (address, login, keys, pin) and the
    ProxyCommand, so two ways to the same target are two keepers; so does a password or
    passphrase given at the prompt (by its digest): a command with another one logs in with it,
    and a wrong one is refused as it would be without keeping."""
    key = os.path.abspath(os.path.expanduser(target.key)) if target.key else None
    secrets = [hashlib.sha256(s.encode()).hexdigest() if s else None
               for s in (target.password, target.passphrase)]
    route = [h if isinstance(h, dict) else h.to_json() for h in target.route]
    parts = [os.getuid(), target.user, target.host, target.port, key, target.password_env,
             target.pin_name, str(known_hosts), list(target.identity_files),
             target.identities_only, target.agent, target.proxy_command, route,
             [list(a) for a in target.algorithms], secrets]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def socket_for(ident: str, server_key: str) -> str:
    d = run_dir()
    if d is None:
        raise OSError("no folder for keeper sockets")
    name = hashlib.sha256(f"{ident} {server_key} {PROTOCOL}".encode()).hexdigest()[:NAME_LEN]
    return str(d / name)


def pinned_key(target: Target, known_hosts: Path) -> str | None:
    if not known_hosts.exists():
        return None
    found = HostKeys(str(known_hosts)).lookup(target.pin_name)
    if not found:
        return None
    return next(iter(found.values())).get_base64()


class KeptConnection(Connection):  # type: ignore[misc]
    """A Fabric ``Connection`` whose transport is a keeper's (see ``relay.RelayTransport``)."""

    # real attributes (an attribute invoke's DataProxy does not know is kept in the config,
    # which is copied deeply when it merges: close() then closed a copy of the relay, not the
    # one the channels were opened on, and Ctrl-C left the command waiting)
    relay: RelayTransport = None  # type: ignore[assignment]  # set in __init__
    kept_sftp: paramiko.SFTPClient | None = None

    def __init__(self, target: Target, relay: RelayTransport):
        super().__init__(target.host, user=target.user, port=target.port)
        self.relay = relay
        self.transport = relay
        self.client._transport = relay  # SSHClient.get_transport() and open_sftp() use it

    def open(self) -> None:
        """After ``close`` (Ctrl-C closes a command's connection to return at once), a command
        that goes on (the cancel after a second Ctrl-C) opens channels through the keeper again,
        as Fabric opens a plain connection again; a keeper that is gone is renewed there."""
        self.relay.active = True

    @property
    def is_connected(self) -> bool:
        return self.relay.active

    def sftp(self) -> paramiko.SFTPClient:
        if self.kept_sftp is None:
            self.kept_sftp = self.relay.open_sftp_client()
        return self.kept_sftp

    def close(self) -> None:
        if self.kept_sftp is not None:
            try:
                self.kept_sftp.close()
            except (OSError, paramiko.SSHException):
                pass
            self.kept_sftp = None
        self.relay.close()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One command at a time starts the keeper of an identity (parallel runs, two terminals)."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _alive(path: str, timeout: float) -> bool:
    try:
        sock, answer = ask(path, {"op": "status"}, min(timeout, 5.0))
    except Gone:
        return False
    sock.close()
    if not answer.get("alive"):
        stop(path)
        return False
    return True


def stop(path: str) -> bool:
    try:
        sock, _ = ask(path, {"op": "stop"}, 5.0)
    except Gone:
        return False
    sock.close()
    return True


def _wait_gone(path: str, within: float) -> None:
    """Until the keeper at ``path`` no longer answers (it was told to stop: its socket goes with
    it), at most ``within`` seconds; a new keeper for the same identity binds the same path."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and os.path.exists(path):
        try:
            sock, _ = ask(path, {"op": "status"}, 1.0)
        except Gone:
            return
        sock.close()
        time.sleep(0.05)


_EARLY: dict[str, tuple[subprocess.Popen[bytes], Any]] = {}  # identity -> (keeper, its lock)


def _find(target: Target, ident: str, timeout: float, known_hosts: Path) -> str | None:
    pin = pinned_key(target, known_hosts)
    path = socket_for(ident, pin) if pin else None
    return path if path and os.path.exists(path) and _alive(path, timeout) else None


def _usable(target: Target) -> Path | None:
    if not hasattr(socket, "AF_UNIX") or keep_seconds(target) == 0:
        return None
    return run_dir()


def prepare(target: Target, known_hosts: Path, timeout: int) -> None:
    """Start the host's keeper now, when there is none, so that it loads and connects while the
    command loads the rest of itself; ``kept`` then waits for it. Never raises."""
    try:
        d = _usable(target)
        ident = identity(target, known_hosts)
        if d is None or ident in _EARLY or _find(target, ident, timeout, known_hosts):
            return
        lock = open(d / f"{ident[:NAME_LEN]}.lock", "a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another command is starting it
        except OSError:
            lock.close()
            return
        proc = _launch(target, ident, timeout, known_hosts)
        if proc is None:
            lock.close()
            return
        _EARLY[ident] = (proc, lock)
    except (OSError, ProvisionError):
        return


def kept(target: Target, timeout: int, notify: Callable[[str], None] | None,
         known_hosts: Path) -> Connection | None:
    """A connection through this host's keeper, started now if there is none; None when
    keeping is off or cannot be had here (the caller connects fresh, silently). A failure to
    connect is the SSHError a fresh connection would raise."""
    d = _usable(target)
    if d is None:
        if rundir.refused and notify and not _SAID:  # once: each host asks again
            _SAID.append(rundir.refused)
            notify(f"not keeping the connection: {rundir.refused}; connecting afresh")
        return None
    ident = identity(target, known_hosts)

    def start() -> str | None:
        early = _EARLY.pop(ident, None)
        if early is not None:
            proc, lock = early
            try:
                return _await(target, proc, timeout, notify)
            finally:
                lock.close()  # and with it the lock
        with _locked(d / f"{ident[:NAME_LEN]}.lock"):
            found = _find(target, ident, timeout, known_hosts)
            if found:
                return found
            launched = _launch(target, ident, timeout, known_hosts)
            return None if launched is None else _await(target, launched, timeout, notify)

    path = (None if ident in _EARLY else _find(target, ident, timeout, known_hosts)) or start()
    if path is None:
        return None

    def renew() -> str:
        old = relay.path
        # a keeper that still says its link is alive was only slow: the other commands on it
        # go on (``_alive`` stops one whose link is gone)
        if _alive(old, float(timeout)):
            return old
        _wait_gone(old, min(float(timeout), 5.0))  # else start() finds the dying keeper again
        new = start()
        if new is None:
            raise paramiko.SSHException("the connection was lost and no new one could be made")
        return new

    relay = RelayTransport(path, timeout, renew)
    return KeptConnection(target, relay)


def _launch(target: Target, ident: str, timeout: float,
            known_hosts: Path) -> subprocess.Popen[bytes] | None:
    d = run_dir()
    spec = {"target": {"name": target.name, "host": target.host, "port": target.port,
                       "user": target.user, "key": target.key, "password_env": target.password_env,
                       "source": str(target.source) if target.source else None,
                       "connect_timeout": target.connect_timeout, "password": target.password,
                       "passphrase": target.passphrase, "pin_name": target.pin_name,
                       "identity_files": list(target.identity_files),
                       "identities_only": target.identities_only, "agent": target.agent,
                       "proxy_command": target.proxy_command, "alias": target.alias,
                       "route": [h if isinstance(h, dict) else h.to_json() for h in target.route],
                       "algorithms": [list(a) for a in target.algorithms]},
            "identity": ident, "timeout": timeout, "keep": keep_seconds(target),
            "known_hosts": str(known_hosts)}
    try:
        # the run dir on the command line: `ps` says what it is, and a test harness finds its own
        proc = subprocess.Popen([sys.executable, *SAFE_PATH, "-m", "provision.remote.keeper",
                                 str(d)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, cwd="/", start_new_session=True,
                                env={**os.environ, "PYTHONPATH": _import_root()})
    except OSError:
        return None
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(spec).encode() + b"\n")  # the password, if any: never argv
        proc.stdin.close()
    except OSError:
        return None
    return proc


def _await(target: Target, proc: subprocess.Popen[bytes], timeout: float,
           notify: Callable[[str], None] | None) -> str | None:
    """The keeper's socket once it is connected; its SSHError when it could not connect; None
    when it ended without a word (the caller connects fresh)."""
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            kind, _, rest = raw.decode(errors="replace").rstrip("\n").partition(" ")
            if kind == "notify" and notify:
                notify(rest)
            elif kind == "ready":
                return rest
            elif kind == "error":
                e = json.loads(rest)
                raise SSHError(e["host"], e["kind"], e["message"])
        return None
    finally:
        proc.stdout.close()
        try:
            proc.wait(timeout=timeout + 30)  # it detaches (forks) before it connects
        except subprocess.TimeoutExpired:
            pass


def _import_root() -> str:
    """So the keeper imports this very copy of the program (a checkout or an install)."""
    root = str(Path(__file__).resolve().parents[2])
    rest = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{rest}" if rest else root


def keepers() -> list[dict[str, Any]]:
    """What each running keeper of this user says about itself; stale sockets are removed."""
    d = run_dir()
    if d is None:
        return []
    found = []
    for p in sorted(d.iterdir()):
        if len(p.name) != NAME_LEN or not p.is_socket():
            continue
        try:
            sock, answer = ask(str(p), {"op": "status"}, 5.0)
        except Gone:
            rundir.remove_stale(p)  # a keeper that was killed (a slow one stays)
            continue
        sock.close()
        found.append({**answer, "now": time.time()})
    return found


def stop_for(target: Target, known_hosts: Path) -> int:
    """Stop the keepers holding a connection pinned under ``target``'s pin name (repin,
    forget-host-key); returns how many."""
    n = 0
    for k in keepers():
        if k.get("pin") == target.pin_name and k.get("known_hosts") == str(known_hosts):
            n += stop(k["path"])
    return n
