"""Apply a plan: each step that has work is one remote execution under the host's lock.

A re-run on a provisioned host is one execution (facts) when nothing validation checks has
changed since it last passed, else two (facts, then validation).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import output
from .command import bash_script, mask
from .connection import AUTH_REFUSED, HOST_KEY_CHANGED
from .doctor import diagnose
from .errors import Interrupted, ProvisionError, RemoteError, SSHError
from .executor import Executor, Result
from .ops import Step
from .ops import driver as driver_ops
from .plan import Plan
from .templating import render

LOCKED = 75  # the step script's exit code when another run holds the lock
NO_EXIT_STATUS = -1  # the channel closed without an exit status: the connection was lost


@dataclass
class Outcome:
    host: str
    steps: list[tuple[str, str, float]] = field(default_factory=list)  # name, result, seconds
    verdict: str | None = None
    report: dict[str, Any] | None = None
    report_path: Path | None = None
    executions: int = 0  # remote executions on every connection the run used


REBOOT_TIMEOUT = int(os.environ.get("GPU_PROVISION_REBOOT_TIMEOUT", "900"))


def reboot_and_wait(ex: Executor, old_boot_id: str, reconnect: Callable[[], Executor],
                    replan: Callable[[Executor], Plan]) -> tuple[Executor, Plan]:
    """Reboot, wait for SSH with backoff, and require a NEW boot id (the facts say so)."""
    ex.run(bash_script("nohup sh -c 'sleep 1; reboot' >/dev/null 2>&1 &"), step="reboot",
           check=False)
    ex.conn.close()
    deadline = time.monotonic() + REBOOT_TIMEOUT
    delay = 2.0
    time.sleep(delay)
    while time.monotonic() < deadline:
        try:
            new = reconnect()
        except SSHError as exc:
            if exc.kind in (HOST_KEY_CHANGED, AUTH_REFUSED):
                raise
            output.console.print(f"{ex.host}: waiting for the host to come back ({exc.kind})")
        else:
            plan = replan(new)
            assert plan.facts is not None
            if plan.facts.boot_id and plan.facts.boot_id != old_boot_id:
                return new, plan
            new.conn.close()  # still the old boot: the reboot has not happened yet
        time.sleep(delay)
        delay = min(delay * 2, 15)
    raise ProvisionError(f"{ex.host}: did not come back with a new boot id within "
                         f"{REBOOT_TIMEOUT}s of the reboot")


def owner() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"


def run_step(ex: Executor, step: Step, run_id: str) -> Result:
    assert step.body is not None
    script = render("step.sh.j2", step=step.name, inputs=step.inputs, run_id=run_id,
                    owner=owner(), body=step.body)
    last: dict[str, Any] = {"text": "", "at": 0.0}

    def progress(line: str) -> None:
        """The step's heartbeat (elapsed time, last log line): shown when the line changes, or
        every 10 s while it does not."""
        if not line.startswith("gpu-provision: "):
            return
        text = line.split("s: ", 1)[-1]
        if text != last["text"] or time.monotonic() - last["at"] >= 10:
            last.update(text=text, at=time.monotonic())
            output.console.print(f"{ex.host}: {line.removeprefix('gpu-provision: ')}",
                                 markup=False, highlight=False)

    try:
        result = ex.run(bash_script(script), step=step.name, check=False, progress=progress)
    except KeyboardInterrupt:
        raise Interrupted(f"{ex.host}: interrupted while waiting for step {step.name!r}; it goes "
                          "on, detached, on the host (log ~/.gpu-provision/logs/"
                          f"{step.name}.log). Run bootstrap again to re-attach and finish "
                          "(the lock refuses any other run meanwhile)") from None
    if result.exit_code == NO_EXIT_STATUS:
        raise ProvisionError(f"{ex.host}: the connection was lost during step {step.name!r} (the "
                             "network dropped, or the host rebooted). If the host is up the step "
                             "goes on there; run bootstrap again: it re-attaches, or redoes the "
                             "step if the host killed it")
    if result.exit_code == LOCKED:
        raise ProvisionError(f"{ex.host}: {result.stderr.strip() or 'another run holds the lock'}"
                             " - wait for it to finish, then run bootstrap again")
    if result.exit_code != 0:
        text = mask(result.stdout + result.stderr, ex.secrets)
        known = diagnose({f"step {step.name}": text}, host=ex.host)
        hint = (f"{known[0].diagnosis} (seen: {known[0].evidence.split(': ', 1)[-1]}) "
                f"{known[0].fix}\n" if known else "")
        raise RemoteError(ex.host, step.name, result.exit_code, text,
                          fix=f"{hint}the full log is in {ex.log_dir}/{step.name}.log and on the "
                              f"host in ~/.gpu-provision/logs/{step.name}.log")
    return result


def check_torch(plan: Plan, stdout: str) -> None:
    """The installed build must be the chosen one (import works, same release, same CUDA)."""
    m = re.search(r"^TORCH_CHECK (\{.*\})$", stdout, re.MULTILINE)
    if not m or plan.torch is None:
        raise ProvisionError("torch was installed but `import torch` printed nothing usable")
    got = json.loads(m.group(1))
    choice = plan.torch
    want_cuda = choice.cuda_version
    if got["version"].split("+")[0] != choice.torch or got["cuda"] != want_cuda:
        raise ProvisionError(f"installed torch {got['version']} (CUDA {got['cuda']}) is not the "
                             f"chosen {choice.label} (CUDA {want_cuda}); the index "
                             f"{choice.index_url} served another build")


def parse_marked(stdout: str, marker: str, script: str) -> dict[str, Any]:
    """The one JSON object a remote script printed as ``<marker> {...}``."""
    m = re.search(rf"^{marker} (\{{.*\}})$", stdout, re.MULTILINE)
    if not m:
        raise ProvisionError(f"{script} printed no JSON; see the step log")
    return json.loads(m.group(1))  # type: ignore[no-any-return]


def parse_validation(stdout: str) -> dict[str, Any]:
    return parse_marked(stdout, "VALIDATE_JSON", "validate_gpu.py")


def host_dir(host: str) -> str:
    """The host's folder name under logs/ and reports/."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", host)


