"""Tokens the inventory asks to push (``push_env``): read here, masked everywhere, hashed with a
local key so the host's journal can say "unchanged" without holding anything that reveals them."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets as random
from collections.abc import Mapping

from ..errors import ProvisionError
from .inventory import Target
from .shipped import state_dir


def push_values(target: Target, required: bool = True) -> dict[str, str]:
    """name -> value from this shell's environment for each ``push_env`` name. ``required``:
    a name that is not set is an error (else it is left out)."""
    values: dict[str, str] = {}
    for name in target.settings.get("push_env") or ():
        if name in os.environ:
            values[name] = os.environ[name]
        elif required:
            raise ProvisionError(f"{target.source or target.name}: push_env: {name} is not set in "
                                 f"this shell: export {name}=... first, or remove it from push_env")
    return values


def _local_key() -> bytes:
    """32 random bytes made on first use, readable only by this user."""
    path = state_dir() / "secret.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(random.token_bytes(32))
        os.replace(path.with_suffix(".tmp"), path)
    return path.read_bytes()


def digest(values: Mapping[str, str]) -> str:
    payload = json.dumps(dict(sorted(values.items()))).encode()
    return hmac.new(_local_key(), payload, hashlib.sha256).hexdigest()[:32]
