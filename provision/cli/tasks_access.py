"""Tasks about reaching a host: the pinned key, an authorized key, pushed tokens."""

from __future__ import annotations

from invoke.context import Context

from ..ui import console as output
from .taskkit import notify as _notify
from .taskkit import reports_errors, target_of, task
from .taskkit import session_of as _session


@task(help={"hop": "re-pin this jump host on the way (its ProxyJump name or host:port) "
                   "instead of the host itself, e.g. --hop bastion"})
@reports_errors
def repin(c: Context, hop: str | None = None) -> None:
    """Accept the host's current SSH key, replacing the pinned one (after a rebuild or reuse).

    Example: gpu-provision -H root@203.0.113.10:2222 repin
    """
    from ..remote.connection import connect, known_hosts_path
    from ..remote.keep import stop_for
    target = target_of(c)
    stop_for(target, known_hosts_path())  # a kept connection was checked against the old key
    if hop:
        connect(target, notify=_notify, repin_hop=hop).close()
    else:
        connect(target, notify=_notify, replace_key=True).close()


@task(name="forget-secrets", aliases=["forget"])
@reports_errors
def forget_secrets(c: Context) -> None:
    """Remove the tokens pushed with push_env from the host (env file, .bashrc line, journal).

    Example: gpu-provision -H my-4090 forget-secrets
    """
    from ..ops.secrets import forget_secrets_step
    from ..setup.engine import run_step

    with _session(c) as s:
        names = run_step(s.ex, forget_secrets_step(), s.run, output.console).data
    output.console.print(f"{s.target.name}: removed {names} from the host"
                         if names else f"{s.target.name}: no pushed tokens to remove",
                         markup=False)


@task(help={"pubkey": "public key to install (default: the inventory's key + .pub, else "
                      "~/.ssh/id_ed25519.pub or id_rsa.pub)",
            "password_env": "read the password from this environment variable (else a prompt)"})
@reports_errors
def authorize(c: Context, pubkey: str | None = None, password_env: str | None = None) -> None:
    """Install your public key with the host's password, once; later runs log in by key.

    Example: gpu-provision -H root@203.0.113.10:22 authorize -i ~/.ssh/id_ed25519
    """
    from ..remote.authorize import authorize_key
    target = target_of(c)
    text = authorize_key(target, pubkey, password_env or target.password_env, _notify)
    output.console.print(f"{target.name}: {text}", markup=False)


@task(name="forget-host-key")
@reports_errors
def forget_host_key(c: Context) -> None:
    """Remove the host's pinned SSH key from our known_hosts file."""
    from ..remote.connection import forget_pin, known_hosts_path
    from ..remote.keep import stop_for
    target = target_of(c)
    stop_for(target, known_hosts_path())
    found = forget_pin(target)
    output.console.print(f"{target.pin_name}: {'forgotten' if found else 'was not pinned'} "
                         f"({known_hosts_path()})", markup=False)
