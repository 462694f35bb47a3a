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
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paramiko
from fabric import Config as FabricConfig
from fabric import Connection
from paramiko.hostkeys import HostKeys

from ..config.openssh import Hop, describe
from ..config.shipped import state_dir
from ..errors import ProvisionError, SSHError
from .route import ProxySock, Routed, TunnelFailed, agent_at, disabled_algorithms, tunnel

if TYPE_CHECKING:  # the inventory module is not loaded by a keeper (keeper.py), which starts fast
    from ..config.inventory import Target

AUTH_REFUSED, HOST_KEY_CHANGED, REFUSED = "auth refused", "host key changed", "connection refused"
TIMEOUT, NOT_RESOLVED, SSH_FAILED = "timeout", "name not resolved", "ssh failed"
NO_KEY = "no usable key"
UNREACHABLE = "unreachable"
PROXY_FAILED = "proxy command failed"
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
    """What to pass to ``-H`` to reach ``target`` again (an ssh configuration's alias, where it
    decided the address or the way in)."""
    if target.source:
        return target.name
    return target.alias or f"{target.user}@{target.host}:{target.port}"


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
    if password or target.password or target.password_env or target.key or \
            target.identity_files or isinstance(target.agent, str):
        return
    if any(Path(os.path.expanduser(k)).is_file() for k in DEFAULT_KEYS) or _agent_has_keys():
        return
    raise SSHError(target.name, NO_KEY, "no -i KEY, no `key:` in the inventory, no ssh-agent key "
                   f"and none of {', '.join(DEFAULT_KEYS)}: pass -i KEY, or make one "
                   "(ssh-keygen -t ed25519) and install it with the host's password once: "
                   f"gpu-provision -H {host_arg(target)} authorize")


def connect(target: Target, notify: Callable[[str], None] | None = None,
            replace_key: bool = False, timeout: int | None = None,
            password: str | None = None, key_only: bool = False, keep: bool = True,
            repin_hop: str | None = None) -> Connection:
    """Open a connection to ``target``; failures become SSHError with a named kind.

    ``keep``: through the host's keeper (``keep.py``), started now if there is none; a login
    by password alone, a key-only check and a re-pin always connect afresh.

    The route: through each of ``target.route`` (the jump hosts its ssh configuration names,
    each login checked against its own pin), or over ``target.proxy_command``; a failure names
    the leg (``route.py``). ``repin_hop``: accept that jump host's new key (its name, or
    host:port) instead of the target's.

    ``password``: log in with it alone (no keys, no agent). ``key_only``: only ``target.key``.
    Otherwise keys are tried first (``target.key``, then the configuration's IdentityFiles),
    then ``target.password`` (``--prompt-for-login-password``) or the inventory's
    ``password_env``. ``timeout``: else ``target.connect_timeout`` (``-t``, else
    ConnectTimeout), else ``default_timeout()``.
    """
    timeout = timeout or target.connect_timeout or default_timeout()
    check_credentials(target, password)
    hops = [h if isinstance(h, Hop) else Hop.from_json(h) for h in target.route]
    if repin_hop is not None and not any(_is_hop(h, repin_hop) for h in hops):
        from ..errors import UsageError
        raise UsageError(f"--hop {repin_hop}: not a jump host on the way to {target.name} ("
                         f"{describe(hops, target.proxy_command)})")
    if keep and not replace_key and repin_hop is None and password is None and not key_only:
        from .keep import kept
        conn = kept(target, timeout, notify, known_hosts_path())
        if conn is not None:
            return conn
    opened: list[Connection] = []
    try:
        for i, hop in enumerate(hops):
            sock = _leg(target, opened, hop.host, hop.port, hop.proxy_command if i == 0 else None,
                        timeout, hop.label())
            opened.append(_login_hop(target, hop, sock, timeout, notify,
                                     repin_hop is not None and _is_hop(hop, repin_hop)))
        sock = _leg(target, opened, target.host, target.port, target.proxy_command, timeout,
                    target.alias or "the host")
        conn = _login(target, sock, timeout, notify, replace_key, password, key_only)
    except BaseException:
        for c in reversed(opened):
            c.close()
        raise
    if opened:
        conn.hops = opened
    return conn


