"""The step runtime: run a script body on the host, detached from the SSH session, under a
named lock, journaled, re-attachable, its log streamed back as it grows.

A body is bash. It writes what it has to report (one JSON value) to ``$RESULT``; the runtime
prints it after the log on one line starting with ``MARKER``, and ``run_detached`` /
``run_foreground`` parse that line here, once. Everything else a body prints is its log.

On the host (the state folder, provision/remote/contract.py): ``locks/<lock>`` (+ ``.owner``),
``logs/<name>.log``, ``steps/<name>.{pid,rc,json,result}``. Tasks that must not wait for each
other use different lock names; the provisioning steps share ``HOST_LOCK``. ``run_follow``
streams a file that is not a step's log (a job's) the same way, from an offset, while its
process lives.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConnectionLost, Interrupted, ProvisionError, RemoteError
from .command import bash_script, mask
from .contract import CONTRACT, shown
from .executor import Executor
from .templating import render

HOST_LOCK = CONTRACT.locks.host  # the provisioning steps: one at a time per host
MARKER = CONTRACT.marker
HEARTBEAT = CONTRACT.heartbeat  # stderr, every 2 s while a body runs
NOTICE = CONTRACT.notice  # stderr: re-attaching, lock refused
LOCKED = CONTRACT.locked  # the step script's exit code when another run holds the lock
NO_ROOT = 77  # ... when a step that needs root meets a login that cannot become root
NO_ROOT_NOTICE = "gpu-provision-noroot: "  # stderr: who the login is and what sudo said
POLL = 0.25  # seconds between two looks at a growing log


@dataclass(frozen=True)
class StepRun:
    """What one run of a body reported, parsed once."""

    name: str
    log: str  # what the body printed, from the offset it was followed from
    exit_code: int
    result: Any  # the JSON value the body wrote to $RESULT (None when it wrote nothing)
    size: int  # bytes of the log read so far: where a later reader resumes
    seconds: float


class Watch:
    """What the user sees while a body runs: notices at once, and on each heartbeat the elapsed
    time with the log's last line when it changed (or every 10 s)."""

    def __init__(self, show: Callable[[str], None], name: str):
        self.show, self.name = show, name
        self.last, self.shown, self.at = "", "", 0.0

    def line(self, text: str) -> None:
        if text.strip():
            self.last = text

    def err(self, text: str) -> None:
        if text.startswith(HEARTBEAT):
            seconds = text.rsplit(" ", 1)[-1]
            if self.last != self.shown or time.monotonic() - self.at >= 10:
                self.shown, self.at = self.last, time.monotonic()
                self.show(f"{self.name} running {seconds}s: {self.last[:160]}")
        elif text.startswith(NOTICE):
            self.show(text.removeprefix(NOTICE))


class _LogOnly:
    """Hands on the log's lines and holds back what the runtime adds after them: the result line
    and the empty line that may separate it from a log that ended with a newline."""

    def __init__(self, emit: Callable[[str], None]):
        self.emit, self.held = emit, False

    def __call__(self, line: str) -> None:
        if line.startswith(f"{MARKER} "):
            self.held = False
            return
        if self.held:
            self.emit("")
        self.held = line == ""
        if not self.held:
            self.emit(line)


def owner() -> str:
    """Who holds a lock: shown to the run that is refused."""
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"


def split_result(stdout: str) -> tuple[str, dict[str, Any] | None]:
    """(the log, the result line's object) of a runtime script's stdout."""
    head, sep, tail = stdout.rpartition(f"\n{MARKER} ")
    if not sep:
        return stdout, None
    try:
        return head, json.loads(tail.strip())
    except ValueError:
        return head, None


def _finish(ex: Executor, name: str, r_stdout: str, r_stderr: str, exit_code: int,
            seconds: float, again: str, host_log: bool = True) -> StepRun:
    """The step's outcome from its output; ``host_log`` False: a foreground body, which writes
    no log on the host, so no error points there."""
    stderr = "\n".join(ln for ln in r_stderr.splitlines() if not ln.startswith(HEARTBEAT))
    if exit_code == LOCKED:
        raise ProvisionError(f"{ex.host}: {stderr.strip() or 'another run holds the lock'}"
                             f" - wait for it to finish, then run {again} again")
    if exit_code == NO_ROOT:
        said = next((ln.removeprefix(NO_ROOT_NOTICE) for ln in stderr.splitlines()
                     if ln.startswith(NO_ROOT_NOTICE)), "the login cannot become root")
        raise ProvisionError(f"{ex.host}: step {name!r} needs root and the {said}: nothing was "
                             "changed; log in as root or as a user with passwordless sudo "
                             "(NOPASSWD in /etc/sudoers.d), or have an admin run it")
    log, line = split_result(r_stdout)
    if exit_code != 0:
        # the caller that reports it adds the known failure (doctor.explain): this layer only
        # says what failed and where its log is
        places = ([f"{ex.log_dir}/{name}.log"] if ex.log_dir else []) + \
            ([f"on the host in {shown('logs', f'{name}.log')}"] if host_log else [])
        raise RemoteError(ex.host, name, exit_code, mask(log + stderr, ex.secrets),
                          logs=tuple(places), diagnosable=True)
    if line is None:
        see = f"; see {shown('logs', f'{name}.log')} on the host" if host_log else ""
        raise ProvisionError(f"{ex.host}: step {name!r} ended without its result line{see}")
    return StepRun(name=name, log=log, exit_code=exit_code, result=line.get("result"),
                   size=int(line.get("size") or 0), seconds=seconds)


