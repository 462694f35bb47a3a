"""SSH connections: bounded, explicit, with our own host-key policy and named failures.

Host keys live in our own known_hosts file (``<state dir>/known_hosts``), never in
``~/.ssh/known_hosts``. First contact pins the key (trust on first use, announced); later a
different key stops the run with an explanation and the one command that re-pins. Keys are pinned
under the inventory entry's name, or under ``[host]:port`` for ad-hoc hosts, so a reused rental
IP met through a new inventory file is a new pin, and a reused IP:port is caught.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko
from fabric import Connection
from paramiko.hostkeys import HostKeys

from ..config.shipped import state_dir
from ..errors import ProvisionError, SSHError

if TYPE_CHECKING:  # the inventory module is not loaded by a keeper (keeper.py), which starts fast
    from ..config.inventory import Target

AUTH_REFUSED, HOST_KEY_CHANGED, REFUSED = "auth refused", "host key changed", "connection refused"
TIMEOUT, NOT_RESOLVED, SSH_FAILED = "timeout", "name not resolved", "ssh failed"
NO_KEY = "no usable key"
UNREACHABLE = "unreachable"
DEFAULT_KEYS = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa", "~/.ssh/id_dsa")


# paramiko logs a failed handshake from its transport thread ("Exception (client): Error
# reading SSH protocol banner"); with no handler Python prints it to stderr, around our own line
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def default_timeout() -> int:
    """Seconds to wait for the SSH handshake: ``-t``, else ``$GPU_PROVISION_CONNECT_TIMEOUT``,
    else 15."""
    raw = (os.environ.get("GPU_PROVISION_CONNECT_TIMEOUT") or "15").strip()
    if not raw.isdigit() or int(raw) == 0:
        raise ProvisionError(f"$GPU_PROVISION_CONNECT_TIMEOUT={raw!r}: give whole seconds "
                             "above 0, e.g. 30")
    return int(raw)


def known_hosts_path() -> Path:
    return state_dir() / "known_hosts"


class HostKeyChanged(paramiko.SSHException):
    def __init__(self, name: str, old: paramiko.PKey, new: paramiko.PKey):
        self.name, self.old, self.new = name, old, new
        super().__init__(name)


class PinningPolicy(paramiko.MissingHostKeyPolicy):
    """Checks the server's key against our file under ``pin_name``; pins on first use.

    The client is given no host keys of its own, so paramiko always asks this policy.
    """

    def __init__(self, pin_name: str, path: Path, notify: Callable[[str], None] | None = None,
                 replace: bool = False):
        self.pin_name, self.path, self.notify, self.replace = pin_name, path, notify, replace

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        with _pins_locked(self.path):  # many hosts pin at once (threads, or several programs)
            self._check_or_pin(key)

    def _check_or_pin(self, key: paramiko.PKey) -> None:
        keys = HostKeys()
        if self.path.exists():
            keys.load(str(self.path))
        pinned = keys.lookup(self.pin_name)
        old = pinned.get(key.get_name()) if pinned else None
        if old is None and pinned and not self.replace:
            old = next(iter(pinned.values()))  # pinned with another key type: still a change
        if old is not None and old == key and not self.replace:
            return
        if old is not None and not self.replace:
            raise HostKeyChanged(self.pin_name, old, key)
        if self.replace and pinned:
            del keys[self.pin_name]
        keys.add(self.pin_name, key.get_name(), key)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".known_hosts.")
        os.close(fd)
        keys.save(tmp)
        os.replace(tmp, self.path)  # atomic: a crash never leaves a half-written file
        if self.notify:
            verb = "re-pinned" if self.replace else "pinned on first use"
            self.notify(f"host key for {self.pin_name} {verb}: {key.get_name()} "
                        f"SHA256:{key.fingerprint.split(':', 1)[-1]} in {self.path}")


_THREAD_LOCK = threading.Lock()


@contextmanager
def _pins_locked(path: Path) -> Iterator[None]:
    """Serialise read-modify-write of the pin file across threads and processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _THREAD_LOCK, open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


def host_arg(target: Target) -> str:
    """What to pass to ``-H`` to reach ``target`` again."""
    return target.name if target.source else f"{target.user}@{target.host}:{target.port}"


