"""One error hierarchy whose messages carry the evidence and, where known, the fix."""

from __future__ import annotations


class ProvisionError(Exception):
    """Base of every error the tool reports to a user (printed as one line, no traceback)."""

    exit_code = 1


class UsageError(ProvisionError):
    """The command line cannot work: an unknown task or option, a bad value, a missing ``-H``."""

    exit_code = 2


class Blocked(ProvisionError):
    """The plan cannot be carried out on this host as asked (no wheel fits, the disk cannot hold
    it, a job runs on what would change): nothing was changed, and the message says what would
    let it go ahead. The exit code is a usage error's, as ``pick``'s "nothing fits"."""

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
    """A remote step failed: host, step, exit code and the last lines of its output.

    ``logs``: where its full log is (here and on the host). ``hint``: the known failure its
    output shows, added by the caller that diagnoses it (``doctor.explain``): the engine's
    lower layers only report. ``diagnosable``: a step's own output, worth matching."""

    def __init__(self, host: str, step: str, exit_code: int, output: str, fix: str | None = None,
                 *, logs: tuple[str, ...] = (), hint: str | None = None, diagnosable: bool = False):
        self.host, self.step, self.remote_exit, self.output = host, step, exit_code, output
        self.fix, self.logs, self.hint, self.diagnosable = fix, logs, hint, diagnosable
        tail = "\n".join(output.strip().splitlines()[-10:])
        msg = f"{host}: step {step!r} failed with exit code {exit_code}"
        if tail:
            msg += f"; last output:\n{tail}"
        parts = [x for x in (hint, fix) if x]
        if logs:
            parts.append(f"the full log is in {' and '.join(logs)}")
        if parts:
            msg += "\nfix: " + "\n".join(parts)
        super().__init__(msg)

    def explained(self, hint: str) -> RemoteError:
        """The same failure with the known cause and fix in front of the log's place."""
        return RemoteError(self.host, self.step, self.remote_exit, self.output, self.fix,
                           logs=self.logs, hint=hint, diagnosable=False)


class ConnectionLost(SSHError):
    """The connection dropped after it was up (the network, or a reboot): raised by the
    executor for every remote execution, so no caller checks an exit status for it."""

    def __init__(self, host: str, what: str, why: str = ""):
        self.what = what
        super().__init__(host, "connection lost", f"the connection dropped during {what}{why}; "
                         "check the network (or whether the host rebooted) and run the task again")


class Interrupted(ProvisionError):
    """Ctrl-C here while a step runs detached on the host: what goes on and what to run.
    ``shown``: the message was printed when Ctrl-C came; only the exit code is left."""

    exit_code = 130

    def __init__(self, message: str, shown: bool = False):
        super().__init__(message)
        self.shown = shown
