"""rsync over our own SSH settings: the laptop's ``rsync`` and ``ssh`` with the host key we
pinned, never ``~/.ssh/known_hosts``.

The pinned key(s) are written to a temporary known_hosts file under a fixed alias
(``-o HostKeyAlias``), and ssh is told to accept nothing else (``StrictHostKeyChecking=yes``).
rsync names the host by that alias and ssh connects to the real address (``-o HostName``), so
an IPv6 address or an odd user name never goes through rsync's own ``[user@]host:path``
parsing. File names travel in a NUL-separated list (``--files-from --from0``) and the remote
paths are sent over rsync's protocol, not through the remote shell (``--protect-args``).

Used only where both ends have rsync (laptop >= 3.1 for ``--info=progress2``, host >= 3.0 for
``--protect-args``) and the login needs no password; otherwise sync goes over SFTP.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from paramiko.hostkeys import HostKeys

from ..config.inventory import Target
from ..remote.command import quote
from ..remote.connection import default_timeout, known_hosts_path

ALIAS = "gpu-provision-host"  # the name rsync and ssh know the host by; HostName is the address
PARTIAL_DIR = ".gpu-provision-partial"  # cut files wait here (not under their own name) to resume
LOCAL_MIN = (3, 1, 0)  # --info=progress2
REMOTE_MIN = (3, 0, 0)  # --protect-args
# rsync exit codes that mean the link went away rather than a refusal (rsync(1) EXIT VALUES)
LINK_LOST = {10, 12, 20, 30, 35, 255}
_ALGORITHMS = {"ssh-rsa": "rsa-sha2-512,rsa-sha2-256,ssh-rsa"}
_PROGRESS = re.compile(r"^\s*([\d,.]+)\s+(\d+)%\s")
_STAT = re.compile(r"^(Literal data|Matched data|Total bytes sent|Total bytes received|"
                   r"Number of regular files transferred): ([\d,.]+)")


def parse_version(text: str) -> tuple[int, ...] | None:
    """``rsync  version 3.2.7  protocol version 31`` -> (3, 2, 7); None when not rsync."""
    m = re.search(r"rsync\s+version\s+v?(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(x) for x in m.groups()) if m else None


@functools.cache
def local_rsync() -> tuple[str, str] | None:
    """(rsync, ssh) programs on this machine when both are there and rsync is new enough
    (asked once per process: ``rsync --version`` costs a process start)."""
    rsync, ssh = shutil.which("rsync"), shutil.which("ssh")
    if not rsync or not ssh:
        return None
    try:
        out = subprocess.run([rsync, "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    version = parse_version(out)
    return (rsync, ssh) if version and version >= LOCAL_MIN else None


def prompted_login(target: Target) -> str | None:
    """What the login needs that OpenSSH in batch mode cannot give (None: nothing): rsync's ssh
    would fail to authenticate, and its exit 255 reads as a lost link."""
    if target.password_env or target.password:
        return "the login needs a password (ssh would prompt for it)"
    if target.passphrase:
        return "the key needs its passphrase (ssh would prompt for it)"
    return None


def why_not(target: Target, local: tuple[str, str] | None, remote_version: str) -> str | None:
    """Why rsync cannot carry this transfer (None: it can)."""
    if local is None:
        return f"no rsync >= {'.'.join(map(str, LOCAL_MIN))} with ssh on this machine"
    if prompted := prompted_login(target):
        return prompted
    if target.route or target.proxy_command:  # rsync's ssh would need the route and each pin
        return "the host is reached through a jump host or ProxyCommand"
    version = parse_version(remote_version)
    if version is None:
        return "no rsync on the host"
    if version < REMOTE_MIN:
        return f"the host's rsync {'.'.join(map(str, version))} is older than 3.0"
    return None


def pinned_lines(target: Target) -> list[tuple[str, str]]:
    """(key type, base64) of each key pinned for ``target`` in our known_hosts file."""
    path = known_hosts_path()
    keys = HostKeys(str(path)) if path.exists() else HostKeys()
    found = keys.lookup(target.pin_name)
    return [(kind, found[kind].get_base64()) for kind in found.keys()] if found else []


@contextmanager
def ssh_options(target: Target, ssh: str, control: str | None = None) -> Iterator[list[str]]:
    """The ssh command line rsync runs (as a list), with a temporary known_hosts file holding
    only the key(s) we pinned for ``target``. The file is removed afterwards. ``control``: the
    socket of a master connection to share (see ``Link``)."""
    pins = pinned_lines(target)
    if not pins:
        raise ValueError(f"{target.name}: no pinned host key (connect once first)")
    with tempfile.TemporaryDirectory(prefix="gpu-provision-ssh-") as tmp:
        known = Path(tmp) / "known_hosts"
        known.write_text("".join(f"{ALIAS} {kind} {b64}\n" for kind, b64 in pins))
        algorithms = ",".join(_ALGORITHMS.get(kind, kind) for kind, _ in pins)
        wait = target.connect_timeout or default_timeout()  # -t, as for our own connection
        argv = [ssh, "-p", str(target.port), "-l", target.user,
                "-o", f"HostName={target.host}", "-o", f"HostKeyAlias={ALIAS}",
                "-o", f"UserKnownHostsFile={known}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=yes", "-o", "UpdateHostKeys=no",
                "-o", "CheckHostIP=no", "-o", f"HostKeyAlgorithms={algorithms}",
                "-o", "BatchMode=yes", "-o", f"ConnectTimeout={wait}",
                "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"]
        argv += ["-o", "ControlMaster=no", "-o", f"ControlPath={control}"] if control else \
            ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
        keys = [os.path.expanduser(target.key)] if target.key else []
        for k in [*keys, *target.identity_files]:  # the ssh configuration's too, in order
            argv += ["-i", k]
        if keys or target.identity_files:
            argv += ["-o", "IdentitiesOnly=yes"]
        yield argv


class Link:
    """One SSH connection for every rsync of a task, opened in the background as soon as the
    task starts (while our own connection lists the host), so rsync pays no handshake of its own:
    at 200 ms RTT a handshake is about a second. ``argv`` is what rsync's ``-e`` runs; it uses
    the master once its socket is there and connects by itself otherwise (ssh's ControlMaster=no
    behaviour), so a master that fails costs nothing but the try."""

    def __init__(self, argv: list[str], master: subprocess.Popen[bytes] | None, socket: Path):
        self.argv, self.master, self.socket = argv, master, socket

    def ready(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout``, else the connect timeout) until the master can be used,
        or has given up."""
        deadline = time.monotonic() + (timeout or default_timeout())
        while self.master is not None and self.master.poll() is None and \
                not self.socket.exists() and time.monotonic() < deadline:
            time.sleep(0.02)


