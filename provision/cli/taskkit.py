"""What every task is made of: ``@task`` with the program's flag conventions, one-line errors
with their exit codes, ``--json``, and the host a call runs against.

The conventions (docs/architecture.md, "How to add a task"):

- Options are long (``--torch``, ``--platform``). Three short letters exist and mean the same in
  every task: ``-j/--json``, ``-p/--python``, ``-r/--recipe``. No task letter repeats a
  program-wide flag's (``PROGRAM_LETTERS``), except where a verb's letter is what every user
  types (``logs JOB -f``, as ``tail -f``, ``docker logs -f``): ``@task(short={"follow": "f"})``
  declares it, and after that task's name ``-f`` is the task's; before it, Fabric's
  ``-f/--config``. Every option has help text.
- Exit codes: 0 done; 1 the task ran and found a failure (a FAIL verdict, a failed step or
  check, an SSH failure, a bad inventory); 2 the command line cannot work (an unknown task or
  option, a bad value, a missing ``-H``) or nothing fits (``pick``); 130 interrupted.
- ``--json`` (on every task that reports): stdout carries only JSON, one value per host (one
  line each when there are several); what people read goes to stderr; a failure prints
  ``{"error": "...", "exit_code": N}`` (with ``"host"`` where one is known).

Only Invoke is imported here: a task's own modules are imported inside it, so that start-up
stays small (``gpu-provision pick`` never loads paramiko).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from invoke.exceptions import Exit
from invoke.tasks import Task as InvokeTask
from invoke.tasks import task as invoke_task

from ..errors import ProvisionError, RemoteError, UsageError
from ..ui import console as output

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from ..config.inventory import Target
    from ..config.options import Overrides
    from ..setup.session import Session

F = TypeVar("F", bound=Callable[..., Any])

SHORT_FLAGS = {"json": "j", "python": "p", "recipe": "r"}
# Letters of the program-wide flags (cli.py): a task option never takes one of them.
PROGRAM_LETTERS = frozenset("HiSthlVdDfF")

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130

ONE_HOST = "this task needs a host: -H <inventory name | user@host:port>"


class Task(InvokeTask):  # type: ignore[type-arg]
    """An Invoke task with long options, the conventional short letters, and help that stays.

    Invoke gives each option the first free letter of its name (so ``-p`` was ``--python`` in
    one task and ``--platform`` in the next) and hands each help text out once (a second parser
    of the same task showed none); neither happens here.
    """

    def __init__(self, body: Callable[..., Any], *args: Any, command: bool = False,
                 short: dict[str, str] | None = None, **kwargs: Any) -> None:
        kwargs["auto_shortflags"] = False
        super().__init__(body, *args, **kwargs)
        self.takes_command = command  # reads a command given after `--` (command_line())
        self.short = dict(short or {})  # this task's own letters (see the module's docstring)

    def arg_opts(self, name: str, default: Any, taken_names: set[str]) -> dict[str, Any]:
        opts: dict[str, Any] = super().arg_opts(name, default, taken_names)
        letter = self.short.get(opts["names"][0]) or SHORT_FLAGS.get(opts["names"][0])
        if letter is not None:
            opts["names"].append(letter)
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Any]:
        kept: dict[str, str] = dict(self.help)
        try:
            return super().get_arguments(ignore_unknown_help)
        finally:
            self.help = kept


def task(*args: Any, **kwargs: Any) -> Any:
    """``@task`` / ``@task(name=..., help={...})``: Invoke's decorator making a ``Task``.

    ``command=True``: the task takes the command written after ``--`` (``command_line()``);
    for every other task ``--`` is refused.
    """
    kwargs.setdefault("klass", Task)
    return invoke_task(*args, **kwargs)


# Fabric's and Invoke's flags that have no meaning here, and why (program-wide flags: cli.py
# does not define them; `fab` in a checkout does, and the executor refuses them there).
REFUSED = {
    "dry": ("-R/--dry", "`plan` is the dry run: every decision with its reason, nothing "
                        "changed (gpu-provision -H HOST plan)"),
    "echo": ("-e/--echo", "each step's commands and output are kept in "
                          "logs/<host>/<run>/<step>.log; `plan` shows what would run, running "
                          "nothing"),
    "pty": ("-p/--pty", "steps run detached on the host, without a terminal (after a task name "
                        "-p is --python)"),
    "warn-only": ("-w/--warn-only", "a failed step stops its host and says why (other hosts go "
                                    "on); nothing runs past it"),
    "command-timeout": ("-T/--command-timeout", "long steps run detached on the host and are "
                                                "re-attached, never cut off; -t/--connect-timeout "
                                                "bounds the connection"),
    "hide": ("--hide", "use --json for output without tables"),
    "prompt-for-sudo-password": ("--prompt-for-sudo-password", "no step types a sudo password: "
                                 "log in as root or as a user with passwordless sudo"),
}


def refusal(flag: str) -> str | None:
    """The one line for a refused flag as the user typed it (``-R``, ``--dry``), else None."""
    for names, why in REFUSED.values():
        if flag.split("=", 1)[0] in names.split("/"):
            return f"{names} is not supported: {why}"
    return None


_COMMAND = {"line": ""}


def command_line() -> str:
    """The command written after ``--``, for a task declared with ``command=True``."""
    return _COMMAND["line"]


def take_command(core: Any, called: list[Any]) -> None:
    """Keep what follows ``--`` for the tasks that take a command, and refuse it otherwise.

    Fabric would run it on every host itself, over a connection that accepts any host key:
    here nothing reaches a host except through a task. Also refuses Fabric's run-time flags
    (`fab` in a checkout defines them).
    """
    args = core[0].args if core else {}
    for name, (names, why) in REFUSED.items():
        if name in args and args[name].value:
            raise Exit(f"error: {names} is not supported: {why}", code=EXIT_USAGE)
    line = getattr(core, "remainder", "")
    if not line:
        return
    if not any(getattr(t, "takes_command", False) for t in called):
        raise Exit(f"error: `-- {line}`: gpu-provision runs no ad-hoc command on hosts (it "
                   "would bypass the pinned host keys); tasks run their own steps",
                   code=EXIT_USAGE)
    _COMMAND["line"] = line
    core.remainder = ""  # so that Fabric's executor adds no anonymous task of its own


class Failed(Exit):
    """A task's failure, carrying the error itself to the multi-host summary."""

    def __init__(self, error: ProvisionError):
        super().__init__(f"error: {error}", code=error.exit_code)
        self.error = error


