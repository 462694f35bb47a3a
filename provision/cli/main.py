"""The ``gpu-provision`` program: Invoke's parser with Fabric's connection flags, carrying the
project's tasks.

It loads Fabric (and so paramiko) only when ``-H`` names hosts: ``--version``, ``-l``, ``pick``
and the other offline tasks start without it. Fabric's flags mean what they say here or are
refused with the reason (``REFUSED``); a usage error is one line and exit code 2.
"""

from __future__ import annotations

import difflib
import getpass
import os
import re
import sys
from typing import Any

from invoke.collection import Collection
from invoke.exceptions import Exit, ParseError
from invoke.executor import Executor
from invoke.parser.argument import Argument
from invoke.program import Program

from .. import __version__
from . import tasks_host as tasks
from .taskkit import EXIT_USAGE, refusal, take_command

HOSTS_HELP = ("comma-separated hosts: inventory names (NAME.yaml in ./inventories/, "
              "$GPU_PROVISION_INVENTORIES, ~/.config/gpu-provision/inventories/, the examples), "
              "inventory files, groups, or user@host[:port]")

# Invoke's run-time flags that have no meaning here: they drive Context.run, and the tasks run
# nothing through it (every remote command is a step with its own log, see `plan`)
DROPPED = {"command-timeout", "dry", "echo", "hide", "prompt-for-sudo-password", "pty",
           "warn-only"}


def fabric_args() -> list[Argument]:
    """Fabric's connection flags (fabric.main.Fab.core_args), declared here so that parsing
    them does not import Fabric; ``update_config`` applies them as Fabric does."""
    return [
        Argument(names=("H", "hosts"), help=HOSTS_HELP),
        Argument(names=("i", "identity"), kind=list,
                 help="SSH private key file; beats the inventory's key: (the first, if given "
                      "more than once)"),
        Argument(names=("list-agent-keys",), kind=bool,
                 help="show the ssh-agent's keys, and exit"),
        Argument(names=("prompt-for-login-password",), kind=bool,
                 help="ask for the SSH login password once, before connecting (reads a line "
                      "from stdin when it is not a terminal)"),
        Argument(names=("prompt-for-passphrase",), kind=bool,
                 help="ask for the passphrase of the SSH key once, before connecting"),
        Argument(names=("S", "ssh-config"), help="SSH config file to read instead of "
                                                 "~/.ssh/config"),
        Argument(names=("t", "connect-timeout"), kind=int,
                 help="seconds to wait for each host's SSH handshake (default "
                      "$GPU_PROVISION_CONNECT_TIMEOUT, else 15)"),
    ]


def _ask(prompt: str) -> str:
    """A secret from the terminal without echo, else one line of stdin (scripts, tests)."""
    if sys.stdin.isatty():
        return getpass.getpass(prompt)
    sys.stderr.write(prompt + "(reading stdin)\n")
    sys.stderr.flush()
    return sys.stdin.readline().rstrip("\n")