def last_report(host: str, kind: str = "validate") -> dict[str, Any] | None:
    """The newest saved ``reports/<host>/<kind>-*.json`` (None when there is none)."""
    found = sorted((Path("reports") / host_dir(host)).glob(f"{kind}-*.json"))
    return json.loads(found[-1].read_text()) if found else None


def last_logs(host: str) -> dict[str, str]:
    """The step logs of the newest run here: ``logs/<host>/<run>/<step>.log``, but facts."""
    runs = sorted(p for p in (Path("logs") / host_dir(host)).glob("*") if p.is_dir())
    if not runs:
        return {}
    # facts.log is raw probe data (a CPU host's "nvidia-smi: command not found" is no error):
    # doctor reads the facts themselves, parsed
    return {f"log {p.relative_to('logs')}": _outputs(p.read_text(errors="replace"))[-20000:]
            for p in sorted(runs[-1].glob("*.log")) if p.name != "facts.log"}


def _outputs(log: str) -> str:
    """A step log without the commands it records (a script's own text is not its output)."""
    return re.sub(r"^\$ .*?^# exit -?\d+ in [\d.]+s$", "", log, flags=re.MULTILINE | re.DOTALL)


def save_report(host: str, report: dict[str, Any], kind: str = "validate") -> Path:
    path = Path("reports") / host_dir(host) / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def apply(ex: Executor, plan: Plan, only: set[str] | None = None,
          reconnect: Callable[[], Executor] | None = None,
          replan: Callable[[Executor], Plan] | None = None) -> Outcome:
    """Run the plan's steps that have work (``only``: a subset by name). A driver step may
    reboot the host: ``reconnect`` opens a new connection and ``replan`` re-reads the facts."""
    if plan.blocked:
        raise ProvisionError(f"{plan.host}: {plan.blocked}")
    run_id = time.strftime("%Y%m%d-%H%M%S")
    out = Outcome(host=plan.host)
    steps = list(plan.steps)
    first = steps[0] if steps else None
    if first is not None and first.name == "driver" and (only is None or "driver" in only):
        if reconnect is None or replan is None:
            raise ProvisionError(f"{plan.host}: the driver step needs a reconnecting session")
        ex, plan = _driver(ex, plan, first, run_id, out, reconnect, replan)
        steps = [s for s in plan.steps if s.name != "driver"]
    for step in steps:
        if only is not None and step.name not in only:
            continue
        if not step.changes:
            output.console.print(f"[dim]{plan.host}: {step.name}: nothing to do - {step.reason}[/]")
            out.steps.append((step.name, "skipped", 0.0))
            if step.name == "validate" and plan.facts is not None:  # the unchanged last verdict
                out.verdict = plan.facts.journal.get("verdict", {}).get("result")
            continue
        result = _timed(ex, step, run_id, out)
        if step.name == "torch":
            check_torch(plan, result.stdout)
        if step.name == "validate":
            out.report = parse_validation(result.stdout)
            out.report["host"] = plan.host
            out.verdict = out.report["verdict"]
            out.report_path = save_report(plan.host, out.report)
    out.executions += ex.executions
    return out