@contextmanager
def link(target: Target, ssh: str) -> Iterator[Link]:
    """Start a master connection to ``target`` in the background (needs the host key pinned:
    after the first connection ever, which pins it) and yield the ``Link``; ended on exit."""
    # a short folder: a socket path may hold about 100 bytes
    base = "/tmp" if Path("/tmp").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="gp-", dir=base) as tmp:
        sock = Path(tmp) / "m"
        with ssh_options(target, ssh, control=str(sock)) as argv:
            own = ["ControlMaster=yes" if a == "ControlMaster=no" else a for a in argv]
            # ControlMaster=yes alone: with -M as well, ssh asks before each shared session
            master = subprocess.Popen([*own, "-N", "-o", "ControlPersist=no", ALIAS],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
            try:
                yield Link(argv, master, sock)
            finally:
                master.terminate()
                try:
                    master.wait(5)
                except subprocess.TimeoutExpired:
                    master.kill()


def rsh(argv: Sequence[str]) -> str:
    """The ``-e`` value: rsync splits it on spaces and honours single quotes (rsync(1), -e)."""
    return " ".join(quote(a) for a in argv)


def argv(rsync: str, ssh_argv: Sequence[str], source: str, dest: str, *, listed: bool,
         up: bool) -> list[str]:
    """The rsync command line. ``listed``: the files come NUL-separated on stdin, relative to
    ``source`` (a folder); else ``source`` is one file. The host side is ``ALIAS:path``."""
    remote = f"{ALIAS}:{dest if up else source}"
    local = source if up else dest
    a = [rsync, "-rt", "--perms", "--partial-dir", PARTIAL_DIR, "--protect-args",
         "--info=progress2", "--no-human-readable", "--stats", "--timeout=120",
         "-e", rsh(ssh_argv)]
    if listed:
        # only the files sync chose are listed: regular ones, and links inside the folder that
        # --links-as-files sends as their file (--copy-links). Links themselves are made after
        # the transfer by sync, the same for both transports; outside ones are never listed
        a += ["--files-from=-", "--from0", "--copy-links"]
        local, remote = local.rstrip("/") + "/", remote.rstrip("/") + "/"
    return a + ([local, remote] if up else [remote, local])


def _number(text: str) -> int:
    return int(re.sub(r"[,.]", "", text))


@dataclass(frozen=True)
class RsyncRun:
    exit_code: int
    literal: int  # bytes sent as data (the rest was matched against what was already there)
    matched: int
    files: int
    stderr: str
    seconds: float

    @property
    def link_lost(self) -> bool:
        return self.exit_code in LINK_LOST


def parse_stats(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _STAT.match(line.strip())
        if m:
            out[m.group(1)] = _number(m.group(2))
    return out


def run(command: Sequence[str], files: Sequence[str] | None,
        progress: Callable[[int], None] | None = None) -> RsyncRun:
    """Run rsync; ``files`` go NUL-separated to its stdin; each progress2 figure (bytes done in
    this run, including what matched a partial file) goes to ``progress``."""
    started = time.monotonic()
    proc = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "LC_ALL": "C"})
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    err: list[bytes] = []
    stderr = proc.stderr
    reader = threading.Thread(target=lambda: err.append(stderr.read()), daemon=True)
    reader.start()
    try:
        if files is not None:
            proc.stdin.write(b"".join(os.fsencode(f) + b"\0" for f in files))
        proc.stdin.close()
    except BrokenPipeError:
        pass
    text, buf = [], b""
    while chunk := os.read(proc.stdout.fileno(), 65536):
        buf += chunk
        *parts, buf = re.split(rb"[\r\n]", buf)
        for part in parts:
            line = part.decode("utf-8", "replace")
            m = _PROGRESS.match(line)
            if m and progress:
                progress(_number(m.group(1)))
            elif line.strip():
                text.append(line)
    text.append(buf.decode("utf-8", "replace"))
    code = proc.wait()
    reader.join()
    stats = parse_stats("\n".join(text))
    return RsyncRun(exit_code=code, literal=stats.get("Literal data", 0),
                    matched=stats.get("Matched data", 0),
                    files=stats.get("Number of regular files transferred", 0),
                    stderr=b"".join(err).decode("utf-8", "replace"),
                    seconds=time.monotonic() - started)
