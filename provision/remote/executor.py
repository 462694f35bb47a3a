"""The one place that touches a host: every remote execution goes through ``run``, every file
through ``put`` and ``get``."""

from __future__ import annotations

import contextlib
import hashlib
import io
import posixpath
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import paramiko
from fabric import Connection

from ..errors import ConnectionLost, RemoteError
from . import relay
from .command import Command, bash_script, mask

# Invoke reports a channel that closed without an exit status as exit -1: the connection was
# lost. ``run`` turns it into ConnectionLost, so no caller checks for it.
_NO_EXIT_STATUS = -1
CHUNK = 1 << 18  # bytes per SFTP read/write: large enough to keep a long link busy
Progress = Callable[[int, int], None]  # (bytes done, bytes in all)
T = TypeVar("T")


@dataclass(frozen=True)
class Result:
    step: str
    command: str  # as displayed (secrets masked)
    stdout: str
    stderr: str
    exit_code: int
    seconds: float


@dataclass(frozen=True)
class Transferred:
    """One file moved by ``put`` or ``get``."""

    path: str  # where it landed
    size: int
    sha256: str
    resumed_from: int  # bytes that were already there from an earlier, cut transfer
    seconds: float


def remote_part(target: str) -> str:
    """Where an upload to ``target`` lands until it is checked: ``.NAME.part`` beside it."""
    return posixpath.join(posixpath.dirname(target), f".{posixpath.basename(target)}.part")


def local_part(local: Path) -> Path:
    """Where a download to ``local`` lands until it is checked: ``.NAME.part`` beside it."""
    return local.with_name(f".{local.name}.part")


class _Whole(io.StringIO):
    """stdin for a remote command, handed over in one piece: Invoke reads a stream that is not a
    terminal one character per 10 ms (``bytes_to_read`` is 1, ``input_sleep`` 0.01 s), which
    makes a few kilobytes of input take seconds."""

    def read(self, size: int | None = -1) -> str:
        return super().read()


class _Lines:
    """A write()-able stream that hands complete lines to a callback."""

    def __init__(self, emit: Callable[[str], None]):
        self.emit, self.buf = emit, ""

    def write(self, chunk: str) -> int:
        self.buf += chunk
        *lines, self.buf = self.buf.split("\n")
        for line in lines:
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