def _bare() -> FabricConfig:
    """Fabric's settings without its own ssh_config and files: where and how we connect is
    decided here (and by config/openssh.py), never by a second lookup of the address."""
    return FabricConfig(lazy=True)


def _is_hop(hop: Hop, name: str) -> bool:
    return name in (hop.name, hop.pin_name, f"{hop.host}:{hop.port}", hop.host)


def _leg(target: Target, opened: list[Connection], host: str, port: int,
         proxy_command: str | None, timeout: int, what: str) -> Any:
    """The socket the next login runs over: a channel of the last jump host's login, the
    ProxyCommand's pipes, or None (paramiko connects to ``host:port`` itself)."""
    if opened:
        try:
            return tunnel(opened[-1], host, port, timeout)
        except TunnelFailed as exc:
            via = opened[-1].gp_hop
            kind = TIMEOUT if exc.timed_out or "timed out" in exc.reason.lower() else \
                REFUSED if "refused" in exc.reason.lower() else UNREACHABLE
            where = what if f"{host}:{port}" in what else f"{what} ({host}:{port})"
            raise SSHError(target.name, kind, f"the jump host {via.label()} could not reach "
                           f"{where}: {exc.reason}"
                           + (f" within {timeout}s" if exc.timed_out else "")
                           + " (the machine is down or the jump host cannot reach it: check "
                           "HostName and Port for it in your ssh configuration)") from None
    if proxy_command:
        try:
            return ProxySock(proxy_command)
        except OSError as exc:
            raise SSHError(target.name, PROXY_FAILED, f"ProxyCommand {proxy_command}: cannot "
                           f"start it: {exc.strerror}") from None
    return None


def _credentials(keys: list[str], others: bool, agent: bool | str, identities_only: bool,
                 look: bool, timeout: int) -> dict[str, object]:
    kwargs: dict[str, object] = {"allow_agent": others and bool(agent) and not identities_only,
                                 "look_for_keys": others and look,
                                 "banner_timeout": timeout, "auth_timeout": timeout}
    if keys:
        kwargs["key_filename"] = keys
    return kwargs


def _login_hop(target: Target, hop: Hop, sock: Any, timeout: int,
               notify: Callable[[str], None] | None, replace: bool) -> Connection:
    kwargs = _credentials(list(hop.keys), True, hop.agent, hop.identities_only,
                          not hop.keys, timeout)
    if target.passphrase:
        kwargs["passphrase"] = target.passphrase
    conn = _open(hop.host, hop.user, hop.port, timeout, kwargs, sock, hop.algorithms, hop.agent,
                 PinningPolicy(hop.pin_name, known_hosts_path(), notify, replace),
                 lambda exc, timed_out, waited: _hop_failed(target, hop, exc, timed_out, timeout,
                                                            _tried(kwargs), waited, sock))
    conn.gp_hop = hop
    return conn


def _login(target: Target, sock: Any, timeout: int, notify: Callable[[str], None] | None,
           replace_key: bool, password: str | None, key_only: bool) -> Connection:
    others = password is None and not key_only  # the agent and ~/.ssh/id_* may be tried
    keys = [os.path.expanduser(target.key)] if target.key and password is None else []
    if others:
        keys += [k for k in target.identity_files if k not in keys]
    kwargs = _credentials(keys, others, target.agent, target.identities_only,
                          not target.identity_files, timeout)
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
    routed = bool(target.route) or target.proxy_command is not None

    def failed(exc: BaseException, timed_out: bool, waited: float) -> BaseException:
        if isinstance(sock, ProxySock) and sock.process.poll() is not None:
            return SSHError(target.name, PROXY_FAILED, f"{sock.ended()} (ProxyCommand "
                            f"{target.proxy_command}, on the way to {target.host}:"
                            f"{target.port}); `ssh {target.alias or target.host}` shows the "
                            "same")
        error = classify(target, exc, timed_out, timeout=timeout, tried=_tried(kwargs),
                         waited=waited)
        if routed and isinstance(error, SSHError):
            via = describe(target.route, target.proxy_command)
            return SSHError(target.name, error.kind, f"{_said(error)} (at the target itself, "
                            f"reached {via})")
        return error
    return _open(target.host, target.user, target.port, timeout, kwargs, sock, target.algorithms,
                 target.agent, PinningPolicy(target.pin_name, known_hosts_path(), notify, replace_key),
                 failed, routed)