class Shown(Failed):
    """A failure the task has already shown in full (a plan's "blocked:" line, a FAIL verdict
    table): its exit code and, for the multi-host summary, the error; no second line of it."""

    def __init__(self, error: ProvisionError):
        super().__init__(error)
        self.message = ""


def error_json(error: ProvisionError) -> dict[str, Any]:
    out: dict[str, Any] = {"error": str(error), "exit_code": error.exit_code}
    host = getattr(error, "host", None)
    if host:
        out["host"] = host
    return out


def reports_errors(fn: F) -> F:
    """A ProvisionError becomes its one-line message and exit code (no traceback); with
    ``--json`` also a JSON error object on stdout, and human output goes to stderr."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("json_"))
        if as_json:
            output.humans_to_stderr()
        try:
            return fn(*args, **kwargs)
        except ProvisionError as exc:
            if isinstance(exc, RemoteError) and exc.diagnosable:
                from ..doctor.match import explain  # the knowledge base loads only on a failure
                exc = explain(exc)
            if as_json:
                output.print_json(error_json(exc))
            if getattr(exc, "shown", False):  # said as it happened (Ctrl-C during a step)
                raise Shown(exc) from None
            raise Failed(exc) from None
        except KeyboardInterrupt:  # between steps: nothing runs on the host for us
            raise Exit("interrupted: no step was running; run the task again",
                       code=EXIT_INTERRUPTED) from None
    return wrapper  # type: ignore[return-value]


def has_host(c: Any) -> bool:
    """Whether the task was called for a host (Fabric made a Connection from ``-H``)."""
    return getattr(c, "original_host", None) is not None


def target_of(c: Any) -> Target:
    """The host of this call, as the inventory, the command line and the user's ssh
    configuration describe it (``inventory.with_ssh_config`` says which wins).

    Fabric has split ``user@host:port`` only (it reads no ssh_config here: ours is read as
    OpenSSH reads it, ProxyJump included). ``-i``, ``-t``, ``--prompt-for-login-password`` and
    ``--prompt-for-passphrase`` ride along to the connection.
    """
    if not has_host(c):
        raise UsageError(ONE_HOST)
    kwargs = c.connect_kwargs or {}
    timeout = kwargs.get("timeout") or getattr(c, "connect_timeout", None)
    target = host_target(c, c.original_host, connecting=True)
    if target.source is None and target.alias is None and target.host == c.original_host:
        _must_resolve(target.host)
    return replace(target, connect_timeout=int(timeout) if timeout else target.connect_timeout,
                   password=kwargs.get("password"), passphrase=kwargs.get("passphrase"))


def host_target(c: Any, spec: str, connecting: bool = False) -> Target:
    """One host of ``-H`` (or ``--hosts``), ``spec`` its inventory name or host, completed by
    the ssh configuration (``-S FILE``, else the user's and the system's)."""
    from ..config.inventory import resolve_target, with_ssh_config

    config = getattr(c, "config", None)
    identities = [str(p) for p in ((config.get("authentication") if config else None)
                                   or {}).get("identities") or []]
    user = getattr(c, "user", None) or None  # only what -H wrote (main.py: no Fabric default)
    port = getattr(c, "port", None) or None
    target = resolve_target(spec, user=user, port=port, host=None,
                            key=identities[0] if identities else None, connecting=connecting)
    cli_user = user if target.source is None else None  # an inventory's -H has no user@
    cli_port = port if target.source is None else None
    return with_ssh_config(target, cli_user, cli_port,
                           getattr(config, "_runtime_ssh_path", None) if config else None)


def _must_resolve(name: str) -> None:
    """A bare name in ``-H`` (no dot) that is no inventory, no ~/.ssh/config host and no
    resolvable host is most likely a mistyped inventory name: say where inventories were
    looked for, before connecting."""
    import socket

    from ..config.inventory import where_looked
    from ..config.validators import NAME_RE
    if "." in name or not NAME_RE.match(name):
        return
    try:
        socket.getaddrinfo(name, None)
    except OSError:
        raise UsageError(f"-H {name}: {where_looked(name)}, and no host by that name "
                         "resolves") from None


def notify(msg: str) -> None:
    """A side note for the user (a pinned key, a reconnect): stderr, never mixed into JSON."""
    output.err_console.print(msg, style="cyan", markup=False)


def session_of(c: Any) -> AbstractContextManager[Session]:
    """One session on the task's host, logging under this run."""
    target = target_of(c)
    from ..remote.connection import default_timeout, known_hosts_path
    from ..remote.keep import prepare
    # the host's keeper starts while the rest loads
    prepare(target, known_hosts_path(), target.connect_timeout or default_timeout())
    from ..setup.session import session
    from ..store import Store
    return session(target, Store.here(), notify)


def overrides(**given: str | None) -> Overrides:
    """The command line's settings, checked (names of recipes and platforms too) before any
    connection."""
    from ..config.options import Overrides
    return Overrides(**given)
