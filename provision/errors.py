"""One error hierarchy whose messages carry the evidence and, where known, the fix."""

from __future__ import annotations


class ProvisionError(Exception):
    """Base of every error the tool reports to a user (printed as one line, no traceback)."""

    exit_code = 1


class UsageError(ProvisionError):
    """The command line cannot work: an unknown task or option, a bad value, a missing ``-H``."""

    exit_code = 2


class ConfigError(ProvisionError):
    """A YAML file (inventory, recipe, platform, compat data) is missing, malformed or invalid.

    The message names the file, the key and, where YAML gives one, the line.
    """

    def __init__(self, path: str, message: str, key: str | None = None, line: int | None = None):
        self.path, self.key, self.line, self.problem = path, key, line, message
        where = path + (f":{line}" if line else "")
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


class NoWheelError(ProvisionError):
    """No (torch release, CUDA variant) fits the host; the message names the nearest fixes."""

    exit_code = 2


class SSHError(ProvisionError):
    """An SSH failure, classified; ``kind`` is one of the names in ``provision.remote.connection``."""

    def __init__(self, host: str, kind: str, message: str):
        self.host, self.kind = host, kind
        super().__init__(f"{host}: {kind}: {message}")


class RemoteError(ProvisionError):
    """A remote step failed: host, step, exit code and the last lines of its output."""

    def __init__(self, host: str, step: str, exit_code: int, output: str, fix: str | None = None):
        self.host, self.step, self.remote_exit, self.output = host, step, exit_code, output
        tail = "\n".join(output.strip().splitlines()[-10:])
        msg = f"{host}: step {step!r} failed with exit code {exit_code}"
        if tail:
            msg += f"; last output:\n{tail}"
        if fix:
            msg += f"\nfix: {fix}"
        super().__init__(msg)


class Interrupted(ProvisionError):
    """Ctrl-C here while a step runs detached on the host: what goes on and what to run."""

    exit_code = 130