def file_sha256(path: Path) -> str:
    """A local file's sha256, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class Executor:
    """Runs Commands and moves files over one open connection; counts remote executions and
    keeps a log per step."""

    def __init__(self, conn: Connection, host: str, log_dir: Path | None = None,
                 secrets: tuple[str, ...] = ()):
        self.conn, self.host, self.log_dir, self.secrets = conn, host, log_dir, secrets
        self.executions = 0

    def lost(self, what: str, exc: BaseException | None = None) -> ConnectionLost:
        """The connection dropped after it was up: one line, and what to do."""
        why = f" ({type(exc).__name__}: {exc})" if exc is not None and str(exc) else ""
        return ConnectionLost(self.host, what, why)

    def run(self, command: Command, step: str, check: bool = True, timeout: int | None = None,
            on_out: Callable[[str], None] | None = None,
            on_err: Callable[[str], None] | None = None, stdin: str | None = None,
            what: str | None = None, reads_only: bool = False) -> Result:
        """Run one command remotely (one SSH exec channel). Raises RemoteError when ``check``
        and it exits non-zero, and ConnectionLost (naming ``what``, by default the step) whenever
        the connection is lost, ``check`` or not. ``on_out``/``on_err``
        receive each output line (secrets masked) as it arrives; the result still holds all of
        it. ``stdin`` is sent to the command and never logged. ``reads_only``: the command
        changes nothing on the host, so a kept connection may run it again on a fresh link
        where it cannot tell whether it ran (relay.repeatable); else it is never sent twice."""
        started = time.monotonic()
        self.executions += 1
        secrets = (*self.secrets, *command.secrets)
        streams: dict[str, Any] = {"hide": True}
        if on_out is not None or on_err is not None:
            def shown(emit: Callable[[str], None] | None) -> _Lines:
                return _Lines((lambda line: emit(mask(line, secrets))) if emit else (lambda _: None))
            streams = {"hide": False, "out_stream": shown(on_out), "err_stream": shown(on_err)}
        with _interruptible(self.conn) as interrupted, \
                relay.repeatable() if reads_only else contextlib.nullcontext():
            try:
                r = self.conn.run(command.render(), warn=True, timeout=timeout,
                                  in_stream=_Whole(stdin) if stdin is not None else False,
                                  **streams)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if not interrupted:
                    raise self.lost(what or f"{step!r}", exc) from None
            except Exception:
                if not interrupted:
                    raise
        if interrupted:
            raise KeyboardInterrupt
        result = Result(step=step, command=command.display(), stdout=r.stdout, stderr=r.stderr,
                        exit_code=r.exited, seconds=time.monotonic() - started)
        self._log(result, secrets)
        if r.exited == _NO_EXIT_STATUS:
            raise self.lost(what or f"{step!r}")
        if check and r.exited != 0:
            raise RemoteError(self.host, step, r.exited, mask(r.stdout + r.stderr, secrets))
        return result

    def query(self, name: str, script: str, parse: Callable[[str], T], *, what: str,
              fix: str | None = None, stdin: str | None = None, any_exit: bool = False,
              reads_only: bool) -> T:
        """Everything that is not a step reads from the host this way: ONE execution of the bash
        ``script``, its stdout handed to ``parse``. A non-zero exit (unless ``any_exit``: the
        script reports its own state in what it prints) or an answer ``parse`` cannot read
        (ValueError, KeyError, IndexError) raises RemoteError with ``fix``; a lost connection
        raises ConnectionLost naming ``what``. ``reads_only``: the script changes nothing
        (said by each caller: a script that changes the host is never sent twice), as run's."""
        r = self.run(bash_script(script), step=name, check=False, stdin=stdin, what=what,
                     reads_only=reads_only)
        shown = (r.stdout + r.stderr).replace("\0", "\n")
        if r.exit_code != 0 and not any_exit:
            raise RemoteError(self.host, name, r.exit_code, shown, fix=fix)
        try:
            return parse(r.stdout)
        except (ValueError, KeyError, IndexError) as exc:
            raise RemoteError(self.host, name, r.exit_code, shown,
                              fix=fix or f"the host's answer could not be read ({exc})") from None

    def _log(self, result: Result, secrets: tuple[str, ...]) -> None:
        if self.log_dir is None:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{result.step}.log").open("a", encoding="utf-8") as f:
            f.write(f"$ {result.command[:2000]}\n# exit {result.exit_code} in "
                    f"{result.seconds:.2f}s\n{mask(result.stdout, secrets)}"
                    f"{mask(result.stderr, secrets)}\n")

    # Files: SFTP over the same pinned connection. Each lands under a temporary name beside its
    # target, is checked by sha256 and only then renamed into place, so a reader never sees half
    # a file; a cut transfer resumes from the bytes already there.

    def _sftp(self, what: str) -> paramiko.SFTPClient:
        try:
            return self.conn.sftp()  # type: ignore[no-any-return]
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise self.lost(what, exc) from None

    def remote_path(self, path: str) -> str:
        """``~`` and relative paths are the remote user's home, as in scp."""
        if path == "~" or path.startswith("~/"):
            path = path[2:]
        if posixpath.isabs(path):
            return path
        home = self._sftp(f"a transfer to {path}").normalize(".")
        return posixpath.join(home, path) if path else home

    def remote_sha256(self, path: str, step: str = "transfer") -> str:
        r = self.run(Command(("sha256sum", "--", path)), step=step, check=False, reads_only=True)
        if r.exit_code != 0 or not r.stdout.strip():
            raise RemoteError(self.host, step, r.exit_code, r.stdout + r.stderr,
                              fix="the host needs sha256sum (coreutils)")
        return r.stdout.split()[0]

    def put(self, local: Path, remote: str, progress: Progress | None = None,
            step: str = "transfer") -> Transferred:
        """Upload ``local`` to ``remote`` (a file path on the host): resumed, checked, atomic."""
        started = time.monotonic()
        target = self.remote_path(remote)
        part = remote_part(target)
        size, digest = local.stat().st_size, file_sha256(local)
        sftp = self._sftp(f"the upload of {local}")
        resumed = self.put_part(local, target, progress, step)
        try:
            got = self.remote_sha256(part, step)
            if got != digest and resumed:  # the bytes that were there did not belong to this file
                resumed = self.put_part(local, target, progress, step, resume=False)
                got = self.remote_sha256(part, step)
            if got != digest:
                raise RemoteError(self.host, step, 1, f"{target}: sha256 {got} after upload, "
                                  f"{digest} here", fix="the disk on the host may be full "
                                  "or failing; run it again")
            sftp.posix_rename(part, target)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise self._transfer_error(exc, target, f"the upload of {local}", step) from None
        return Transferred(target, size, digest, resumed, time.monotonic() - started)

    def put_part(self, local: Path, target: str, progress: Progress | None = None,
                 step: str = "transfer", resume: bool = True) -> int:
        """Upload ``local`` to the temporary name beside ``target`` (an absolute path on the
        host; see ``remote_part``), continuing from the bytes an earlier, cut upload left there.
        Returns those bytes. The caller checks the part and renames it into place (``put`` does
        both for one file; a folder sync checks all its parts in one remote execution)."""
        part = remote_part(target)
        size = local.stat().st_size
        sftp = self._sftp(f"the upload of {local}")
        try:
            try:
                have = (sftp.stat(part).st_size or 0) if resume else 0
            except FileNotFoundError:
                have = 0
            offset = have if 0 < have <= size else 0
            self._send(sftp, local, part, offset, size, progress)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise self._transfer_error(exc, target, f"the upload of {local}", step) from None
        return offset

    def _transfer_error(self, exc: BaseException, path: str, what: str,
                        step: str) -> BaseException:
        if isinstance(exc, (FileNotFoundError, PermissionError)):
            return RemoteError(self.host, step, 1, f"{path}: {exc}",
                               fix="check that the folder exists and is writable")
        return self.lost(what, exc)

    def _send(self, sftp: paramiko.SFTPClient, local: Path, part: str, offset: int, size: int,
              progress: Progress | None) -> None:
        with local.open("rb") as src, sftp.open(part, "r+b" if offset else "wb") as dst:
            dst.set_pipelined(True)
            src.seek(offset)
            dst.seek(offset)
            done = offset
            while chunk := src.read(CHUNK):
                dst.write(chunk)
                done += len(chunk)
                if progress:
                    progress(done, size)

    def get(self, remote: str, local: Path, progress: Progress | None = None,
            step: str = "transfer") -> Transferred:
        """Download ``remote`` to ``local``: resumed, checked, atomic (see ``put``)."""
        started = time.monotonic()
        source = self.remote_path(remote)
        part = local_part(local)
        sftp = self._sftp(f"the download of {source}")
        try:
            attrs = sftp.stat(source)
        except FileNotFoundError:
            raise RemoteError(self.host, step, 1, f"{source}: no such file on the host") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise self.lost(f"the download of {source}", exc) from None
        if attrs.st_mode is not None and stat.S_ISDIR(attrs.st_mode):
            raise RemoteError(self.host, step, 1, f"{source} is a folder, not a file")
        size = attrs.st_size or 0
        digest = self.remote_sha256(source, step)
        resumed = self.get_part(source, local, size, progress, step)
        if file_sha256(part) != digest and resumed:
            resumed = self.get_part(source, local, size, progress, step, resume=False)
        if file_sha256(part) != digest:
            raise RemoteError(self.host, step, 1, f"{source}: sha256 here differs from "
                              f"the host's {digest}", fix="the file may have changed "
                              "while it was read; run it again")
        part.replace(local)
        return Transferred(str(local), size, digest, resumed, time.monotonic() - started)

    def get_part(self, source: str, local: Path, size: int, progress: Progress | None = None,
                 step: str = "transfer", resume: bool = True) -> int:
        """Download ``source`` (an absolute path on the host, ``size`` bytes) to the temporary
        name beside ``local`` (see ``local_part``), continuing from the bytes an earlier, cut
        download left there. Returns those bytes; the caller checks and renames."""
        part = local_part(local)
        have = part.stat().st_size if resume and part.exists() else 0
        offset = have if 0 < have <= size else 0
        sftp = self._sftp(f"the download of {source}")
        try:
            self._receive(sftp, source, part, offset, size, progress)
        except FileNotFoundError:
            raise RemoteError(self.host, step, 1, f"{source}: no such file on the host") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise self.lost(f"the download of {source}", exc) from None
        return offset

    def _receive(self, sftp: paramiko.SFTPClient, source: str, part: Path, offset: int,
                 size: int, progress: Progress | None) -> None:
        part.parent.mkdir(parents=True, exist_ok=True)
        with sftp.open(source, "rb") as src, part.open("r+b" if offset else "wb") as dst:
            src.seek(offset)
            dst.seek(offset)
            src.prefetch(size)  # read-ahead from the offset to the end
            done = offset
            while chunk := src.read(CHUNK):
                dst.write(chunk)
                done += len(chunk)
                if progress:
                    progress(done, size)