def _timed(ex: Executor, step: Step, run_id: str, out: Outcome) -> Result:
    why = f" ({step.reason})" if step.action.startswith("redo: ") else ""
    output.console.print(f"{ex.host}: {step.name}: {step.action}{why} ...")
    started = time.monotonic()
    if step.stdin is not None:  # quick, and its input is secret: foreground, fed on stdin
        assert step.body is not None
        result = ex.run(bash_script(step.body), step=step.name, stdin=step.stdin)
    else:
        result = run_step(ex, step, run_id)
    seconds = time.monotonic() - started
    out.steps.append((step.name, "ok", seconds))
    output.console.print(f"{ex.host}: {step.name}: done in {seconds:.1f}s")
    return result


def _driver(ex: Executor, plan: Plan, step: Step, run_id: str, out: Outcome,
            reconnect: Callable[[], Executor], replan: Callable[[Executor], Plan]
            ) -> tuple[Executor, Plan]:
    """Install (or reboot for) the driver, verify nvidia-smi on the new boot, hold packages."""
    assert plan.facts is not None
    result = _timed(ex, step, run_id, out)
    if "NEEDS_REBOOT" in result.stdout:
        output.console.print(f"{ex.host}: rebooting (the module cannot load without it) ...")
        started = time.monotonic()
        out.executions += ex.executions
        ex, plan = reboot_and_wait(ex, plan.facts.boot_id, reconnect, replan)
        out.steps.append(("reboot", "ok", time.monotonic() - started))
    else:
        plan = replan(ex)
    assert plan.facts is not None
    if plan.facts.nvidia_state != "ok":
        raise ProvisionError(f"{ex.host}: after the driver step nvidia-smi reports: "
                             f"{plan.facts.nvidia_detail}; see logs/ and `gpu-provision doctor`")
    output.console.print(f"{ex.host}: driver {plan.facts.driver} loaded "
                         f"(CUDA <= {plan.facts.driver_cuda})")
    branch = step_branch(plan, step)
    if branch is not None:
        _timed(ex, driver_ops.hold_step(plan.facts, *branch), run_id, out)
    if plan.blocked:
        raise ProvisionError(f"{plan.host}: {plan.blocked}")
    return ex, plan


def step_branch(plan: Plan, step: Step) -> tuple[int, bool] | None:
    """The (branch, open) that was installed: hold its packages (a reboot-only step holds none)."""
    m = re.search(r"branch (\d+)( \(open modules\))?", step.action)
    return (int(m.group(1)), bool(m.group(2))) if m else None
