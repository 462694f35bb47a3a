"""Fabric tasks: wiring only (resolve the host, call the modules, print). No decisions here."""

from __future__ import annotations

import functools
import glob
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from fabric import Connection, task
from invoke.context import Context
from invoke.exceptions import Exit

from . import chart, output
from . import validators as v
from .authorize import authorize_key
from .bootstrap import (
    Outcome,
    apply,
    host_dir,
    last_logs,
    last_report,
    parse_marked,
    run_step,
    save_report,
)
from .command import bash_script
from .compare import newest_per_host, report_files, rows
from .compat import choose_torch, compat_text, load_compat
from .connection import connect, forget_pin, known_hosts_path
from .doctor import diagnose, texts_for
from .errors import ProvisionError
from .executor import Executor
from .extras import need
from .facts.host import HostFacts
from .gather import gather
from .inventory import Target, resolve_target, settings_for
from .ops import forget_secrets_body
from .ops import validate as validate_ops
from .paths import as_dir, verify_suite
from .plan import Plan, make_plan
from .recipes import all_platforms, load_platform
from .refresh import diff_index, refreshed_yaml, scan_index
from .secrets import digest, push_values

F = TypeVar("F", bound=Callable[..., Any])
_PYTEST = threading.Lock()


def reports_errors(fn: F) -> F:
    """Show a ProvisionError as its one-line message and exit with its code (no traceback)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ProvisionError as exc:
            raise Exit(f"error: {exc}", code=exc.exit_code) from None
        except KeyboardInterrupt:  # between steps: nothing runs on the host for us
            raise Exit("interrupted: no step was running; run the task again", code=130) from None
    return wrapper  # type: ignore[return-value]


def target_of(c: Context) -> Target:
    if not isinstance(c, Connection):
        raise ProvisionError("this task needs a host: -H <inventory name | user@host:port>")
    # Fabric has already split user@host:port and applied ~/.ssh/config (HostName, User, Port)
    target = resolve_target(c.original_host, user=c.user, port=c.port, host=c.host)
    keys = c.connect_kwargs.get("key_filename")  # -i on the command line beats the inventory
    if keys:
        target = replace(target, key=keys[0] if isinstance(keys, list) else str(keys))
    return target


def _notify(msg: str) -> None:
    output.err_console.print(f"[cyan]{msg}[/]")


def open_executor(target: Target, log_dir: Path) -> Executor:
    return Executor(connect(target, notify=_notify), target.name, log_dir=log_dir)


@contextmanager
def session(c: Context) -> Iterator[tuple[Target, Executor]]:
    target = target_of(c)
    run_id = time.strftime("%Y%m%d-%H%M%S")
    ex = open_executor(target, Path("logs") / host_dir(target.name) / run_id)
    ex.secrets = tuple(push_values(target, required=False).values())  # masked in all output
    try:
        yield target, ex
    finally:
        ex.conn.close()


def _facts(target: Target, ex: Executor, step_logs: bool = False) -> HostFacts:
    data_dir = target.settings.get("data_dir")
    platforms = all_platforms()
    dirs = {p.data_dir for p in platforms if p.data_dir} | ({data_dir} if data_dir else set())
    return gather(ex, platforms, tuple(sorted(dirs)), step_logs=step_logs)


@task(help={"json": "print the facts as one JSON object"})
@reports_errors
def facts(c: Context, json_: bool = False) -> None:
    """Gather the host's facts in ONE remote execution and show them (changes nothing).

    Example: gpu-provision -H root@203.0.113.10:22 facts --json
    """
    with session(c) as (target, ex):
        f = _facts(target, ex)
    if json_:
        output.print_json(f.as_json())
    else:
        output.facts_table(target.name, f)


@task(help={"json": "print the plan as JSON", "python": "env Python, e.g. 3.11",
            "torch": "torch spec: 2.5 | 2.5.1 | '>=2.4,<2.6'", "recipe": "recipe name",
            "platform": "platform profile name", "cuda_compat": "strict (default) or minor",
            "env_name": "conda env name"})
@reports_errors
def plan(c: Context, json_: bool = False, python: str | None = None, torch: str | None = None,
         recipe: str | None = None, platform: str | None = None, cuda_compat: str | None = None,
         env_name: str | None = None) -> None:
    """Show every decision bootstrap would take, with its reason. A true dry run.

    Example: gpu-provision -H my-4090 plan --torch 2.5
    """
    cli = _cli_settings(python, torch, recipe, platform, cuda_compat, env_name)
    with session(c) as (target, ex):
        p = _plan_for(c, ex, target, cli, push=True)
    if json_:
        output.print_json(p.as_json())
    else:
        output.plan_table(p)


def _plan_for(c: Context, ex: Executor, target: Target, cli: dict[str, Any],
              push: bool = False, revalidate: bool = False) -> Plan:
    """Facts (one remote execution), settings by precedence, the plan. ``push``: with the
    inventory's push_env tokens (each must be set in this shell); ``revalidate``: validation
    runs even when nothing it checks has changed."""
    f = _facts(target, ex)
    settings = settings_for(target, f.platform, cli)
    values = push_values(target) if push else {}
    return make_plan(target.name, f, settings, load_platform(settings.platform), values,
                     digest(values) if values else "", revalidate=revalidate)


def _apply(c: Context, target: Target, ex: Executor, p: Plan, cli: dict[str, Any],
           only: set[str] | None = None) -> Outcome:
    """Apply ``p``; a reboot reconnects to the same target and re-plans from fresh facts."""
    return apply(ex, p, only=only,
                 reconnect=lambda: open_executor(target, ex.log_dir or Path("logs")),
                 replan=lambda new: _plan_for(c, new, target, cli, push=only is None))


@task(help={"python": "env Python, e.g. 3.11", "torch": "torch spec: 2.5 | 2.5.1 | '>=2.4,<2.6'",
            "recipe": "recipe name", "platform": "platform profile name",
            "cuda_compat": "strict (default) or minor", "env_name": "conda env name"})
@reports_errors
def bootstrap(c: Context, python: str | None = None, torch: str | None = None,
              recipe: str | None = None, platform: str | None = None,
              cuda_compat: str | None = None, env_name: str | None = None) -> dict[str, Any]:
    """Turn the host into a validated PyTorch env: conda, env, torch, packages, validation.

    Safe to repeat: a provisioned host is checked in one remote execution and left unchanged;
    validation runs again once anything it checks has changed (or after 6 hours).
    Example: gpu-provision -H my-4090 bootstrap
    """
    cli = _cli_settings(python, torch, recipe, platform, cuda_compat, env_name)
    with session(c) as (target, ex):
        p = _plan_for(c, ex, target, cli, push=True)
        for r in p.risks:
            output.console.print(f"[yellow]risk:[/] {r}")
        outcome = _apply(c, target, ex, p, cli)
    output.steps_table(target.name, outcome.steps, outcome.executions)
    if outcome.report is not None:
        output.verdict_table(target.name, outcome.report, outcome.report_path)
        if outcome.verdict == "FAIL":
            raise Exit(f"validation verdict FAIL (report {outcome.report_path})", code=1)
    return {"steps": outcome.steps, "verdict": outcome.verdict}


@task(help={"recipe": "recipe name", "platform": "platform profile name"})
@reports_errors
def validate(c: Context, recipe: str | None = None, platform: str | None = None) -> None:
    """Run validate_gpu.py in the env and show the verdict (exit 1 on FAIL).

    Example: gpu-provision -H my-4090 validate
    """
    with session(c) as (target, ex):
        p = _plan_for(c, ex, target, _cli_settings(None, None, recipe, platform, None, None),
                      revalidate=True)
        _require_env(p, "validate")
        outcome = apply(ex, p, only={"validate"})
    assert outcome.report is not None
    output.verdict_table(target.name, outcome.report, outcome.report_path)
    if outcome.verdict == "FAIL":
        raise Exit(code=1)


@task(help={"junit": "the JUnit XML file (default reports/<host>/verify-<time>.xml)"})
@reports_errors
def verify(c: Context, junit: str | None = None) -> None:
    """Run the shipped pytest-testinfra suite against the host (exit 1 when a check fails).

    It uses this tool's connection (key, port, pinned host key) and checks what the last
    bootstrap recorded: driver, GPUs, conda, env, torch and its CUDA, mirrors, held driver
    packages, no stale lock. Example: gpu-provision -H my-4090 verify
    """
    need("pytest", "testinfra", extra="verify")
    import pytest

    target = target_of(c)
    path = Path(junit) if junit else \
        Path("reports") / host_dir(target.name) / f"verify-{time.strftime('%Y%m%d-%H%M%S')}.xml"
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = connect(target, notify=_notify)

    class HandOver:  # gives the suite our open, pinned connection
        def pytest_configure(self, config: Any) -> None:
            config.gpu_provision_client = conn.client

    try:
        with _PYTEST, as_dir(verify_suite()) as suite:  # pytest.main is not thread-safe: hosts take turns
            code = pytest.main([str(suite), f"--hosts=paramiko://{target.user}@{target.host}:"
                                f"{target.port}", "-c", os.devnull, "--rootdir", str(suite),
                                "-p", "no:cacheprovider", "-q", "-rfEs", f"--junitxml={path}"],
                               plugins=[HandOver()])
    finally:
        conn.close()
    output.console.print(f"verify: {target.name}: {'all checks passed' if code == 0 else 'FAILED'}"
                         f" (JUnit XML: {path})")
    if code != 0:
        raise Exit(code=1)


@task(iterable=["log"], help={"log": "a file holding an error text to diagnose (repeatable); "
                                     "without -H only these are read",
                              "json": "print the findings as JSON"})
@reports_errors
def doctor(c: Context, log: list[str] | None = None, json_: bool = False) -> None:
    """Match the host's state and error texts against known failures and print each fix.

    Reads the facts (with the tail of each step's log on the host) in one remote execution, the
    last validation report and run logs here, and any --log file. Exit 1 when an error is found.
    Example: gpu-provision -H my-4090 doctor;  gpu-provision doctor --log traceback.txt
    """
    files = {}
    for name in log or []:
        try:
            files[name] = Path(name).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ProvisionError(f"--log {name}: cannot read it ({exc.strerror})") from None
    if isinstance(c, Connection):
        host = target_of(c).name
        report, logs = last_report(host), last_logs(host)  # before this run adds its own
        with session(c) as (target, ex):
            f = _facts(target, ex, step_logs=True)
            settings = settings_for(target, f.platform, {})
            p = make_plan(target.name, f, settings, load_platform(settings.platform))
        findings = diagnose(texts_for(f, report, logs, files), f, p, host=host)
    elif files:
        host = "<host>"
        findings = diagnose(files)
    else:
        raise ProvisionError("doctor needs a host (-H <inventory | user@host:port>) or "
                             "--log FILE with an error text")
    if json_:
        output.print_json([x.as_json() for x in findings])
    else:
        output.findings_table(host, findings)
    if any(x.level == "error" for x in findings):
        raise Exit(code=1)


def _require_env(p: Plan, what: str) -> None:
    if p.layout is None or p.facts is None or \
            not any(e.prefix == p.layout.env_prefix for e in p.facts.envs):
        raise ProvisionError(f"{p.host}: no env to {what} yet: run bootstrap first")


@task(help={"download_mb": "MiB downloaded from each mirror (default 50)",
            "json": "print the report as JSON"})
@reports_errors
def bench(c: Context, download_mb: int = 50, json_: bool = False) -> None:
    """Run the standard benchmark in the env and save reports/<host>/bench-<time>.json.

    matmul TFLOPS per dtype, memory and host-to-device bandwidth, a small CNN's training
    throughput, a detector's inference latency (batch 1 and 32), disk write/read in the data
    dir, CPU cores and a single-core score, download speed from each mirror. A host without a
    GPU runs it on the CPU, labelled so. Example: gpu-provision -H my-4090 bench
    """
    with session(c) as (target, ex):
        p = _plan_for(c, ex, target, {})
        _require_env(p, "benchmark")
        assert p.facts is not None and p.layout is not None
        step = validate_ops.bench_step(p.facts, p.layout, p.settings, p.torch, download_mb)
        output.console.print(f"{target.name}: bench: {step.reason} ...")
        result = run_step(ex, step, time.strftime("%Y%m%d-%H%M%S"))
    report = parse_marked(result.stdout, "BENCH_JSON", "bench_gpu.py")
    s = p.settings
    report.update(host=target.name, inventory=str(target.source) if target.source else None,
                  platform=s.platform, advertised=s.gpu, price_per_hour=s.price_per_hour,
                  currency=s.currency, at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    path = save_report(target.name, report, kind="bench")
    if json_:
        output.print_json(report)
    else:
        output.bench_table(target.name, report, path)


@task(iterable=["report"], help={
    "report": "a bench report file or glob, or `published` (repeatable; default: the newest "
              "reports/<host>/bench-*.json of each host)",
    "html": "where to write the page (default reports/compare.html; its PNG goes beside it)",
    "json": "print the rows as JSON"})
@reports_errors
def compare(c: Context, report: list[str] | None = None, html: str = "reports/compare.html",
            json_: bool = False) -> None:
    """Local: join saved bench reports with each host's price_per_hour and currency from its
    inventory; print a table sorted by value for money and write an HTML page with a chart.

    Example: gpu-provision compare --report 'reports/*/bench-*.json'
    """

    if report:  # as given (a pattern that matches nothing stands for itself, and is reported)
        paths = report_files(report)
    else:
        paths = newest_per_host(Path(p) for p in glob.glob("reports/*/bench-*.json"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing or not paths:
        raise ProvisionError(f"no bench report at {', '.join(missing or ['reports/*/bench-*.json'])}"
                             ": run `gpu-provision -H <host> bench` first")
    loaded = [(str(p), json.loads(p.read_text())) for p in paths]
    table = rows(loaded, _price_of)
    notes = sorted({r["published"] for _, r in loaded if r.get("published")})
    png = chart.write(table, Path(html), notes)
    if json_:
        output.print_json([r.as_json() for r in table])
    else:
        output.compare_table(table, notes)
        output.console.print(f"wrote {html} and {png}")


def _price_of(report: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """The price in the host's inventory now, else what the report recorded at bench time."""
    for spec in (report.get("inventory"), report.get("host")):
        if not spec:
            continue
        try:
            target = resolve_target(str(spec))
        except ProvisionError:
            continue
        if target.source is not None and "price_per_hour" in target.settings:
            return float(target.settings["price_per_hour"]), target.settings.get("currency")
    price = report.get("price_per_hour")
    return (float(price) if price is not None else None), report.get("currency")


def _cli_settings(python: str | None, torch: str | None, recipe: str | None,
                  platform: str | None, cuda_compat: str | None,
                  env_name: str | None) -> dict[str, Any]:
    """Command-line values, checked like the YAML ones (the error names the option)."""
    cli = {"python": python, "torch": torch, "recipe": recipe, "platform": platform,
           "cuda_compat": cuda_compat, "env_name": env_name}
    for key, check in (("python", v.python_version), ("torch", v.torch_spec),
                       ("env_name", v.name), ("recipe", v.name), ("platform", v.name),
                       ("cuda_compat", v.one_of("strict", "minor"))):
        value = cli[key]
        problem = check(value) if value is not None else None
        if problem:
            raise ProvisionError(f"--{key.replace('_', '-')}: {problem}")
    return cli


def _apply_only(c: Context, names: set[str], cli: dict[str, Any]) -> None:
    with session(c) as (target, ex):
        outcome = _apply(c, target, ex, _plan_for(c, ex, target, cli), cli, only=names)
    output.steps_table(target.name, outcome.steps, outcome.executions)


@task(name="conda")
@reports_errors
def conda_task(c: Context, recipe: str | None = None, platform: str | None = None) -> None:
    """Install Miniconda from the mirror (sha256 checked) with .condarc and pip.conf, if missing."""
    _apply_only(c, {"conda"}, _cli_settings(None, None, recipe, platform, None, None))


@task(name="env", help={"python": "env Python, e.g. 3.11", "env_name": "conda env name"})
@reports_errors
def env_task(c: Context, python: str | None = None, env_name: str | None = None,
             recipe: str | None = None, platform: str | None = None) -> None:
    """Create the conda env (or adopt the platform's), if missing."""
    _apply_only(c, {"env"}, _cli_settings(python, None, recipe, platform, None, env_name))


@task(name="torch", help={"torch": "torch spec: 2.5 | 2.5.1 | '>=2.4,<2.6'",
                          "cuda_compat": "strict (default) or minor"})
@reports_errors
def torch_task(c: Context, torch: str | None = None, cuda_compat: str | None = None,
               recipe: str | None = None, platform: str | None = None) -> None:
    """Install the chosen torch build (and the recipe's packages) into the env, if needed."""
    _apply_only(c, {"torch", "packages"},
                _cli_settings(None, torch, recipe, platform, cuda_compat, None))


@task(name="driver")
@reports_errors
def driver_task(c: Context) -> None:
    """Install the NVIDIA driver where missing or too old (hosts we may touch), then hold it.

    Reboots only when the module cannot load otherwise, requires a new boot id, and verifies
    nvidia-smi before holding the packages.

    Example: gpu-provision -H my-vm driver
    """
    with session(c) as (target, ex):
        p = _plan_for(c, ex, target, {})
        decision = next(d for d in p.decisions if d.step == "driver")
        if not any(s.name == "driver" for s in p.steps):
            output.console.print(f"{target.name}: driver: nothing to do - {decision.reason}")
            if p.blocked:
                raise ProvisionError(f"{target.name}: {p.blocked}")
            return
        outcome = _apply(c, target, ex, p, {}, only={"driver"})
    output.steps_table(target.name, outcome.steps, outcome.executions)


@task(help={"driver": "NVIDIA driver version, e.g. 550.54.14 (omit: no GPU)",
            "compute_cap": "compute capability per GPU, comma separated: 8.6,12.0",
            "python": "Python version of the env (default 3.11)",
            "torch": "torch spec: 2.5 | 2.5.1 | '>=2.4,<2.6' (default newest)",
            "cuda_compat": "strict (default) or minor (NVIDIA minor-version compatibility)",
            "glibc": "the host's glibc, e.g. 2.17 on CentOS 7",
            "index": "PyTorch index prefix holding <variant>/ (a mirror)",
            "json": "print one JSON object"})
@reports_errors
def pick(c: Context, driver: str | None = None, compute_cap: str | None = None,
         python: str = "3.11", torch: str | None = None, cuda_compat: str = "strict",
         glibc: str | None = None, index: str | None = None, json_: bool = False) -> None:
    """Offline: which torch wheel fits this driver, GPU and Python (exit 2 when none does).

    Example: gpu-provision pick --driver 550.54.14 --compute-cap 8.9 --python 3.10 --json
    """
    caps = [x for x in (compute_cap or "").split(",") if x.strip()]
    if caps and not driver:
        raise ProvisionError("--compute-cap given without --driver: a GPU needs a driver "
                             "(omit both for a host without a GPU)")
    choice = choose_torch(driver=driver, compute_caps=caps, python=python, torch=torch,
                          cuda_compat=cuda_compat, glibc=glibc, index=index)
    if json_:
        output.print_json(choice.as_json())
    else:
        output.choice_text(choice)


@task(name="refresh-compat", help={"index": "PyTorch index prefix (default pytorch.org)",
                                   "json": "print the diff as JSON",
                                   "write": "write the refreshed compat YAML to this file"})
@reports_errors
def refresh_compat(c: Context, index: str | None = None, json_: bool = False,
                   write: str | None = None) -> None:
    """Diff the wheel data against a live PyTorch index; --write saves a refreshed copy.

    The written file adds the index's new releases and variants, for review.

    Example: gpu-provision refresh-compat --write compat-new.yaml
    """
    data = load_compat()
    variants = sorted(data.variant_cuda) + ["cpu"]
    found = scan_index(index or data.default_index, variants)
    diff = diff_index(data, found, variants)
    if write:
        import yaml
        raw = yaml.safe_load(compat_text()[0])
        new, notes = refreshed_yaml(raw, data, found)
        tmp = Path(write).with_suffix(".tmp")
        tmp.write_text("# refreshed from " + (index or data.default_index) + "; review, then "
                       "replace provision/data/compat.yaml\n" + "".join(f"# {n}\n" for n in notes)
                       + yaml.safe_dump(new, sort_keys=False, width=100))
        tmp.replace(write)
        output.err_console.print(f"wrote {write} ({len(notes)} change(s))")
    if json_:
        output.print_json({"added": diff.added, "removed": diff.removed,
                           "python_changed": diff.python_changed})
    elif diff.empty:
        output.console.print("the wheel data matches the index")
    else:
        for line in diff.lines():
            output.console.print(line)


@task(help={})
@reports_errors
def repin(c: Context) -> None:
    """Accept the host's current SSH key, replacing the pinned one (after a rebuild or reuse).

    Example: gpu-provision -H root@203.0.113.10:2222 repin
    """
    target = target_of(c)
    connect(target, notify=_notify, replace_key=True).close()


@task(name="forget-secrets", aliases=["forget"])
@reports_errors
def forget_secrets(c: Context) -> None:
    """Remove the tokens pushed with push_env from the host (env file, .bashrc line, journal).

    Example: gpu-provision -H my-4090 forget-secrets
    """
    with session(c) as (target, ex):
        r = ex.run(bash_script(forget_secrets_body()), step="forget-secrets")
    names = r.stdout.rsplit("FORGOTTEN ", 1)[-1].strip()
    output.console.print(f"{target.name}: removed {names} from the host"
                         if names != "nothing" else f"{target.name}: no pushed tokens to remove")


@task(help={"pubkey": "public key to install (default: the inventory's key + .pub, else "
                      "~/.ssh/id_ed25519.pub or id_rsa.pub)",
            "password_env": "read the password from this environment variable (else a prompt)"})
@reports_errors
def authorize(c: Context, pubkey: str | None = None, password_env: str | None = None) -> None:
    """Install your public key with the host's password, once; later runs log in by key.

    Example: gpu-provision -H root@203.0.113.10:22 authorize -i ~/.ssh/id_ed25519
    """
    target = target_of(c)
    text = authorize_key(target, pubkey, password_env or target.password_env, _notify)
    output.console.print(f"{target.name}: {text}")


@task(name="forget-host-key")
@reports_errors
def forget_host_key(c: Context) -> None:
    """Remove the host's pinned SSH key from our known_hosts file."""
    target = target_of(c)
    found = forget_pin(target)
    output.console.print(f"{target.pin_name}: {'forgotten' if found else 'was not pinned'} "
                         f"({known_hosts_path()})")
