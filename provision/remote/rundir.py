"""The folder of our local sockets (kept connections, the warm start) and how a socket is made
there. Standard library only: the program's entry point reads it before anything heavy is
imported."""

from __future__ import annotations

import os
import socket
import stat
import struct
import sys
import tempfile
from pathlib import Path

SUN_PATH = 100  # bytes a socket path may take everywhere (macOS: 104 with the NUL)
NAME_LEN = 20  # a keeper's socket name: 20 hex digits
# How our background programs start: python -m puts its working folder (ours: /) first on
# sys.path, before the standard library; -P (3.11+) leaves it out, so no file there is ever
# imported in place of a module
SAFE_PATH = ["-P"] if sys.version_info >= (3, 11) else []


# Why the last run dir asked for was refused ("" when it was not): the kept connection says it
# once, and a command connects fresh.
refused = ""


def run_dir() -> Path | None:
    """The folder of our sockets: $GPU_PROVISION_RUN_DIR, else $XDG_RUNTIME_DIR/gpu-provision,
    else /tmp/gpu-provision-UID (also when the runtime folder is refused: root after ``su``
    keeps the user's, which that user owns). None when none is ours alone (``refused`` says
    why) or the paths would be too long."""
    global refused
    env = os.environ.get("GPU_PROVISION_RUN_DIR")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    tmp = Path(tempfile.gettempdir()) / f"gpu-provision-{os.getuid()}"
    if env:
        tries = [Path(env)]
    elif xdg and Path(xdg).is_dir():
        tries = [Path(xdg) / "gpu-provision", tmp]
    else:
        tries = [tmp]
    why = ""
    for given in tries:
        # judged and used as one path: the parent's links resolved once, here (a link that
        # another user could turn is never followed again by a later bind, lock or connect)
        path = Path(os.path.realpath(given.parent)) / given.name
        if len(str(path).encode()) + 1 + NAME_LEN > SUN_PATH:
            continue  # its sockets' paths would be too long (not a danger: nothing to say)
        why = _problem(path)
        if not why:
            refused = ""
            return path
    refused = why
    return None


def _problem(path: Path) -> str:
    """What makes ``path`` unfit to hold our sockets ("" when nothing does), checked without a
    race: ``path``'s parent comes with its links resolved (``run_dir``), then each folder from /
    down is opened without following a link (O_NOFOLLOW) and judged on its handle (fstat). A folder on the way
    must be root's or ours and, if others may write in it, sticky (as /tmp is: only an entry's
    owner may rename or remove it); the run dir itself must be a real folder, ours, 0700. So
    nobody else can swap it, or a folder above it, for their own between this check and a
    connect (and every client checks who listens anyway: ``peer_is_us``)."""
    uid = os.getuid()
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0)
    parent = path.parent
    fd = os.open("/", flags)
    try:
        for part in parent.parts[1:]:
            try:
                new = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                return f"{parent}: {exc.strerror}"
            os.close(fd)
            fd = new
            st = os.fstat(fd)
            if st.st_uid not in (0, uid):
                return f"{parent}: {part} belongs to uid {st.st_uid}, who could swap what is in it"
            if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
                return f"{parent}: others may write in {part} and it is not sticky"
        try:
            os.mkdir(path.name, 0o700, dir_fd=fd)
        except FileExistsError:
            pass
        except OSError as exc:
            return f"{path}: {exc.strerror}"
        try:
            new = os.open(path.name, flags, dir_fd=fd)
        except OSError as exc:  # ELOOP: a symlink where our folder should be
            return f"{path}: not a folder of ours ({exc.strerror}; a link is not followed)"
        os.close(fd)
        fd = new
        st = os.fstat(fd)
        if st.st_uid != uid:
            return f"{path}: belongs to uid {st.st_uid}, not to us ({uid})"
        if st.st_mode & 0o077:
            return f"{path}: others may use it (mode {stat.S_IMODE(st.st_mode):o}; 700 is safe)"
        return ""
    finally:
        os.close(fd)


def _linux_peer(sock: socket.socket) -> tuple[int, int] | None:
    """(pid, uid) of a connected Unix socket's peer as the kernel took them (SO_PEERCRED,
    Linux: struct ucred), None where the system has no such option."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return None
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, peercred,
                                                         struct.calcsize("3i")))
    return pid, uid


def connect_ours(sock: socket.socket, path: str) -> None:
    """Connect ``sock`` to our socket at ``path``: OSError unless our own user listens there
    (``peer_is_us``), before a byte is sent."""
    sock.connect(path)
    if not peer_is_us(sock):
        raise OSError(f"{path} is held by another user")


def remove_stale(path: Path) -> None:
    """Remove a socket file of ours that nothing listens on any more (``nobody_listens``)."""
    if nobody_listens(str(path)):
        try:
            path.unlink()
        except OSError:
            pass


def peer_is_us(sock: socket.socket) -> bool:
    """Whether the process at the other end of a connected Unix socket runs as our user, asked
    of the kernel (Linux SO_PEERCRED; LOCAL_PEERCRED on macOS and the BSDs). Every client asks
    before it sends a byte, every server before it reads one: a socket that another user put
    where ours would be is never spoken to, whatever happened to the path."""
    linux = _linux_peer(sock)
    if linux is not None:
        return linux[1] == os.getuid()
    local = getattr(socket, "LOCAL_PEERCRED", None)
    if local is not None:  # struct xucred: u_int cr_version, uid_t cr_uid, ... (SOL_LOCAL 0)
        creds = sock.getsockopt(0, local, 76)
        return bool(struct.unpack_from("2I", creds)[1] == os.getuid())
    return True  # no way to ask here: the checked folder is the guard


def peer_shares_our_namespaces(sock: socket.socket) -> bool:
    """Whether the peer sees the same processes, files and network as we do (its pid, mount
    and network namespaces are ours; Linux only, elsewhere True). A client in another namespace
    (unshare, a container sharing /tmp) would have its signals go to the wrong pid, its folder
    read in our mounts and its hosts reached from our network: it runs by itself instead. The
    kernel gives the peer's pid as we see it; 0 when we cannot see it at all."""
    linux = _linux_peer(sock)
    if linux is None or not os.path.exists("/proc/self/ns/pid"):
        return True
    pid = linux[0]
    if pid <= 0:
        return False
    try:
        return all(os.readlink(f"/proc/{pid}/ns/{ns}") == os.readlink(f"/proc/self/ns/{ns}")
                   for ns in ("pid", "mnt", "net"))
    except OSError:
        return False


def caller_is_ours(sock: socket.socket) -> bool:
    """What a server of ours asks of each caller before it reads a byte: our user, in our
    namespaces."""
    return peer_is_us(sock) and peer_shares_our_namespaces(sock)


def nobody_listens(path: str) -> bool:
    """A socket file that nothing listens on any more (its server was killed): the kernel
    refuses a connect at once. A slow or busy server is not that, and its socket is kept."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return True
    except OSError:
        return False
    finally:
        sock.close()
    return False


def bind(path: str) -> socket.socket:
    """A listening socket at ``path``, 0600 from the start (umask), replacing a stale one."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock
