"""Tasks: wiring only (resolve the host, call the modules, print). No decisions here.

Each task imports what it uses inside its body: listing the tasks, ``--version`` and the offline
tasks never load Fabric, paramiko, jinja2 or matplotlib. The flag, help, ``--json`` and exit-code
conventions are in ``taskkit``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke.context import Context
from invoke.exceptions import Exit

from ..errors import Blocked, ProvisionError, UsageError
from ..setup import show
from ..ui import console as output
from .taskkit import (  # noqa: F401  (re-exported: the names tasks in other modules use)
    ONE_HOST,
    Failed,
    Shown,
    has_host,
    reports_errors,
    target_of,
    task,
)
from .taskkit import notify as _notify
from .taskkit import overrides as _overrides
from .taskkit import session_of as _session

if TYPE_CHECKING:
    from ..config.options import Overrides
    from ..setup.engine import Applied


def _applied_json(applied: Applied, **more: Any) -> dict[str, Any]:
    return {**applied.as_json(), "seconds": round(sum(s.seconds for s in applied.steps), 2),
            "validation": applied.report, **more}


def _show_applied(applied: Applied, limits: list[Any] | None = None) -> None:
    show.steps_table(applied)
    if applied.report is not None:
        output.verdict_table(applied.host, applied.report, applied.report_path)
        _show_limits(applied.host, limits or [])
        output.next_steps(applied.host, applied.report)


def _show_limits(host: str, limits: list[Any]) -> None:
    for x in limits:  # what the host lets a job use: the same judgement as doctor's
        output.console.print(f"{host}: {'warning' if x.severity == 'warn' else 'note'}: {x.line}",
                             markup=False, highlight=False)


def _limits_of(p: Any) -> list[Any]:
    """The limits a job on the planned host meets (doctor's judgement), with the platform's
    words for each fix."""
    from ..doctor.checks import limit_findings
    return limit_findings(p.facts, p.settings.platform) if p.facts is not None else []


def _limits_json(limits: list[Any]) -> list[dict[str, str]]:
    return [{"severity": x.severity, "text": x.text, "fix": x.fix} for x in limits]


SETTINGS_HELP = {"python": "env Python, e.g. 3.11", "recipe": "recipe name (recipes/<name>.yaml)",
                 "torch": "torch spec: 2.5 | 2.5.1 | '>=2.4,<2.6'",
                 "platform": "platform profile name (recipes/platforms/<name>.yaml)",
                 "cuda_compat": "strict (default) or minor (NVIDIA minor-version compatibility)",
                 "env_name": "the conda env, where not the platform's or the recipe's (torch), "
                             "e.g. the one bootstrap --env-name made"}


def _help(*names: str, **more: str) -> dict[str, str]:
    return {**{n: SETTINGS_HELP[n] for n in names}, **more}


@task(help={"json": "print the facts as one JSON object"})
@reports_errors
def facts(c: Context, json_: bool = False) -> None:
    """Gather the host's facts in ONE remote execution and show them (changes nothing).

    Example: gpu-provision -H root@203.0.113.10:22 facts --json
    """
    with _session(c) as s:
        f = s.facts()
    if json_:
        output.print_json(f.as_json())
    else:
        output.facts_table(s.target.name, f)


@task(help=_help(*SETTINGS_HELP, json="print the plan as JSON"))
@reports_errors
def plan(c: Context, json_: bool = False, python: str | None = None, torch: str | None = None,
         recipe: str | None = None, platform: str | None = None, cuda_compat: str | None = None,
         env_name: str | None = None) -> None:
    """Show every decision bootstrap would take, with its reason. A true dry run.

    Example: gpu-provision -H my-4090 plan --torch 2.5
    """
    o = _overrides(python=python, torch=torch, recipe=recipe, platform=platform,
                   cuda_compat=cuda_compat, env_name=env_name)
    from ..setup.mirrors import probed
    with _session(c) as s:
        p = probed(s.ex, s.plan(o, push=True))  # each listed mirror asked once: one execution
    if json_:
        output.print_json(p.as_json())
    else:
        show.plan_table(p)
    if p.blocked:  # shown above (the JSON's "blocked", the table's last line): exit 2 alone
        raise Shown(Blocked(f"{s.target.name}: {p.blocked}"))


@task(help=_help(*SETTINGS_HELP, json="print what was done as JSON: steps (changed, seconds), "
                                      "verdict, the validation report"))
@reports_errors
def bootstrap(c: Context, python: str | None = None, torch: str | None = None,
              recipe: str | None = None, platform: str | None = None,
              cuda_compat: str | None = None, env_name: str | None = None,
              json_: bool = False) -> dict[str, Any]:
    """Turn the host into a validated PyTorch env: conda, env, torch, packages, validation.

    Safe to repeat: a provisioned host is checked in one remote execution and left unchanged;
    validation runs again once anything it checks has changed (or after 6 hours).
    Example: gpu-provision -H my-4090 bootstrap
    """
    o = _overrides(python=python, torch=torch, recipe=recipe, platform=platform,
                   cuda_compat=cuda_compat, env_name=env_name)
    with _session(c) as s:
        p = s.plan(o, push=True)
        for r in p.risks:
            output.console.print(output.text(("risk:", "yellow"), f" {r}"))
        applied = s.apply(p, o)
    limits = _limits_of(p) if applied.report is not None else []
    if json_:
        output.print_json(_applied_json(applied, risks=list(p.risks), limits=_limits_json(limits)))
    else:
        _show_applied(applied, limits)
    if applied.verdict == "FAIL":
        # the verdict table above says it, with the report's path: once
        raise Shown(ProvisionError(f"{s.target.name}: validation verdict FAIL (report "
                                   f"{applied.report_path})"))
    return {"steps": [(x.name, x.result, x.seconds) for x in applied.steps],
            "verdict": applied.verdict}


SUSTAINED_S = 60.0  # validate --sustained without a number: a minute of every GPU at once


def sustained_seconds(value: Any) -> float | None:
    """--sustained (True: the default), --sustained 120, or not given (None)."""
    if value is None or value is False:
        return None
    if value is True or value == "":
        return SUSTAINED_S
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = 0.0
    if not 5 <= seconds <= 3600:
        raise UsageError(f"--sustained: {value!r} is not a number of seconds from 5 to 3600 "
                         f"(leave it out for {SUSTAINED_S:g})")
    return seconds


@task(optional=["sustained"], help=_help(
    "env_name", "recipe", "platform", json="print the steps, verdict and validation report as JSON",
    sustained="also load every GPU at once for SECONDS (default 60) and judge each against the "
              "best of its siblings and its model's sustained floor, with the clocks, power, "
              "temperature and clock-event reasons sampled during the load"))
@reports_errors
def validate(c: Context, env_name: str | None = None, recipe: str | None = None,
             platform: str | None = None, sustained: Any = None, json_: bool = False) -> dict[str, Any]:
    """Run validate_gpu.py in the env and show the verdict (exit 1 on FAIL).

    Example: gpu-provision -H my-4090 validate; gpu-provision -H my-8xh100 validate --sustained 120
    """
    seconds = sustained_seconds(sustained)
    o = _overrides(env_name=env_name, recipe=recipe, platform=platform)
    with _session(c) as s:
        p = s.plan(o, revalidate=True)
        p.require_env("validate")
        if seconds:
            p = _with_sustained(p, seconds)
        applied = s.apply(p, only={"validate"})
    assert applied.report is not None and p.facts is not None
    limits = _limits_of(p)
    if json_:
        output.print_json(_applied_json(applied, limits=_limits_json(limits)))
    else:
        output.verdict_table(applied.host, applied.report, applied.report_path)
        _show_limits(applied.host, limits)
        output.next_steps(applied.host, applied.report)
    if applied.verdict == "FAIL":
        raise Exit(code=1)
    return {"steps": [(x.name, x.result, x.seconds) for x in applied.steps],
            "verdict": applied.verdict}


def _with_sustained(p: Any, seconds: float) -> Any:
    """The plan with its validate step measuring the sustained tier too (the step's config
    carries the seconds among the thresholds, so its inputs differ from a plain run's)."""
    from dataclasses import replace

    from ..ops import validate as validate_ops
    settings = replace(p.settings, validation={**p.settings.validation, "sustained_s": seconds})
    step = validate_ops.validate_step(p.facts, p.layout, settings, p.torch, always=True)
    return replace(p, steps=tuple(step if x.name == "validate" else x for x in p.steps))


@task(help={"junit": "the JUnit XML file (default reports/<host>/verify-<time>.xml)"})
@reports_errors
def verify(c: Context, junit: str | None = None) -> None:
    """Run the shipped pytest-testinfra suite against the host (exit 1 when a check fails).

    It uses this tool's connection (key, port, pinned host key) and checks what the last
    bootstrap recorded: driver, GPUs, conda, env, torch and its CUDA, mirrors, held driver
    packages, no stale lock. Example: gpu-provision -H my-4090 verify
    """
    from ..config.extras import need
    need("pytest", "testinfra", extra="verify")
    from ..remote.command import Command
    from ..remote.connection import connect, host_arg
    from ..remote.contract import CONTRACT
    from ..remote.executor import Executor
    from ..store import Store, run_id
    from ..verify.run import run_suite

    target = target_of(c)
    path = Path(junit) if junit else Store.here().report_path(target.name, "verify", ext="xml")
    # every check's command goes through the executor (verify/conftest.py), and testinfra's
    # paramiko client is the connection's own: a kept one serves it like any other command
    conn = connect(target, notify=_notify)
    try:
        ex = Executor(conn, target.name, log_dir=Store.here().run_logs(target.name, run_id()))
        # what the suite checks against is written by bootstrap's validation: without it every
        # check would fail with the same complaint
        seen = ex.run(
            Command(("test", "-f", CONTRACT.expected)), step="verify", check=False,
            reads_only=True)
        if seen.exit_code != 0:
            raise ProvisionError(f"{target.name}: this host was never bootstrapped by "
                                 f"gpu-provision (no ~/{CONTRACT.expected}), so there is "
                                 f"nothing to verify; run: gpu-provision -H {host_arg(target)} "
                                 "bootstrap")
        code = run_suite(ex, target, path)
    finally:
        conn.close()
    passed = "all checks passed" if code == 0 else "FAILED"
    output.console.print(output.text(f"verify: {target.name}: {passed} (JUnit XML: {path})"))
    if code != 0:
        raise Exit(code=1)


@task(iterable=["log"], help={"log": "a file holding an error text to diagnose (repeatable; - "
                                     "reads standard input); without -H only these are read",
                              "job": "a job's id or name (`jobs` lists them): also read the end "
                                     "of its log on the host",
                              "env_name": SETTINGS_HELP["env_name"],
                              "json": "print the findings as JSON"})
@reports_errors
def doctor(c: Context, log: list[str] | None = None, job: str | None = None,
           env_name: str | None = None, json_: bool = False) -> None:
    """Match the host's state and error texts against known failures and print each fix.

    What this tool recorded about the host comes first: a step whose last run failed, with the
    line of its log that says why, and a last validation verdict that was not PASS, with its
    failing checks. Then the facts (with the tail of each step's log on the host, one remote
    execution), the last validation report and run logs here, any --log file and, with --job,
    the end of that job's log on the host. Exit 1 when an error is found.
    Example: gpu-provision -H my-4090 doctor;  gpu-provision -H my-4090 doctor --job train;
    gpu-provision doctor --log traceback.txt
    """
    from ..doctor.files import read_logs
    from ..doctor.match import diagnose, texts_for
    from ..doctor.records import recorded
    from ..store import Store
    from .jobs_commands import job_log_tail

    files = read_logs(log or [])
    if job and not has_host(c):
        raise UsageError("doctor --job reads the job's log on its host: give it with -H")
    if has_host(c):
        host = target_of(c).name
        store = Store.here()
        if (moved := store.moved_note()) is not None:
            _notify(moved)
        report, logs = store.last_report(host), store.last_logs(host)  # before this run's own
        with _session(c) as s:
            f = s.facts(step_logs=True)
            p = s.plan(_overrides(env_name=env_name), facts=f)
            if job:
                job_id, text = job_log_tail(s.ex, job)
                files = {f"job {job_id}": text, **files}
        # the tool's own records of the host first: a failed step, a verdict that was not PASS
        findings = recorded(f, report, host) + diagnose(texts_for(f, report, logs, files), f, p,
                                                         host=host)
    elif files:
        host = "<host>"
        findings = diagnose(files)
    else:
        raise UsageError("doctor needs a host (-H <inventory | user@host:port>) or "
                         "--log FILE with an error text")
    if json_:
        output.print_json([x.as_json() for x in findings])
    else:
        output.findings_table(host, findings)
    if any(x.level == "error" for x in findings):
        raise Exit(code=1)


@task(help={"download_mb": "MiB downloaded from each mirror (default 50)",
            "env_name": SETTINGS_HELP["env_name"], "json": "print the report as JSON"})
@reports_errors
def bench(c: Context, download_mb: int = 50, env_name: str | None = None,
          json_: bool = False) -> None:
    """Run the standard benchmark in the env and save reports/<host>/bench-<time>.json.

    matmul TFLOPS per dtype, memory and host-to-device bandwidth, a small CNN's training
    throughput, a detector's inference latency (batch 1 and 32), disk write/read in the data
    dir, CPU cores and a single-core score, download speed from each mirror, upload and download
    speed between this machine and the host. A host without a
    GPU runs it on the CPU, labelled so. Example: gpu-provision -H my-4090 bench
    """
    from ..ops import validate as validate_ops
    from ..setup.engine import run_step
    from ..sync.link import bench_link

    if download_mb < 0:
        raise UsageError(f"--download-mb: {download_mb} is below 0")
    o = _overrides(env_name=env_name)
    with _session(c) as s:
        p = s.plan(o)
        p.require_env("benchmark")
        assert p.facts is not None and p.layout is not None
        step = validate_ops.bench_step(p.facts, p.layout, p.settings, p.torch, download_mb)
        output.console.print(f"{s.target.name}: bench: {step.reason} ...", markup=False)
        outcome = run_step(s.ex, step, s.run, output.console, again="bench")
        link = bench_link(s.ex)  # this machine <-> host MB/s, for compare
    assert outcome.report is not None
    report = {**validate_ops.bench_report(outcome.report, s.target, p.settings), "link": link}
    path = s.store.save_report(s.target.name, report, kind="bench", run=s.run)
    if json_:
        output.print_json(report)
    else:
        output.bench_table(s.target.name, report, path)


STEP_JSON = "print the steps and their results as one JSON object"


def _apply_only(c: Context, names: set[str], o: Overrides, json_: bool = False) -> None:
    with _session(c) as s:
        applied = s.apply(s.plan(o), o, only=names)
    if json_:
        output.print_json(_applied_json(applied))
    else:
        show.steps_table(applied)


@task(name="conda", help=_help("recipe", "platform", json=STEP_JSON))
@reports_errors
def conda_task(c: Context, recipe: str | None = None, platform: str | None = None,
               json_: bool = False) -> None:
    """Install Miniconda from the mirror (sha256 checked) with .condarc and pip.conf, if missing."""
    _apply_only(c, {"conda"}, _overrides(recipe=recipe, platform=platform), json_)


@task(name="env", help=_help("python", "env_name", "recipe", "platform", json=STEP_JSON))
@reports_errors
def env_task(c: Context, python: str | None = None, env_name: str | None = None,
             recipe: str | None = None, platform: str | None = None, json_: bool = False) -> None:
    """Create the conda env (or adopt the platform's), if missing."""
    _apply_only(c, {"env"}, _overrides(python=python, env_name=env_name, recipe=recipe,
                                       platform=platform), json_)


@task(name="torch", help=_help("torch", "cuda_compat", "env_name", "recipe", "platform",
                              json=STEP_JSON))
@reports_errors
def torch_task(c: Context, torch: str | None = None, cuda_compat: str | None = None,
               env_name: str | None = None, recipe: str | None = None,
               platform: str | None = None, json_: bool = False) -> None:
    """Install the chosen torch build (and the recipe's packages) into the env, if needed."""
    _apply_only(c, {"torch", "packages"}, _overrides(torch=torch, cuda_compat=cuda_compat,
                                                     env_name=env_name, recipe=recipe,
                                                     platform=platform), json_)


DRIVER_STEPS = ("driver", "driver-hold", "fabric-manager")


@task(name="driver", help={"json": STEP_JSON})
@reports_errors
def driver_task(c: Context, json_: bool = False) -> None:
    """Install the NVIDIA driver where missing or too old (hosts we may touch), then hold it;
    on NVSwitch boards, the fabric manager of exactly the driver's version, running.

    Reboots only when the module cannot load otherwise, requires a new boot id, and verifies
    nvidia-smi before holding the packages.

    Example: gpu-provision -H my-vm driver
    """
    with _session(c) as s:
        p = s.plan()
        if not any(x.name in DRIVER_STEPS and x.changes for x in p.steps):
            # what each driver step found, then the refusal when there is one
            idle = [d for d in p.decisions if d.step in DRIVER_STEPS]
            if json_ and not p.blocked:
                output.print_json({"host": s.target.name, "steps": [
                    {"step": d.step, "result": "skipped", "changed": False, "seconds": 0,
                     "reason": d.reason} for d in idle]})
            for d in [] if json_ else idle:
                output.console.print(f"{s.target.name}: {d.step}: nothing to do - {d.reason}",
                                     markup=False)
            if p.blocked:
                raise Blocked(f"{s.target.name}: {p.blocked}")
            left = [c for c in p.cannot if c.split(":", 1)[0] in DRIVER_STEPS]
            if left:  # the login cannot become root: named above, and a failure
                raise ProvisionError(f"{s.target.name}: not run: {'; '.join(left)}")
            return
        applied = s.apply(p, only=set(DRIVER_STEPS))
    if json_:
        output.print_json(_applied_json(applied))
    else:
        show.steps_table(applied)


from .tasks_access import authorize, forget_host_key, forget_secrets, repin  # noqa: E402,F401
from .tasks_cancel import cancel  # noqa: E402,F401
from .tasks_data import autostop, cost, prune, sync  # noqa: E402,F401
from .tasks_fit import fit  # noqa: E402,F401
from .tasks_hands import forget_login, forward, shell, ssh_config  # noqa: E402,F401
from .tasks_jobs import jobs, kill, logs, queue, run, watch  # noqa: E402,F401
from .tasks_keep import keepers  # noqa: E402,F401
from .tasks_offline import compare, pick, refresh_compat  # noqa: E402,F401
from .tasks_report import report as report_task  # noqa: E402,F401  (the task is named report)
