"""The folder of our local sockets (kept connections, the warm start) and how a socket is made
there. Standard library only: the program's entry point reads it before anything heavy is
imported."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

SUN_PATH = 100  # bytes a socket path may take everywhere (macOS: 104 with the NUL)
NAME_LEN = 20  # a keeper's socket name: 20 hex digits


def run_dir() -> Path | None:
    """The folder of our sockets: $GPU_PROVISION_RUN_DIR, else $XDG_RUNTIME_DIR/gpu-provision,
    else /tmp/gpu-provision-UID; None when it is not ours alone or the paths would be too long."""
    env = os.environ.get("GPU_PROVISION_RUN_DIR")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if env:
        path = Path(env)
    elif xdg and Path(xdg).is_dir():
        path = Path(xdg) / "gpu-provision"
    else:
        path = Path(tempfile.gettempdir()) / f"gpu-provision-{os.getuid()}"
    if len(str(path).encode()) + 1 + NAME_LEN > SUN_PATH:
        return None
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None  # someone else's, or open to others: never put a socket there
    return path


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
