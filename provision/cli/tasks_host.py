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

from ..errors import ProvisionError, UsageError
from ..setup import show
from ..ui import console as output
from .taskkit import (  # noqa: F401  (re-exported: the names tasks in other modules use)
    ONE_HOST,
    Failed,
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


def _show_applied(applied: Applied) -> None:
    show.steps_table(applied)
    if applied.report is not None:
        output.verdict_table(applied.host, applied.report, applied.report_path)


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
    with _session(c) as s:
        p = s.plan(o, push=True)
    if json_:
        output.print_json(p.as_json())
    else:
        show.plan_table(p)


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
    if json_:
        output.print_json(_applied_json(applied, risks=list(p.risks)))
    else:
        _show_applied(applied)
    if applied.verdict == "FAIL":
        raise Exit(f"validation verdict FAIL (report {applied.report_path})", code=1)
    return {"steps": [(x.name, x.result, x.seconds) for x in applied.steps],
            "verdict": applied.verdict}


@task(help=_help("env_name", "recipe", "platform", json="print the steps, verdict and "
                                                        "validation report as JSON"))
@reports_errors
def validate(c: Context, env_name: str | None = None, recipe: str | None = None,
             platform: str | None = None, json_: bool = False) -> dict[str, Any]:
    """Run validate_gpu.py in the env and show the verdict (exit 1 on FAIL).

    Example: gpu-provision -H my-4090 validate
    """
    o = _overrides(env_name=env_name, recipe=recipe, platform=platform)
    with _session(c) as s:
        p = s.plan(o, revalidate=True)
        p.require_env("validate")
        applied = s.apply(p, only={"validate"})
    assert applied.report is not None
    if json_:
        output.print_json(_applied_json(applied))
    else:
        output.verdict_table(applied.host, applied.report, applied.report_path)
    if applied.verdict == "FAIL":
        raise Exit(code=1)
    return {"steps": [(x.name, x.result, x.seconds) for x in applied.steps],
            "verdict": applied.verdict}


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
    from ..store import Store
    from ..verify.run import run_suite

    target = target_of(c)
    path = Path(junit) if junit else Store().report_path(target.name, "verify", ext="xml")
    conn = connect(target, notify=_notify)
    try:
        # what the suite checks against is written by bootstrap's validation: without it every
        # check would fail with the same complaint
        seen = Executor(conn, target.name).run(
            Command(("test", "-f", CONTRACT.expected)), step="verify", check=False)
        if seen.exit_code != 0:
            raise ProvisionError(f"{target.name}: this host was never bootstrapped by "
                                 f"gpu-provision (no ~/{CONTRACT.expected}), so there is "
                                 f"nothing to verify; run: gpu-provision -H {host_arg(target)} "
                                 "bootstrap")
        code = run_suite(conn, target, path)
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

    Reads the facts (with the tail of each step's log on the host) in one remote execution, the
    last validation report and run logs here, any --log file and, with --job, the end of that
    job's log on the host. Exit 1 when an error is found.
    Example: gpu-provision -H my-4090 doctor;  gpu-provision -H my-4090 doctor --job train;
    gpu-provision doctor --log traceback.txt
    """
    from ..doctor.files import read_logs
    from ..doctor.match import diagnose, texts_for
    from ..store import Store
    from .jobs_commands import job_log_tail

    files = read_logs(log or [])
    if job and not has_host(c):
        raise UsageError("doctor --job reads the job's log on its host: give it with -H")
    if has_host(c):
        host = target_of(c).name
        store = Store()
        report, logs = store.last_report(host), store.last_logs(host)  # before this run's own
        with _session(c) as s:
            f = s.facts(step_logs=True)
            p = s.plan(_overrides(env_name=env_name), facts=f)
            if job:
                job_id, text = job_log_tail(s.ex, job)
                files = {f"job {job_id}": text, **files}
        findings = diagnose(texts_for(f, report, logs, files), f, p, host=host)
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


@task(iterable=["report"], help={
    "report": "a bench report file or glob, or `published` (repeatable; default: the newest "
              "reports/<host>/bench-*.json of each host)",
    "html": "where to write the page (default reports/compare.html; its PNG goes beside it)",
    "json": "print the rows as JSON and write no page"})
@reports_errors
def compare(c: Context, report: list[str] | None = None, html: str | None = None,
            json_: bool = False) -> None:
    """Local: join saved bench reports with each host's price_per_hour and currency from its
    inventory; print a table sorted by value for money and write an HTML page with a chart.

    With --json it only prints: no page, no PNG. Example: gpu-provision compare --report
    'reports/*/bench-*.json'
    """
    from ..money.compare import find_reports, price_of, rows
    from ..store import Store

    store = Store()
    loaded = find_reports(store, report or [])
    table = rows(loaded, price_of)
    notes = sorted({r["published"] for _, r in loaded if r.get("published")})
    if json_:
        output.print_json([r.as_json() for r in table])
        return
    from ..money import chart
    page = Path(html) if html else store.reports_dir / "compare.html"
    png = chart.write(table, page, notes)
    output.compare_table(table, notes)
    output.console.print(f"wrote {page} and {png}", markup=False)


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
            if p.blocked:
                raise ProvisionError(f"{s.target.name}: {p.blocked}")
            idle = [d for d in p.decisions if d.step in DRIVER_STEPS]
            if json_:
                output.print_json({"host": s.target.name, "steps": [
                    {"step": d.step, "result": "skipped", "changed": False, "seconds": 0,
                     "reason": d.reason} for d in idle]})
            for d in [] if json_ else idle:
                output.console.print(f"{s.target.name}: {d.step}: nothing to do - {d.reason}",
                                     markup=False)
            return
        applied = s.apply(p, only=set(DRIVER_STEPS))
    if json_:
        output.print_json(_applied_json(applied))
    else:
        show.steps_table(applied)


SMI_CAP = "nvidia-smi --query-gpu=compute_cap --format=csv,noheader"


@task(help={"driver": "NVIDIA driver version, e.g. 550.54.14 (omit, with --compute-cap, for a "
                      "host without a GPU)",
            "compute_cap": f"compute capability per GPU, comma separated: 8.6,12.0 ({SMI_CAP})",
            "python": "Python version of the env (default 3.11)",
            "torch": "torch spec: 2.5 | 2.5.1 | '>=2.4,<2.6' (default newest)",
            "cuda_compat": "strict (default) or minor (NVIDIA minor-version compatibility)",
            "glibc": "the host's glibc, e.g. 2.17 on CentOS 7",
            "index": "PyTorch index prefix holding <variant>/ (a mirror)",
            "json": "print one JSON object (on failure: {\"error\", \"exit_code\"})"})
@reports_errors
def pick(c: Context, driver: str | None = None, compute_cap: str | None = None,
         python: str = "3.11", torch: str | None = None, cuda_compat: str = "strict",
         glibc: str | None = None, index: str | None = None, json_: bool = False) -> None:
    """Offline: which torch wheel fits this driver, GPU and Python (exit 2 when none does).

    Example: gpu-provision pick --driver 550.54.14 --compute-cap 8.9 --python 3.10 --json
    """
    from ..wheels.rule import choose_torch
    from .pickargs import check_pick

    caps = check_pick(driver, compute_cap, python, torch, cuda_compat, glibc, index)
    choice = choose_torch(driver=driver, compute_caps=caps, python=python, torch=torch,
                          cuda_compat=cuda_compat, glibc=glibc, index=index)
    if json_:
        output.print_json(choice.as_json())
    else:
        output.choice_text(choice)


@task(name="refresh-compat", help={"index": "PyTorch index prefix, an http(s) URL (default "
                                            "https://download.pytorch.org/whl)",
                                   "json": "print the diff as JSON",
                                   "write": "write the refreshed compat YAML to this file"})
@reports_errors
def refresh_compat(c: Context, index: str | None = None, json_: bool = False,
                   write: str | None = None) -> None:
    """Diff the wheel data against a live PyTorch index; --write saves a refreshed copy.

    The written file adds the index's new releases and variants, for review.

    Example: gpu-provision refresh-compat --write compat-new.yaml
    """
    from ..config import validators
    problem = validators.url(index) if index is not None else None
    if problem:
        raise UsageError(f"--index: {problem}, e.g. https://download.pytorch.org/whl")
    from ..wheels.refresh import refresh, write_refreshed

    diff, new, notes, base = refresh(index)
    if write:
        write_refreshed(Path(write), new, notes, base)
        output.err_console.print(f"wrote {write} ({len(notes)} change(s))", markup=False)
    if json_:
        output.print_json({"added": diff.added, "removed": diff.removed,
                           "python_changed": diff.python_changed})
    elif diff.empty:
        output.console.print(output.text("the wheel data matches the index"))
    else:
        for line in diff.lines():
            output.console.print(line, markup=False)


@task
@reports_errors
def repin(c: Context) -> None:
    """Accept the host's current SSH key, replacing the pinned one (after a rebuild or reuse).

    Example: gpu-provision -H root@203.0.113.10:2222 repin
    """
    from ..remote.connection import connect
    connect(target_of(c), notify=_notify, replace_key=True).close()


@task(name="forget-secrets", aliases=["forget"])
@reports_errors
def forget_secrets(c: Context) -> None:
    """Remove the tokens pushed with push_env from the host (env file, .bashrc line, journal).

    Example: gpu-provision -H my-4090 forget-secrets
    """
    from ..ops.secrets import forget_secrets_step
    from ..setup.engine import run_step

    with _session(c) as s:
        names = run_step(s.ex, forget_secrets_step(), s.run, output.console).data
    output.console.print(f"{s.target.name}: removed {names} from the host"
                         if names else f"{s.target.name}: no pushed tokens to remove",
                         markup=False)


@task(help={"pubkey": "public key to install (default: the inventory's key + .pub, else "
                      "~/.ssh/id_ed25519.pub or id_rsa.pub)",
            "password_env": "read the password from this environment variable (else a prompt)"})
@reports_errors
def authorize(c: Context, pubkey: str | None = None, password_env: str | None = None) -> None:
    """Install your public key with the host's password, once; later runs log in by key.

    Example: gpu-provision -H root@203.0.113.10:22 authorize -i ~/.ssh/id_ed25519
    """
    from ..remote.authorize import authorize_key
    target = target_of(c)
    text = authorize_key(target, pubkey, password_env or target.password_env, _notify)
    output.console.print(f"{target.name}: {text}", markup=False)


@task(name="forget-host-key")
@reports_errors
def forget_host_key(c: Context) -> None:
    """Remove the host's pinned SSH key from our known_hosts file."""
    from ..remote.connection import forget_pin, known_hosts_path
    target = target_of(c)
    found = forget_pin(target)
    output.console.print(f"{target.pin_name}: {'forgotten' if found else 'was not pinned'} "
                         f"({known_hosts_path()})", markup=False)


from .tasks_data import autostop, cost, sync  # noqa: E402,F401
from .tasks_fit import fit  # noqa: E402,F401
from .tasks_jobs import jobs, kill, logs, run, watch  # noqa: E402,F401
