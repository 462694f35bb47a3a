"""The one place ``shell`` and ``forward`` open SSH channels on our pinned connection.

Everything that needs a channel of its own (an interactive session, a ``direct-tcpip`` tunnel
to a port on the host) asks ``open_channel``: a connection keeper that reuses or re-opens the
transport can take it over here without the callers changing.
"""

from __future__ import annotations

import paramiko
from fabric import Connection

from ..errors import ConnectionLost, SSHError

OPEN_TIMEOUT = 15.0  # seconds the server has to accept a channel


class NothingListens(Exception):
    """The host's sshd could not connect to the port asked for: nothing listens there (yet)."""


def open_channel(conn: Connection, host: str, kind: str = "session",
                 dest: tuple[str, int] | None = None,
                 timeout: float = OPEN_TIMEOUT) -> paramiko.Channel:
    """A new channel on ``conn`` (opened already): ``session`` (a command or a login), or
    ``direct-tcpip`` to ``dest`` as the host sees it (RFC 4254 7.2, what ``ssh -L`` asks for).

    ``host``: the name errors use. Raises NothingListens when the server answers a tunnel with
    "connect failed" (RFC 4254 5.1, SSH_OPEN_CONNECT_FAILED: nothing listens there), SSHError
    when the connection itself is gone.
    """
    transport = conn.client.get_transport()
    if transport is None or not transport.is_active():
        raise ConnectionLost(host, f"the opening of a {kind} channel")
    try:
        if kind == "session":
            chan: paramiko.Channel = transport.open_session(timeout=timeout)
            return chan
        if kind == "direct-tcpip" and dest is not None:
            tunnel: paramiko.Channel = transport.open_channel(
                "direct-tcpip", dest_addr=dest, src_addr=("127.0.0.1", 0), timeout=timeout)
            return tunnel
    except paramiko.ChannelException as exc:
        if exc.code == paramiko.common.OPEN_FAILED_CONNECT_FAILED:
            raise NothingListens(f"{dest[0]}:{dest[1]}" if dest else kind) from None
        raise SSHError(host, "channel refused", f"the host refused a {kind} channel "
                       f"({exc.text or exc.code}); its sshd may forbid it (AllowTcpForwarding)"
                       ) from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise ConnectionLost(host, f"the opening of a {kind} channel",
                             f" ({type(exc).__name__}: {exc})") from None
    raise ValueError(f"open_channel: {kind!r} (with dest {dest!r})")
