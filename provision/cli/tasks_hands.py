"""The renter's hands on the host: ``shell``, ``forward``, ``ssh-config``, ``forget-login``.

Declarations only: each task imports provision/cli/hands_commands.py when it runs, so listing the
tasks and the other commands' start-up load none of it (Fabric, paramiko, the access modules).
"""

from __future__ import annotations

from invoke.context import Context

from .taskkit import reports_errors, task


@task(command=True)
@reports_errors
def shell(c: Context) -> None:
    """A login on the host in the env bootstrap made, in the data dir; -- CMD runs one command.

    Over our connection and the pinned host key: a real terminal on the host (its size follows
    this window; Ctrl-C reaches what runs there), and the shell's exit code is this command's.
    With -- CMD the words run as given (never re-split by a shell), without a terminal, and its
    exit code is this command's; one word holding spaces or shell syntax is a command line for
    the host's bash, as `ssh HOST 'a | b'` takes it. Example: gpu-provision -H my-4090 shell;
    gpu-provision -H my-4090 shell -- python -c 'import torch; print(torch.__version__)';
    gpu-provision -H my-4090 shell -- 'nvidia-smi | head -5'
    """
    from . import hands_commands
    hands_commands.shell(c)


FORWARD_HELP = {
    "ports": "the host's ports, each PORT or PORT:LOCAL, e.g. 8888 or 8888:9000 6006",
    "job": "forward while this job runs (its id or name), and print the Jupyter token URL its "
           "log shows",
    "check": "an HTTP path to try once the port answers, e.g. /v1/models (default: the "
             "recipe's serve: check)",
    "json": "print the forwarded ports as JSON (one value), then keep forwarding",
}


@task(help=FORWARD_HELP, positional=["ports"])
@reports_errors
def forward(c: Context, ports: str, job: str | None = None, check: str | None = None,
            json_: bool = False) -> None:
    """Reach ports on the host from this machine: 127.0.0.1:LOCAL -> the host's PORT, until Ctrl-C.

    Over our connection and pinned key (no ssh -L to type); bound to 127.0.0.1 only. A busy
    local port moves to the next free one, and the line says so. Says when nothing listens on
    the host's port yet and waits for it. Example: gpu-provision -H my-4090 forward 8888;
    gpu-provision -H my-4090 forward 6006 8888:9000 --job notebook
    """
    from . import hands_commands
    hands_commands.forward(c, ports, job=job, check=check, json_=json_)


SSH_CONFIG_HELP = {
    "write": "put the blocks in our own file and Include it from ~/.ssh/config (added once, "
             "with a marker; your own entries are never edited)",
    "remove": "take our Include line out of ~/.ssh/config again",
    "hosts": "these hosts (or a group) instead of -H",
    "json": "print the blocks as JSON",
}


@task(name="ssh-config", help=SSH_CONFIG_HELP)
@reports_errors
def ssh_config(c: Context, write: bool = False, remove: bool = False, hosts: str | None = None,
               json_: bool = False) -> None:
    """Host blocks for plain ssh, scp, rsync and VS Code that trust exactly our pinned keys.

    HostKeyAlias and UserKnownHostsFile point at our pins, StrictHostKeyChecking is yes: any
    other key is refused, never asked about.

    Without -H: every inventory of yours. Example: gpu-provision -H my-4090 ssh-config --write;
    then: ssh my-4090, or VS Code's Remote-SSH: Connect to Host... my-4090
    """
    from . import hands_commands
    hands_commands.ssh_config(c, write=write, remove=remove, hosts=hosts, json_=json_)


@task(name="forget-login", help={"json": "print what was removed as JSON"})
@reports_errors
def forget_login(c: Context, json_: bool = False) -> None:
    """Take the block that activates the env out of the host's ~/.bashrc and login profile.

    Bootstrap adds it (a marked block, once); the rest of each file stays as it was.
    Example: gpu-provision -H my-4090 forget-login
    """
    from . import hands_commands
    hands_commands.forget_login(c, json_=json_)


ssh_config.whole_fleet = True  # one file, one Include: every host in one call
