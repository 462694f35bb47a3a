"""The one place that runs anything on a host: every remote execution goes through ``run``."""

from __future__ import annotations

import io
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabric import Connection

from .command import Command, mask
from .errors import RemoteError


@dataclass(frozen=True)
class Result:
    step: str
    command: str  # as displayed (secrets masked)
    stdout: str
    stderr: str
    exit_code: int
    seconds: float


class _Lines:
    """A write()-able stream that hands complete lines to a callback (or drops them)."""

    def __init__(self, emit: Callable[[str], None] | None):
        self.emit, self.buf = emit, ""

    def write(self, chunk: str) -> int:
        self.buf += chunk
        *lines, self.buf = self.buf.split("\n")
        for line in lines:
            if self.emit is not None:
                self.emit(line)
        return len(chunk)

    def flush(self) -> None:
        pass


@contextmanager
def _interruptible(conn: Connection) -> Iterator[list[bool]]:
    """Ctrl-C closes the connection, so the run returns at once instead of reading the remote
    output to its end; the caller then sees KeyboardInterrupt. (What runs detached on the host
    goes on.) Only the main thread can take signals; elsewhere Ctrl-C is left as it is."""
    interrupted: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return

    def on_sigint(signum: int, frame: object) -> None:
        interrupted.append(True)
        conn.close()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


class Executor:
    """Runs Commands over one open connection; counts executions and keeps a log per step."""

    def __init__(self, conn: Connection, host: str, log_dir: Path | None = None,
                 secrets: tuple[str, ...] = ()):
        self.conn, self.host, self.log_dir, self.secrets = conn, host, log_dir, secrets
        self.executions = 0

    def run(self, command: Command, step: str, check: bool = True, timeout: int | None = None,
            progress: Callable[[str], None] | None = None, stdin: str | None = None) -> Result:
        """Run one command remotely (one SSH exec channel). Raises RemoteError when ``check``
        and it exits non-zero. ``progress`` receives each output line (secrets masked) as it
        arrives; ``stdin`` is sent to the command and never logged."""
        started = time.monotonic()
        self.executions += 1
        secrets = (*self.secrets, *command.secrets)
        streams: dict[str, Any] = {"hide": True}
        if progress is not None:  # shown as it comes; still collected in the result
            shown = progress
            streams = {"hide": False, "out_stream": _Lines(lambda line: shown(mask(line, secrets))),
                       "err_stream": _Lines(None)}
        with _interruptible(self.conn) as interrupted:
            try:
                r = self.conn.run(command.render(), warn=True, timeout=timeout,
                                  in_stream=io.StringIO(stdin) if stdin is not None else False,
                                  **streams)
            except Exception:
                if not interrupted:
                    raise
        if interrupted:
            raise KeyboardInterrupt
        result = Result(step=step, command=command.display(), stdout=r.stdout, stderr=r.stderr,
                        exit_code=r.exited, seconds=time.monotonic() - started)
        self._log(result, secrets)
        if check and r.exited != 0:
            raise RemoteError(self.host, step, r.exited, mask(r.stdout + r.stderr, secrets))
        return result

    def _log(self, result: Result, secrets: tuple[str, ...]) -> None:
        if self.log_dir is None:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{result.step}.log").open("a", encoding="utf-8") as f:
            f.write(f"$ {result.command[:2000]}\n# exit {result.exit_code} in "
                    f"{result.seconds:.2f}s\n{mask(result.stdout, secrets)}"
                    f"{mask(result.stderr, secrets)}\n")
