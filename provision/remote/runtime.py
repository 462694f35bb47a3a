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
NOTICE = CONTRACT.notice  # stderr: re-attaching, shown as it comes
REFUSED = CONTRACT.refused  # stderr: why a step did not run or end; its error says it, once
LOCKED = CONTRACT.locked  # the step script's exit code when another run holds the lock
CANCELLED = CONTRACT.cancelled  # ... when `cancel` (or a second Ctrl-C) stopped it on the host
GRACE = 3.0  # seconds after a first Ctrl-C in which a second one stops the step on the host
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


ALERT = "gpu-provision-alert: "  # on_err, from here: what Ctrl-C did (the alert printer shows it)


class Watch:
    """What the user sees while a body runs: notices at once, and on each heartbeat the elapsed
    time with the log's last line when it changed (or every 10 s); ``alert`` (default: show)
    prints what the user must read now, where errors go (Ctrl-C's way out)."""

    def __init__(self, show: Callable[[str], None], name: str,
                 alert: Callable[[str], None] | None = None):
        self.show, self.name, self.alert = show, name, alert or show
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
        elif text.startswith(ALERT):
            self.alert(text.removeprefix(ALERT))


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


def _said(stderr: str, prefix: str) -> str:
    """The first line the step script wrote on ``prefix``, without it."""
    return next((ln.removeprefix(prefix) for ln in stderr.splitlines()
                 if ln.startswith(prefix)), "")


def _finish(ex: Executor, name: str, r_stdout: str, r_stderr: str, exit_code: int,
            seconds: float, again: str, host_log: bool = True) -> StepRun:
    """The step's outcome from its output; ``host_log`` False: a foreground body, which writes
    no log on the host, so no error points there."""
    stderr = "\n".join(ln for ln in r_stderr.splitlines() if not ln.startswith(HEARTBEAT))
    refused = _said(stderr, REFUSED)
    if exit_code == LOCKED:
        raise ProvisionError(f"{ex.host}: {refused or 'another run holds the lock'} - wait for "
                             f"it to finish (or stop it: gpu-provision -H {ex.host} cancel), "
                             f"then run {again} again")
    if exit_code == CANCELLED and refused:
        raise Interrupted(f"{ex.host}: step {name!r} was {refused}; the next {again} redoes it")
    stderr = "\n".join(ln for ln in stderr.splitlines() if not ln.startswith(REFUSED))
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
                  noroot_notice=NO_ROOT_NOTICE, notice=NOTICE, refused=REFUSED,
                  cancelled=CANCELLED)


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
        raise interrupted(ex, name, again, on_err, stoppable=not needs_root) from None
    return _finish(ex, name, r.stdout, r.stderr, r.exit_code, time.monotonic() - started, again)


def interrupted(ex: Executor, name: str, again: str, show: Callable[[str], None] | None,
                stoppable: bool = True) -> Interrupted:
    """Ctrl-C while following step ``name``: say at once that it goes on on the host and how to
    stop it; a second Ctrl-C within GRACE seconds stops it there (``cancel``). The error to
    raise: already shown (exit 130 alone) unless the second Ctrl-C came."""
    log = shown("logs", f"{name}.log")
    stop = f"gpu-provision -H {ex.host} cancel"
    if not stoppable:  # as root (the driver): never killed midway, see cancel.sh.j2
        return Interrupted(f"{ex.host}: interrupted while waiting for step {name!r}; it goes on, "
                           f"detached, on the host (log {log}): a package manager is not "
                           f"stopped midway. Run {again} again to re-attach and finish")
    said = (f"interrupted while waiting for step {name!r}; it goes on, detached, on the host "
            f"(log {log}). Ctrl-C again within {GRACE:g}s stops it there, later `{stop}` "
            f"does; run {again} again to re-attach and finish")
    if show is None:
        return Interrupted(f"{ex.host}: {said}")
    show(ALERT + said)
    try:
        time.sleep(GRACE)
    except KeyboardInterrupt:
        stopped = cancel(ex, name)
        return Interrupted(f"{ex.host}: {stopped_text(stopped, name, again)} (the second Ctrl-C)")
    return Interrupted(f"{ex.host}: {said}", shown=True)


def cancel_script(step: str = "") -> str:
    """The one remote execution ``cancel`` runs (templates/remote/cancel.sh.j2)."""
    return render("remote/cancel.sh.j2", step=step, who=owner())


def cancel(ex: Executor, step: str = "") -> list[dict[str, Any]]:
    """Stop ``step`` (every step of ours, when "") running on the host: its session and process
    group end, the lock with them; one dict per running step (``stopped``, ``processes``,
    ``left``, ``lock``; ``why`` when it was left running). Nothing running: []."""
    def parse(out: str) -> list[dict[str, Any]]:
        return [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    return ex.query("cancel", cancel_script(step), parse, what="the cancel",
                    reads_only=False)


def stopped_text(stopped: list[dict[str, Any]], name: str = "", again: str = "bootstrap") -> str:
    """One line for what ``cancel`` did."""
    if not stopped:
        return f"step {name!r} is not running on the host" if name else \
            "no step of ours is running on the host"
    parts = []
    for s in stopped:
        if not s.get("stopped"):
            parts.append(f"step {s['step']!r} goes on: it {s.get('why', 'cannot be stopped')}, "
                         "and a package manager is not stopped midway")
            continue
        left = f"; {s['left']} would not end" if s.get("left") else ""
        lock = "the lock is free" if s.get("lock") == "free" else "the lock is still held"
        parts.append(f"stopped step {s['step']!r} on the host (pid {s['pid']}, its session of "
                     f"{s['processes']} process(es) ended{left}; {lock}); the next {again} "
                     "redoes it")
    return "; ".join(parts)


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
                   again: str = "the task", needs_root: bool = False,
                   reads_only: bool = False) -> StepRun:
    """Run a quick ``body`` in the foreground (no lock, no journal of its own): for input that
    must never be written to a log on the host (``stdin``), and for small reads and writes."""
    script = foreground_script(name, body, needs_root)
    started = time.monotonic()
    r = ex.run(bash_script(script), step=name, check=False, stdin=stdin, reads_only=reads_only)
    return _finish(ex, name, r.stdout, r.stderr, r.exit_code, time.monotonic() - started, again,
                   host_log=False)
