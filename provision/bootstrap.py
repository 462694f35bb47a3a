"""Apply a plan: each step that has work is one remote execution under the host's lock.

A re-run on a provisioned host is two executions: facts, then validation.
"""

from __future__ import annotations

import getpass
import json
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import output
from .command import bash_script
from .compat import load_compat
from .errors import ProvisionError, RemoteError
from .executor import Executor, Result
from .ops import Step
from .plan import Plan
from .templating import render

LOCKED = 75  # the step script's exit code when another run holds the lock


@dataclass
class Outcome:
    host: str
    steps: list[tuple[str, str, float]] = field(default_factory=list)  # name, result, seconds
    verdict: str | None = None
    report: dict[str, Any] | None = None
    report_path: Path | None = None


def owner() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()} pid {__import__('os').getpid()}"


def run_step(ex: Executor, step: Step, run_id: str) -> Result:
    assert step.body is not None
    script = render("step.sh.j2", step=step.name, inputs=step.inputs, run_id=run_id,
                    owner=owner(), body=step.body)
    result = ex.run(bash_script(script), step=step.name, check=False)
    if result.exit_code == LOCKED:
        raise ProvisionError(f"{ex.host}: {result.stderr.strip() or 'another run holds the lock'}"
                             " - wait for it to finish, then run bootstrap again")
    if result.exit_code != 0:
        raise RemoteError(ex.host, step.name, result.exit_code, result.stdout + result.stderr,
                          fix=f"the full log is in {ex.log_dir}/{step.name}.log and on the host "
                              f"in ~/.gpu-provision/logs/{step.name}.log")
    return result


def check_torch(plan: Plan, stdout: str) -> None:
    """The installed build must be the chosen one (import works, same release, same CUDA)."""
    m = re.search(r"^TORCH_CHECK (\{.*\})$", stdout, re.MULTILINE)
    if not m or plan.torch is None:
        raise ProvisionError("torch was installed but `import torch` printed nothing usable")
    got = json.loads(m.group(1))
    choice = plan.torch
    want_cuda = None if choice.cuda == "cpu" else ".".join(
        map(str, load_compat().variant_cuda[choice.cuda][:2]))
    if got["version"].split("+")[0] != choice.torch or got["cuda"] != want_cuda:
        raise ProvisionError(f"installed torch {got['version']} (CUDA {got['cuda']}) is not the "
                             f"chosen {choice.label} (CUDA {want_cuda}); the index "
                             f"{choice.index_url} served another build")


def parse_validation(stdout: str) -> dict[str, Any]:
    m = re.search(r"^VALIDATE_JSON (\{.*\})$", stdout, re.MULTILINE)
    if not m:
        raise ProvisionError("validate_gpu.py printed no JSON; see the step log")
    return json.loads(m.group(1))  # type: ignore[no-any-return]


def save_report(host: str, report: dict[str, Any]) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host)
    path = Path("reports") / safe / f"validate-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def apply(ex: Executor, plan: Plan, only: set[str] | None = None) -> Outcome:
    """Run the plan's steps that have work (``only``: a subset by name)."""
    if plan.blocked:
        raise ProvisionError(f"{plan.host}: {plan.blocked}")
    driver = next((d for d in plan.decisions if d.step == "driver"), None)
    if driver is not None and driver.changes and (only is None or "driver" in only):
        raise ProvisionError(f"{plan.host}: the driver step is needed ({driver.action}: "
                             f"{driver.reason}) and is not automated yet; install the driver, "
                             "then run bootstrap again")
    run_id = time.strftime("%Y%m%d-%H%M%S")
    out = Outcome(host=plan.host)
    for step in plan.steps:
        if only is not None and step.name not in only:
            continue
        if not step.changes:
            output.console.print(f"[dim]{plan.host}: {step.name}: nothing to do - {step.reason}[/]")
            out.steps.append((step.name, "skipped", 0.0))
            continue
        output.console.print(f"{plan.host}: {step.name}: {step.action} ...")
        started = time.monotonic()
        result = run_step(ex, step, run_id)
        seconds = time.monotonic() - started
        out.steps.append((step.name, "ok", seconds))
        output.console.print(f"{plan.host}: {step.name}: done in {seconds:.1f}s")
        if step.name == "torch":
            check_torch(plan, result.stdout)
        if step.name == "validate":
            out.report = parse_validation(result.stdout)
            out.report["host"] = plan.host
            out.verdict = out.report["verdict"]
            out.report_path = save_report(plan.host, out.report)
    return out