def repin_command(target: Target) -> str:
    return f"gpu-provision -H {host_arg(target)} repin"


def _agent_has_keys() -> bool:
    if not os.environ.get("SSH_AUTH_SOCK"):
        return False
    try:
        return bool(paramiko.Agent().get_keys())
    except (paramiko.SSHException, OSError):
        return False


def check_credentials(target: Target, password: str | None = None) -> None:
    """Before any connection (and so before a host key is pinned for a login that cannot work):
    a key file named must exist, and there must be something to log in with."""
    if target.key and not Path(os.path.expanduser(target.key)).is_file():
        where = f"`key:` in {target.source}" if target.source else "-i"
        raise SSHError(target.name, NO_KEY, f"the key file {target.key} ({where}) does not "
                       "exist: pass -i KEY with your private key")
    if password or target.password or target.password_env or target.key:
        return
    if any(Path(os.path.expanduser(k)).is_file() for k in DEFAULT_KEYS) or _agent_has_keys():
        return
    raise SSHError(target.name, NO_KEY, "no -i KEY, no `key:` in the inventory, no ssh-agent key "
                   f"and none of {', '.join(DEFAULT_KEYS)}: pass -i KEY, or make one "
                   "(ssh-keygen -t ed25519) and install it with the host's password once: "
                   f"gpu-provision -H {host_arg(target)} authorize")


def connect(target: Target, notify: Callable[[str], None] | None = None,
            replace_key: bool = False, timeout: int | None = None,
            password: str | None = None, key_only: bool = False, keep: bool = True) -> Connection:
    """Open a connection to ``target``; failures become SSHError with a named kind.

    ``keep``: through the host's keeper (``keep.py``), started now if there is none; a login
    by password alone, a key-only check and a re-pin always connect afresh.

    ``password``: log in with it alone (no keys, no agent). ``key_only``: only ``target.key``.
    Otherwise keys are tried first, then ``target.password`` (``--prompt-for-login-password``)
    or the inventory's ``password_env``. ``timeout``: else ``target.connect_timeout`` (``-t``),
    else ``default_timeout()``.
    """
    timeout = timeout or target.connect_timeout or default_timeout()
    check_credentials(target, password)
    if keep and not replace_key and password is None and not key_only:
        from .keep import kept
        conn = kept(target, timeout, notify, known_hosts_path())
        if conn is not None:
            return conn
    others = password is None and not key_only  # the agent and ~/.ssh/id_* may be tried
    kwargs: dict[str, object] = {"allow_agent": others, "look_for_keys": others,
                                 "banner_timeout": timeout, "auth_timeout": timeout}
    if target.key and password is None:
        kwargs["key_filename"] = [os.path.expanduser(target.key)]
    if target.passphrase:
        kwargs["passphrase"] = target.passphrase
    if password is not None:
        kwargs["password"] = password
    elif target.password is not None and not key_only:
        kwargs["password"] = target.password
    elif target.password_env and not key_only:
        password = os.environ.get(target.password_env)
        if password is None:
            raise SSHError(target.name, AUTH_REFUSED,
                           f"the inventory says the password is in ${target.password_env}, "
                           "which is not set")
        kwargs["password"] = password
    conn = Connection(target.host, user=target.user, port=target.port, connect_timeout=timeout,
                      connect_kwargs=kwargs)
    conn.client.set_missing_host_key_policy(
        PinningPolicy(target.pin_name, known_hosts_path(), notify, replace_key))
    started = time.monotonic()
    try:
        conn.open()
    except BaseException as exc:
        conn.close()
        waited = time.monotonic() - started
        raise classify(target, exc, waited >= timeout * 0.9, timeout=timeout,
                       tried=_tried(kwargs), waited=waited) from None
    return conn


def _tried(kwargs: dict[str, object]) -> str:
    """What this login offered the server, for the auth-refused message."""
    what = []
    if kwargs.get("key_filename"):
        what.append(f"key {', '.join(map(str, kwargs['key_filename']))}")  # type: ignore[call-overload]
    if kwargs.get("allow_agent") or kwargs.get("look_for_keys"):
        what.append("the agent's and ~/.ssh/id_* keys")
    if kwargs.get("password") is not None:
        what.append("the password")
    return " and ".join(what) or "nothing"


