"""Many hosts at once: Fabric runs one call per host in turn; this executor runs them in
parallel with bounded concurrency, keeps going when one host fails, and ends with one summary
table. The exit code says whether any host failed."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fabric import Executor
from invoke.exceptions import Exit
from rich.table import Table
from rich.text import Text

from . import output
from .errors import ProvisionError, RemoteError
from .inventory import expand_hosts, resolve_target

MAX_PARALLEL = int(os.environ.get("GPU_PROVISION_PARALLEL", "8"))


class ParallelExecutor(Executor):  # type: ignore[misc]
    def expand_calls(self, calls: Any, apply_hosts: bool = True) -> Any:
        """Inventory groups in ``-H`` become their member hosts first. A task that takes the
        words after ``--`` as its command (``takes_command``: ``run``) keeps them from Fabric,
        which would run them through a shell on every host."""
        hosts = self.core[0].args.hosts if apply_hosts and self.core else None
        if hosts is not None and hosts.value:
            try:
                hosts.value = ",".join(expand_hosts(hosts.value))
            except ProvisionError as exc:
                raise Exit(f"error: {exc}", code=exc.exit_code) from None
        remainder = getattr(self.core, "remainder", "")
        if remainder and any(getattr(getattr(c, "task", c), "takes_command", False) for c in calls):
            self.core.remainder = ""
            try:
                return super().expand_calls(calls, apply_hosts)
            finally:
                self.core.remainder = remainder
        return super().expand_calls(calls, apply_hosts)

    def execute(self, *tasks: Any) -> dict[Any, Any]:
        calls = self.expand_calls(self.normalize(tasks))
        hosts = [c for c in calls if getattr(c, "init_kwargs", None)]
        if len(hosts) >= 2 and all(getattr(c.task, "whole_fleet", False) for c in hosts):
            return self.whole_fleet(hosts)
        if len(hosts) < 2:
            return super().execute(*tasks)  # type: ignore[no-any-return]
        config = self.config
        jobs = []
        for call in calls:  # contexts are made one by one: config loading is not thread-safe
            config.load_collection(self.collection.configuration(call.called_as))
            config.load_shell_env()
            jobs.append((call, call.make_context(config)))
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(jobs)))) as pool:
            futures = [(call, ctx, pool.submit(_run, call, ctx)) for call, ctx in jobs]
            rows = [(ctx, f.result()) for _, ctx, f in futures]
        summary(rows, time.monotonic() - started)
        failed = [r for _, r in rows if r.error is not None]
        if failed:
            raise Exit(code=max(r.code for r in failed))
        return {call.task: r.value for (call, _), (_, r) in zip(jobs, rows, strict=True)}


    def whole_fleet(self, calls: list[Any]) -> dict[Any, Any]:
        """A task that shows every host together (``whole_fleet``: watch's one table, jobs) is
        called once, with the first host's context and every host in ``hosts``."""
        first = calls[0]
        if first.kwargs.get("hosts"):
            raise Exit("error: give the hosts once: -H a,b or --hosts a,b", code=1)
        self.config.load_collection(self.collection.configuration(first.called_as))
        self.config.load_shell_env()
        ctx = first.make_context(self.config)
        specs = ",".join(str(c.init_kwargs["host"]) for c in calls)
        return {first.task: first.task(ctx, *first.args, **{**first.kwargs, "hosts": specs})}


def label(ctx: Any) -> str:
    """The host as the user wrote it: the inventory's name, or user@host:port."""
    spec = getattr(ctx, "original_host", None)
    if spec:
        try:
            return resolve_target(spec, user=ctx.user, port=ctx.port, host=ctx.host).name
        except ProvisionError:
            return str(spec)
    return f"{getattr(ctx, 'user', '?')}@{getattr(ctx, 'host', '?')}:{getattr(ctx, 'port', '?')}"


@dataclass
class HostResult:
    value: Any
    error: ProvisionError | str | None  # the error itself where the task raised one
    code: int
    seconds: float


def _run(call: Any, ctx: Any) -> HostResult:
    started = time.monotonic()
    try:
        value = call.task(ctx, *call.args, **call.kwargs)
        return HostResult(value, None, 0, time.monotonic() - started)
    except Exit as exc:
        error: ProvisionError | str | None = getattr(exc, "error", None) or (
            str(exc.message or "failed") if exc.code else None)
        if exc.code:
            output.err_console.print(f"{label(ctx)}: {exc.message or 'failed'}", markup=False)
        return HostResult(None, error, int(exc.code or 0), time.monotonic() - started)
    except Exception as exc:  # one host's failure never hides the others
        output.err_console.print(f"{label(ctx)}: {type(exc).__name__}: {exc}", markup=False)
        return HostResult(None, f"{type(exc).__name__}: {exc}", 1, time.monotonic() - started)


def failure_cell(error: ProvisionError | str, host: str = "") -> str:
    """What failed, without the host (its row names it): a failed step's name, exit code and
    the last lines of its output; an SSH failure's kind and message; else the message."""
    if isinstance(error, RemoteError):
        lines = [f"step {error.step!r} failed with exit code {error.remote_exit}",
                 *[ln for ln in error.output.strip().splitlines() if ln.strip()][-4:]]
    else:
        text = str(error)
        for prefix in {host, getattr(error, "host", "")} - {""}:
            text = text.removeprefix(f"{prefix}: ")
        lines = [ln for ln in text.splitlines() if ln.strip()][:5]
    return "failed: " + "\n".join(ln[:160] for ln in lines or ["failed"])


def summary(rows: list[tuple[Any, HostResult]], wall: float) -> None:
    t = Table(title=f"summary: {len(rows)} hosts in {wall:.1f}s", title_justify="left")
    t.add_column("host", style="bold")
    t.add_column("result", overflow="fold")
    t.add_column("steps (seconds)")
    t.add_column("seconds", justify="right")
    for ctx, r in rows:
        value = r.value if isinstance(r.value, dict) else {}
        steps = ", ".join(f"{n} {s:.1f}" for n, res, s in value.get("steps", []) if res != "skipped")
        host = label(ctx)
        # Text, not markup: error output may hold [brackets]
        result = Text(failure_cell(r.error, host), style="red") if r.error else \
            Text(f"ok{(' ' + value['verdict']) if value.get('verdict') else ''}")
        t.add_row(Text(host), result, steps or "-", f"{r.seconds:.1f}")
    output.console.print(t)