def _open(host: str, user: str, port: int, timeout: int, kwargs: dict[str, object], sock: Any,
          algorithms: tuple[tuple[str, str, tuple[str, ...]], ...], agent: bool | str,
          policy: paramiko.MissingHostKeyPolicy,
          failed: Callable[[BaseException, bool, float], BaseException],
          routed: bool = True) -> Connection:
    if sock is not None:
        kwargs["sock"] = sock
    disabled = disabled_algorithms(algorithms)
    if disabled:
        kwargs["disabled_algorithms"] = disabled
    cls = Routed if routed else Connection
    conn = cls(host, user=user, port=port, connect_timeout=timeout, connect_kwargs=kwargs,
               config=_bare())
    conn.client.set_missing_host_key_policy(policy)
    if isinstance(agent, str) and kwargs.get("allow_agent"):
        # IdentityAgent PATH: SSHClient asks the agent it holds, and makes one from
        # $SSH_AUTH_SOCK only when it holds none (client.py _auth)
        conn.client._agent = agent_at(agent)
        if conn.client._agent is None:  # as ssh: no agent there, the other keys still count
            conn.connect_kwargs["allow_agent"] = False
    started = time.monotonic()
    try:
        conn.open()
    except BaseException as exc:
        conn.close()
        waited = time.monotonic() - started
        raise failed(exc, waited >= timeout * 0.9, waited) from None
    return conn


def _said(error: SSHError) -> str:
    return str(error).removeprefix(f"{error.host}: {error.kind}: ")


def _hop_failed(target: Target, hop: Hop, exc: BaseException, timed_out: bool, timeout: int,
                tried: str, waited: float, sock: Any) -> BaseException:
    """A jump host's failure, named as such: its name, address and the line that brought it
    in, and for a changed key the command that re-pins that hop."""
    at = f"the jump host {hop.label()}" + (f" ({hop.where})" if hop.where else "")
    if isinstance(sock, ProxySock) and sock.process.poll() is not None:
        return SSHError(target.name, PROXY_FAILED, f"{at}: {sock.ended()} (ProxyCommand "
                        f"{hop.proxy_command})")
    if isinstance(exc, HostKeyChanged):
        return SSHError(target.name, HOST_KEY_CHANGED,
                        f"{at} now presents {fingerprint(exc.new)}, but {exc.name} was pinned "
                        f"to {fingerprint(exc.old)} in {known_hosts_path()}. If you expect a "
                        "new key there (it was rebuilt), re-pin that hop with: gpu-provision -H "
                        f"{host_arg(target)} repin --hop {hop.name}")
    if isinstance(exc, paramiko.AuthenticationException) or (
            isinstance(exc, paramiko.SSHException) and "No authentication methods" in str(exc)):
        return SSHError(target.name, AUTH_REFUSED, f"{at} refused {tried} for {hop.user}: give "
                        "it the right key (IdentityFile in its Host block of your ssh "
                        "configuration, or the key in ssh-agent)")
    pseudo = replace(target, host=hop.host, port=hop.port, user=hop.user,
                     source=target.source or Path(hop.where or "ssh_config"))
    error = classify(pseudo, exc, timed_out, timeout=timeout, tried=tried, waited=waited)
    if isinstance(error, SSHError):
        return SSHError(target.name, error.kind, f"{at}: {_said(error)}")
    return error


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