def classify(target: Target, exc: BaseException, timed_out: bool = False,
             timeout: int | None = None, tried: str = "our key/password",
             waited: float | None = None) -> BaseException:
    """Turn a paramiko/socket exception into a one-line SSHError.

    ``timed_out``: the attempt used up the connect timeout (a server that accepts TCP but never
    completes the SSH handshake surfaces in paramiko as a lost session, not as a timeout).
    """
    name = target.name
    if isinstance(exc, HostKeyChanged):
        return SSHError(name, HOST_KEY_CHANGED,
                        f"the server now presents {fingerprint(exc.new)}, but {exc.name} was "
                        f"pinned to {fingerprint(exc.old)} in {known_hosts_path()}. Rented IPs "
                        "and ports are reused: this may be a new machine (or someone in the "
                        "middle). If you expect a new machine, re-pin with: "
                        f"{repin_command(target)}")
    if isinstance(exc, paramiko.AuthenticationException) or (
            isinstance(exc, paramiko.SSHException) and "No authentication methods" in str(exc)):
        return SSHError(name, AUTH_REFUSED, f"{target.user}@{target.host} refused {tried}: pass "
                        "the right key with -i KEY (or fix `key:`/`password_env:` in the "
                        "inventory), or install your key with the password once: "
                        f"gpu-provision -H {host_arg(target)} authorize")
    if isinstance(exc, socket.gaierror):
        from ..config.validators import NAME_RE
        if target.source is None and "." not in target.host and NAME_RE.match(target.host):
            from ..config.inventory import where_looked
            return SSHError(name, NOT_RESOLVED, f"{where_looked(target.host)}, and no host "
                            f"{target.host!r} resolves")
        return SSHError(name, NOT_RESOLVED, f"cannot resolve {target.host!r}")
    if isinstance(exc, (socket.timeout, TimeoutError)) or (
            isinstance(exc, paramiko.SSHException) and ("banner" in str(exc) or timed_out)):
        limit = timeout or default_timeout()
        # the wait as it was: a server that trickles lines before its banner, or an address
        # the network drops, can take longer (or shorter) than the timeout itself
        said = f"within {limit}s" if waited is None or round(waited) == limit else \
            f"after {waited:.0f}s (-t is {limit}s)"
        return SSHError(name, TIMEOUT, f"no answer from {target.host}:{target.port} {said} (host "
                        "down, wrong port, or a firewall; -t SECONDS waits longer)")
    # paramiko gathers each address's refusal or EHOSTUNREACH (an address the network cannot
    # reach) as one NoValidConnectionsError; ENETUNREACH comes as itself: only a refusal is one
    errnos = {getattr(e, "errno", None) for e in exc.errors.values()} \
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) else \
        {getattr(exc, "errno", None)} if isinstance(exc, OSError) else set()
    if errnos & {errno.ETIMEDOUT}:
        return classify(target, TimeoutError(), True, timeout, tried, waited)
    if errnos & {errno.EHOSTUNREACH, errno.ENETUNREACH}:
        after = f" after {waited:.0f}s" if waited is not None else ""
        return SSHError(name, UNREACHABLE, f"no route to {target.host}:{target.port}{after} "
                        "(the address is not reachable from this machine: a private or "
                        "mistyped address, or the network is down)")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) or \
            isinstance(exc, ConnectionRefusedError):
        return SSHError(name, REFUSED, f"{target.host}:{target.port} refused the connection "
                        "(sshd not running, or wrong port)")
    if isinstance(exc, (paramiko.SSHException, OSError, EOFError)):
        return SSHError(name, SSH_FAILED, f"{type(exc).__name__}: {exc}")
    return exc


def forget_pin(target: Target) -> bool:
    """Drop ``target``'s pinned key; True when there was one."""
    path = known_hosts_path()
    if not path.exists():
        return False
    with _pins_locked(path):
        keys = HostKeys(str(path))
        if keys.lookup(target.pin_name) is None:
            return False
        del keys[target.pin_name]
        keys.save(str(path))
    return True
