"""``authorize``: install the local public key with the host's password, once."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..config.inventory import Target
from ..errors import ProvisionError, SSHError
from .command import Command
from .connection import AUTH_REFUSED, connect
from .executor import Executor

# Appends the key given as $1 unless it is there already; the key is an argument, never code.
ADD_KEY = ('umask 077; mkdir -p "$HOME/.ssh"; f="$HOME/.ssh/authorized_keys"; touch "$f"; '
           'grep -qxF "$1" "$f" || printf "%s\\n" "$1" >> "$f"; chmod 700 "$HOME/.ssh"; chmod 600 "$f"')


def key_pair(target: Target, pubkey: str | None) -> tuple[Path, str]:
    """(private key path, public key line): the inventory's or -i key, else ~/.ssh/id_ed25519
    or id_rsa; the public half is ``--pubkey`` or the private path + .pub."""
    candidates = [target.key] if target.key else ["~/.ssh/id_ed25519", "~/.ssh/id_rsa"]
    private = next((Path(os.path.expanduser(k)) for k in candidates
                    if Path(os.path.expanduser(k)).exists()), None)
    if private is None:
        raise ProvisionError(f"no private key: {', '.join(candidates)} missing; make one with "
                             "ssh-keygen -t ed25519, or pass -i KEY")
    pub = Path(os.path.expanduser(pubkey)) if pubkey else Path(f"{private}.pub")
    try:
        line = pub.read_text().strip()
    except OSError as exc:
        raise ProvisionError(f"{pub}: cannot read the public key ({exc.strerror}); pass "
                             "--pubkey FILE") from None
    if not line.startswith(("ssh-", "ecdsa-", "sk-")) or "\n" in line:
        raise ProvisionError(f"{pub}: not an OpenSSH public key line (ssh-ed25519 AAAA...)")
    return private, line


def authorize_key(target: Target, pubkey: str | None, password_env: str | None,
                  notify: Callable[[str], None] | None = None) -> str:
    private, line = key_pair(target, pubkey)
    by_key = replace(target, key=str(private), password_env=None)
    try:
        connect(by_key, notify=notify, key_only=True).close()
        return f"key login with {private} already works; nothing changed"
    except SSHError as exc:
        if exc.kind != AUTH_REFUSED:
            raise
    if password_env:
        password = os.environ.get(password_env)
        if password is None:
            raise ProvisionError(f"password_env: ${password_env} is not set in this shell")
    elif target.password is not None:  # --prompt-for-login-password asked for it already
        password = target.password
    else:
        password = getpass.getpass(f"password for {target.user}@{target.host}: ")
    conn = connect(by_key, notify=notify, password=password)
    try:
        Executor(conn, target.name, secrets=(password,)).run(
            Command(("bash", "-c", ADD_KEY, "authorize", line)), step="authorize")
    finally:
        conn.close()
    try:
        connect(by_key, notify=notify, key_only=True).close()
    except SSHError as exc:
        raise ProvisionError(f"{target.name}: the key was added to ~/.ssh/authorized_keys but key "
                             f"login still fails ({exc.kind}); the server may not allow "
                             "public keys (PubkeyAuthentication) or uses another file") from None
    return (f"installed {private}.pub in ~/.ssh/authorized_keys; key login works, the "
            "password is no longer needed")
