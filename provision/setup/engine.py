"""Apply a plan: run each step that has work, in order, through the step runtime.

A re-run on a provisioned host is one execution (facts) when nothing validation checks has
changed since it last passed, else two (facts, then validation). The engine follows the steps'
typed fields only (provision/ops/step.py): ``foreground``, ``read``, ``settle`` (re-read the
facts, after a reboot when the step's outcome asks for one), ``then``, ``kept``, ``uploads``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from ..errors import Blocked, ConnectionLost, ProvisionError, SSHError
from ..ops.step import Outcome, Step
from ..remote.command import bash_script
from ..remote.connection import AUTH_REFUSED, HOST_KEY_CHANGED
from ..remote.executor import Executor
from ..remote.runtime import (
    NO_ROOT,
    NO_ROOT_NOTICE,
    Watch,
    root_script,
    run_detached,
    run_foreground,
)
from ..store import Store, run_id
from ..ui import console as output
from .plan import Plan


def reboot_timeout() -> int:
    return int(os.environ.get("GPU_PROVISION_REBOOT_TIMEOUT", "900"))


@dataclass(frozen=True)
class StepRecord:
    name: str
    result: str  # ok | skipped
    seconds: float

    @property
    def changed(self) -> bool:
        return self.result == "ok"

    def as_json(self) -> dict[str, Any]:
        return {"step": self.name, "result": self.result, "changed": self.changed,
                "seconds": round(self.seconds, 2)}


@dataclass
class Applied:
    """What applying a plan did on one host."""

    host: str
    steps: list[StepRecord] = field(default_factory=list)
    verdict: str | None = None
    report: dict[str, Any] | None = None
    report_path: Path | None = None
    outcomes: dict[str, Outcome] = field(default_factory=dict)  # step name -> what it reported
    executions: int = 0  # remote executions on every connection the run used

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host, "steps": [s.as_json() for s in self.steps],
                "verdict": self.verdict, "report": str(self.report_path) if self.report_path
                else None, "executions": self.executions}


class Reconnect:
    """How the engine reaches the host again after a step that changes it under the plan."""

    def __init__(self, connect: Callable[[], Executor], replan: Callable[[Executor], Plan]):
        self.connect, self.replan = connect, replan


def reboot_and_wait(ex: Executor, old_boot_id: str, again: Reconnect,
                    console: Console) -> tuple[Executor, Plan, int]:
    """Reboot, wait for SSH with backoff, and require a NEW boot id (the facts say so).
    Returns the new connection, the plan from its facts, and the remote executions spent on
    the connections it closed (the old one, and any that still saw the old boot)."""
    r = ex.run(bash_script(root_script("nohup sh -c 'sleep 1; reboot' >/dev/null 2>&1 &")),
               step="reboot", check=False)
    if r.exit_code == NO_ROOT:
        raise ProvisionError(f"{ex.host}: the reboot needs root and the "
                             f"{r.stderr.strip().removeprefix(NO_ROOT_NOTICE)}; reboot the host "
                             "from the provider's console, then run bootstrap again")
    ex.conn.close()
    spent = ex.executions
    waited = reboot_timeout()
    deadline = time.monotonic() + waited
    delay = 2.0
    time.sleep(delay)
    while time.monotonic() < deadline:
        try:
            new = again.connect()
        except SSHError as exc:
            if exc.kind in (HOST_KEY_CHANGED, AUTH_REFUSED):
                raise
            console.print(output.text(f"{ex.host}: waiting for the host to come back ({exc.kind})"))
        else:
            try:
                plan = again.replan(new)
            except ConnectionLost:
                # the old boot's sshd answered, then the reboot took it down while the facts
                # were read (a kept link to it, or a login just before it went): still rebooting
                new.conn.close()
                spent += new.executions
                console.print(output.text(f"{ex.host}: waiting for the host to come back "
                                          "(the old boot went down while we asked)"))
            else:
                assert plan.facts is not None
                if plan.facts.boot_id and plan.facts.boot_id != old_boot_id:
                    return new, plan, spent
                new.conn.close()  # still the old boot: the reboot has not happened yet
                spent += new.executions
        time.sleep(delay)
        delay = min(delay * 2, 15)
    raise ProvisionError(f"{ex.host}: did not come back with a new boot id within "
                         f"{waited}s of the reboot")


def run_step(ex: Executor, step: Step, run: str, console: Console,
             again: str = "bootstrap") -> Outcome:
    """Run one step that has work (its uploads first) and read what it reported."""
    assert step.body is not None
    for up in step.uploads:
        ex.put(up.local, up.remote, step=step.name)
    if step.foreground:
        result = run_foreground(ex, step.name, step.body, stdin=step.stdin, again=again,
                                needs_root=step.needs_root)
    else:
        watch = Watch(lambda text: console.print(f"{ex.host}: {text}", markup=False,
                                                 highlight=False), step.name,
                      alert=lambda text: output.err_console.print(
                          f"{ex.host}: {text}", markup=False, highlight=False, soft_wrap=True))
        result = run_detached(ex, step.name, step.body, inputs=step.inputs, lock=step.lock,
                              run=run, on_line=watch.line, on_err=watch.err, again=again,
                              needs_root=step.needs_root)
    return step.read(result.result)


def apply(ex: Executor, plan: Plan, only: set[str] | None = None,
          again: Reconnect | None = None, store: Store | None = None,
          console: Console | None = None, run: str | None = None) -> Applied:
    """Run the plan's steps that have work (``only``: a subset by name). A step that settles
    (the driver) re-reads the facts through ``again`` (rebooting first when it asks) and the
    rest of the plan is made anew from them. ``run``: the session's run id, so the host's
    journal, the local logs and the reports of one command carry the same one."""
    console = console or output.console
    store = store or Store.here()
    if plan.blocked:
        raise Blocked(f"{plan.host}: {plan.blocked}")
    run = run or run_id()
    out = Applied(host=plan.host)
    steps = list(plan.steps)
    seen: set[str] = set()  # steps already run or passed over: a re-plan does not repeat them
    while steps:
        step = steps.pop(0)
        seen.add(step.name)
        if only is not None and step.name not in only:
            continue
        if not step.changes:
            console.print(output.text((f"{plan.host}: {step.name}: nothing to do - {step.reason}", "dim")))
            out.steps.append(StepRecord(step.name, "skipped", 0.0))
            if step.kept is not None:
                _record(out, step.name, step.kept, plan.host, store, run)
            continue
        outcome = _timed(ex, step, run, out, console)
        _record(out, step.name, outcome, plan.host, store, run)
        if step.settle is not None:
            ex, plan = _settle(ex, plan, step, outcome, out, again, console)
            steps = [s for s in plan.steps if s.name not in seen]  # it took: the rest, anew
            if step.then is not None:
                assert plan.facts is not None
                steps.insert(0, step.then(plan.facts))
    out.executions += ex.executions
    left = [c for c in plan.cannot if only is None or c.split(":", 1)[0] in only]
    if left:  # all the login can do is done; the rest needs root: one line, and a failure
        raise ProvisionError(f"{plan.host}: not run: {'; '.join(left)}")
    return out


def _record(out: Applied, name: str, outcome: Outcome, host: str, store: Store, run: str) -> None:
    out.outcomes[name] = outcome
    if outcome.verdict is not None:
        out.verdict = outcome.verdict
    if outcome.report is not None:
        out.report = {**outcome.report, "host": host}
        out.report_path = store.save_report(host, out.report, kind=outcome.report_kind, run=run)


def _timed(ex: Executor, step: Step, run: str, out: Applied, console: Console) -> Outcome:
    why = f" ({step.reason})" if step.repair else ""
    console.print(f"{ex.host}: {step.name}: {step.label}{why} ...", markup=False, highlight=False)
    started = time.monotonic()
    outcome = run_step(ex, step, run, console)
    seconds = time.monotonic() - started
    out.steps.append(StepRecord(step.name, "ok", seconds))
    console.print(output.text(f"{ex.host}: {step.name}: done in {seconds:.1f}s"))
    return outcome


def _settle(ex: Executor, plan: Plan, step: Step, outcome: Outcome, out: Applied,
            again: Reconnect | None, console: Console) -> tuple[Executor, Plan]:
    """After a step that changes what the plan rests on: reboot if it asks, re-read the facts,
    re-plan, and let the step confirm it took (``settle``)."""
    assert step.settle is not None and plan.facts is not None
    if again is None:
        raise ProvisionError(f"{plan.host}: the {step.name} step needs a reconnecting session")
    if outcome.reboot:
        console.print(output.text(f"{ex.host}: rebooting (the module cannot load without it) ..."))
        started = time.monotonic()
        ex, plan, spent = reboot_and_wait(ex, plan.facts.boot_id, again, console)
        out.executions += spent
        out.steps.append(StepRecord("reboot", "ok", time.monotonic() - started))
    else:
        plan = again.replan(ex)
    assert plan.facts is not None
    try:
        confirmed = step.settle(plan.facts)
    except ProvisionError as exc:
        raise ProvisionError(f"{ex.host}: {exc}") from None
    console.print(output.text(f"{ex.host}: {confirmed}"))
    if plan.blocked:
        raise Blocked(f"{plan.host}: {plan.blocked}")
    return ex, plan