def detached_script(name: str, body: str, *, inputs: str = "", lock: str = HOST_LOCK,
                    run: str = "", offset: int = 0, needs_root: bool = False) -> str:
    """The one remote execution ``run_detached`` runs (templates/remote/step.sh.j2).
    ``needs_root``: the body runs as root (``sudo -n`` for a login that is not root; the lock,
    log, journal and result stay the login's own files under its ~/.gpu-provision)."""
    return render("remote/step.sh.j2", name=name, inputs=inputs, lock=lock, run=run, owner=owner(),
                  body=body, offset=offset, poll=POLL, heartbeat=HEARTBEAT, marker=MARKER,
                  locked=LOCKED, needs_root=needs_root, noroot=NO_ROOT,
                  noroot_notice=NO_ROOT_NOTICE)


def foreground_script(name: str, body: str, needs_root: bool = False) -> str:
    """The one remote execution ``run_foreground`` runs (templates/remote/foreground.sh.j2)."""
    return render("remote/foreground.sh.j2", name=name, body=body, marker=MARKER,
                  needs_root=needs_root, noroot=NO_ROOT, noroot_notice=NO_ROOT_NOTICE)


def root_script(script: str) -> str:
    """``script`` run as root, as a step that needs root runs (for the reboot the engine asks
    for after a step): exits NO_ROOT, saying why, where the login cannot become root."""
    return render("remote/as_root.sh.j2", script=script, noroot=NO_ROOT,
                  noroot_notice=NO_ROOT_NOTICE)


def run_detached(ex: Executor, name: str, body: str, *, inputs: str = "",
                 lock: str = HOST_LOCK, run: str = "", offset: int = 0,
                 on_line: Callable[[str], None] | None = None,
                 on_err: Callable[[str], None] | None = None, again: str = "the task",
                 needs_root: bool = False) -> StepRun:
    """Run ``body`` on the host as step ``name`` (one remote execution): detached (it goes on
    when the connection drops), under ``lock``, journaled with ``inputs``; re-attach to it when
    it still runs with the same inputs. Its log streams back from byte ``offset``: each line to
    ``on_line``, notices and heartbeats to ``on_err``. ``again`` names what the user runs to
    re-attach. Raises RemoteError (the output, and where the log is) when the body fails."""
    script = detached_script(name, body, inputs=inputs, lock=lock, run=run, offset=offset,
                             needs_root=needs_root)
    started = time.monotonic()
    try:
        r = ex.run(bash_script(script), step=name, check=False,
                   on_out=_LogOnly(on_line or (lambda _: None)), on_err=on_err or (lambda _: None))
    except ConnectionLost:
        raise ProvisionError(f"{ex.host}: the connection was lost during step {name!r} (the "
                             "network dropped, or the host rebooted). If the host is up the step "
                             f"goes on there; run {again} again: it re-attaches, or redoes the "
                             "step if the host killed it") from None
    except KeyboardInterrupt:
        raise Interrupted(f"{ex.host}: interrupted while waiting for step {name!r}; it goes "
                          f"on, detached, on the host (log {shown('logs', f'{name}.log')}). "
                          f"Run {again} again to re-attach and finish (the lock refuses any "
                          "other run meanwhile)") from None
    return _finish(ex, name, r.stdout, r.stderr, r.exit_code, time.monotonic() - started, again)


def follow_script(name: str, where: str, offset: int = 0, lines: int = 0) -> str:
    """The one remote execution ``run_follow`` runs (templates/jobs/follow.sh.j2)."""
    return render("jobs/follow.sh.j2", name=name, where=where, offset=offset, lines=lines, poll=POLL,
                  heartbeat=HEARTBEAT, marker=MARKER)


def run_follow(ex: Executor, name: str, where: str, *, offset: int = 0, lines: int = 0,
               on_line: Callable[[str], None] | None = None,
               on_err: Callable[[str], None] | None = None, again: str = "the task") -> StepRun:
    """Stream a file on the host that a process other than a step writes (a job's log): from
    byte ``offset`` plus ``lines`` whole lines, while the process lives, then what is left.
    ``where`` is rendered bash that sets ``log`` (the file), ``pid`` (the process; empty: read
    what is there and end) and ``resf`` (a file holding the JSON result, or none). One remote
    execution; the result's ``size`` is the byte a later reader resumes from."""
    script = follow_script(name, where, offset, lines)
    started = time.monotonic()
    r = ex.run(bash_script(script), step=name, check=False,
               on_out=on_line or (lambda _: None), on_err=on_err or (lambda _: None))
    return _finish(ex, name, r.stdout, r.stderr, r.exit_code, time.monotonic() - started, again)


def run_foreground(ex: Executor, name: str, body: str, stdin: str | None = None,
                   again: str = "the task", needs_root: bool = False) -> StepRun:
    """Run a quick ``body`` in the foreground (no lock, no journal of its own): for input that
    must never be written to a log on the host (``stdin``), and for small reads and writes."""
    script = foreground_script(name, body, needs_root)
    started = time.monotonic()
    r = ex.run(bash_script(script), step=name, check=False, stdin=stdin)
    return _finish(ex, name, r.stdout, r.stderr, r.exit_code, time.monotonic() - started, again,
                   host_log=False)