class GpuProvision(Program):
    def core_args(self) -> list[Argument]:
        kept = [a for a in super().core_args() if a.name not in DROPPED]
        workdir = Argument(names=("workdir",),
                           help="folder that holds logs/ and reports/ (default "
                                "$GPU_PROVISION_WORKDIR, else $GPU_PROVISION_HOME, else "
                                "~/.local/state/gpu-provision: $XDG_STATE_HOME/gpu-provision)")
        keep = Argument(names=("keep",), kind=int,
                        help="seconds a host's connection is kept open for the next command "
                             "(default $GPU_PROVISION_KEEP, else the inventory's keep:, else "
                             "600; 0 connects afresh every time)")
        no_keep = Argument(names=("no-keep",), kind=bool,
                           help="connect afresh, keep no connection open (--keep 0)")
        return [*kept, *fabric_args(), workdir, keep, no_keep]

    def print_version(self) -> None:
        print(f"{self.name} {__version__}")

    # Usage errors: one line, the nearest name where there is one, exit 2.

    def normalize_argv(self, argv: list[str] | None) -> None:
        super().normalize_argv(argv)
        from .argv import rewrite  # TASK -h, --json before the task, forward's ports
        tasks = self.namespace
        names = set(tasks.task_names) | {a for t in tasks.task_names.values() for a in t} \
            if tasks is not None else set()

        def value_flags(task: str) -> set[str]:
            args = tasks[task].get_arguments() if tasks is not None else []
            return {("--" if len(n) > 1 else "-") + n for a in args if a.kind is not bool
                    for n in a.names}

        self.argv = rewrite(self.argv, names, value_flags)

    def parse_core(self, argv: list[str] | None) -> None:
        with self._usage():
            super().parse_core(argv)
        if self.args["list-agent-keys"].value:
            from paramiko import Agent
            for key in Agent().get_keys():
                print(f"{key.get_bits()} {key.fingerprint} {key.comment} ({key.algorithm_name})")
            raise Exit

    def parse_tasks(self) -> None:
        with self._usage():
            super().parse_tasks()

    def parse_cleanup(self) -> None:
        with self._usage():
            super().parse_cleanup()

    def _usage(self) -> Any:
        return _UsageErrors(self)

    def update_config(self, merge: bool = True) -> None:
        """Fabric's config (and ssh_config) only when there are hosts to connect to."""
        workdir = self.args.workdir.value
        if workdir:
            if os.path.exists(workdir) and not os.path.isdir(workdir):
                raise Exit(f"error: --workdir {workdir}: not a folder", code=EXIT_USAGE)
            os.environ["GPU_PROVISION_WORKDIR"] = workdir  # read by store.Store.here()
        keep = 0 if self.args["no-keep"].value else self.args.keep.value
        if keep is not None:
            if not 0 <= keep <= 86400:
                raise Exit(f"error: --keep {keep}: give whole seconds, 0 to 86400", code=EXIT_USAGE)
            os.environ["GPU_PROVISION_KEEP"] = str(keep)  # read by remote.keep.keep_seconds
        if self.args.hosts.value:
            from fabric import Config as FabricConfig
            self.config_class = FabricConfig
            self.config = FabricConfig(lazy=True)
            self.config.load_base_conf_files()
        # Invoke's runtime config file (-f); its run-time flags are not ours (DROPPED)
        # Invoke annotates PathLike but takes the str its own flag gives
        runtime = self.args.config.value or os.environ.get("INVOKE_RUNTIME_CONFIG")
        self.config.set_runtime_path(runtime)  # type: ignore[arg-type]
        self.config.load_runtime(merge=False)
        if not self.args.hosts.value:
            self.config.merge()
            return
        # Fabric splits -H's user@host:port and nothing more: the ssh configuration is read as
        # OpenSSH reads it (config/openssh.py, from taskkit.target_of), ProxyJump included, so
        # Fabric loads none and gives no user or port of its own ("" and 0: not written)
        self.config.set_runtime_ssh_path(self.args["ssh-config"].value)
        self.config._overrides["user"] = ""
        self.config._overrides["port"] = 0
        connect_kwargs: dict[str, Any] = {}
        paths = self.args.identity.value
        if paths:
            connect_kwargs["key_filename"] = paths
            self.config._overrides["authentication"] = {"identities": list(paths)}
        if self.args["connect-timeout"].value:
            connect_kwargs["timeout"] = self.args["connect-timeout"].value
        if self.args["prompt-for-login-password"].value:
            connect_kwargs["password"] = _ask("SSH login password: ")
        if self.args["prompt-for-passphrase"].value:
            connect_kwargs["passphrase"] = _ask("passphrase of the SSH key: ")
        self.config._overrides["connect_kwargs"] = connect_kwargs
        self.config.merge()

    def no_tasks_given(self) -> None:
        take_command(self.core, [])  # `gpu-provision -H x -- cmd`: refused, not help
        super().no_tasks_given()

    def execute(self) -> None:
        take_command(self.core, [self.collection[t.name] for t in self.tasks])
        if self.args.hosts.value:
            from .fanout import ParallelExecutor
            executor: Executor = ParallelExecutor(self.collection, self.config, self.core)
        else:
            executor = Executor(self.collection, self.config, self.core)
        executor.execute(*self.tasks)


class _UsageErrors:
    """Turns Invoke's parse errors (and a value that is not a number) into one line, exit 2."""

    def __init__(self, program: GpuProvision):
        self.program = program

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, ParseError):
            raise Exit(f"error: {self.explain(exc)}", code=EXIT_USAGE) from None
        if isinstance(exc, ValueError) and "invalid literal for int()" in str(exc):
            value = str(exc).rsplit(": ", 1)[-1].strip("'")
            raise Exit(f"error: {_flag_of(self.program.argv, value)}: {value} is not a whole "
                       "number", code=EXIT_USAGE) from None

    def explain(self, exc: ParseError) -> str:
        text = str(exc)
        program = self.program
        unknown = re.fullmatch(r"No idea what '(.+)' is!", text)
        needs = re.search(r"Argument: (\S+?)[ >]", text)
        context = getattr(exc, "context", None)
        task = getattr(context, "name", None)
        if needs:
            flag = needs.group(1).split(" ")[0]
            return f"{task + ': ' if task else ''}--{flag} needs a value"
        if not unknown:
            return text
        token = unknown.group(1)
        if token.startswith("-"):
            refused = refusal(token)
            if refused:
                return refused
            flags = sorted(context.flags) if context is not None and task else \
                sorted(program.initial_context.flags)
            near = difflib.get_close_matches(token, flags, n=1)
            where = f"{task}: " if task else ""
            guess = f" (did you mean {near[0]}?)" if near else ""
            more = f"{program.binary} {task} --help" if task else f"{program.binary} --help"
            return f"{where}no option {token}{guess}; {more} lists them"
        names = sorted(set(program.collection.task_names) |
                       {a for t in program.collection.task_names.values() for a in t})
        near = difflib.get_close_matches(token, names, n=1)
        guess = f" (did you mean {near[0]}?)" if near else ""
        return f"no task named {token!r}{guess}; {program.binary} -l lists the tasks"


def _flag_of(argv: list[str], value: str) -> str:
    """The option a bad value was given to (``--x value`` or ``--x=value``)."""
    for i, token in enumerate(argv):
        if token.endswith(f"={value}"):
            return token.split("=", 1)[0]
        if token == value and i and argv[i - 1].startswith("-"):
            return argv[i - 1]
    return "an option"


namespace = Collection.from_module(tasks)

program = GpuProvision(name="gpu-provision", binary="gpu-provision", version=__version__,
                       namespace=namespace)


def main() -> None:
    try:
        program.run()
    except BrokenPipeError:  # `gpu-provision -l | head`: the reader has gone, and that is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
