"""Many hosts at once: Fabric runs one call per host in turn; this executor runs them in
parallel with bounded concurrency, keeps going when one host fails, and ends with one summary
table (on stderr when the task prints JSON: then each host's JSON is one line on stdout). The
exit code says whether any host failed. `fab` in a checkout uses it too (fabfile.py), so the
refused flags and ``--`` are checked here as well as in cli.py."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fabric import Executor
from invoke.exceptions import Exit

from ..config.inventory import expand_hosts
from ..errors import ProvisionError, RemoteError
from ..ui import console as output
from .taskkit import host_target, take_command


# the work is waiting on the network: threads are cheap, a second wave of hosts is not
def max_parallel() -> int:
    """$GPU_PROVISION_PARALLEL, read when a run starts (a warm worker gets it then)."""
    return int(os.environ.get("GPU_PROVISION_PARALLEL", "32"))


class ParallelExecutor(Executor):  # type: ignore[misc]
    def expand_calls(self, calls: Any, apply_hosts: bool = True) -> Any:
        """Inventory groups in ``-H`` become their member hosts first. (The words after ``--``
        were taken from Fabric by ``take_command`` in ``execute``.)"""
        hosts = self.core[0].args.hosts if apply_hosts and self.core else None
        if hosts is not None and hosts.value:
            try:
                hosts.value = ",".join(expand_hosts(hosts.value))
            except ProvisionError as exc:
                raise Exit(f"error: {exc}", code=exc.exit_code) from None
        return super().expand_calls(calls, apply_hosts)

    def execute(self, *tasks: Any) -> dict[Any, Any]:
        take_command(self.core, [call.task for call in self.normalize(tasks)])
        calls = self.expand_calls(self.normalize(tasks))
        hosts = [c for c in calls if getattr(c, "init_kwargs", None)]
        if len(hosts) >= 2 and all(getattr(c.task, "whole_fleet", False) for c in hosts):
            return self.whole_fleet(hosts)
        if len(hosts) < 2:
            return super().execute(*tasks)  # type: ignore[no-any-return]
        for c in hosts:  # a flag naming one machine (autostop --instance-id) serves one host
            for flag in getattr(c.task, "one_host_flags", ()):
                if c.kwargs.get(flag):
                    raise Exit(f"error: --{flag.replace('_', '-')} names one machine: give it "
                               f"with one host (-H {c.init_kwargs['host']}), not with "
                               f"{len(hosts)} hosts", code=2)
        output.json_lines = True  # several hosts' JSON at once: one line each
        config = self.config
        jobs = []
        for call in calls:  # contexts are made one by one: config loading is not thread-safe
            config.load_collection(self.collection.configuration(call.called_as))
            config.load_shell_env()
            jobs.append((call, call.make_context(config)))
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=max(1, min(max_parallel(), len(jobs)))) as pool:
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
            raise Exit("error: give the hosts once: -H a,b or --hosts a,b", code=2)
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
            return host_target(ctx, spec).name
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
        if exc.code and exc.message:  # (a task that showed its failure itself has none)
            host = label(ctx)
            text = without_host(str(error), host, error) if error is not None else "failed"
            output.err_console.print(f"{host}: error: {text.removeprefix('error: ')}",
                                     markup=False)
        return HostResult(None, error, int(exc.code or 0), time.monotonic() - started)
    except Exception as exc:  # one host's failure never hides the others
        output.err_console.print(f"{label(ctx)}: {type(exc).__name__}: {exc}", markup=False)
        return HostResult(None, f"{type(exc).__name__}: {exc}", 1, time.monotonic() - started)


def without_host(text: str, host: str, error: object = None) -> str:
    """``text`` without a leading host name (the row or line already names it)."""
    text = text.removeprefix("error: ")
    for prefix in {host, getattr(error, "host", "")} - {""}:
        text = text.removeprefix(f"{prefix}: ")
    return text


def failure_cell(error: ProvisionError | str, host: str = "") -> str:
    """What failed, without the host (its row names it): a failed step's name, exit code and
    the last lines of its output; an SSH failure's kind and message; else the message."""
    if isinstance(error, RemoteError):
        lines = [f"step {error.step!r} failed with exit code {error.remote_exit}",
                 *[ln for ln in error.output.strip().splitlines() if ln.strip()][-4:]]
    else:
        text = without_host(str(error), host, error)
        lines = [ln for ln in text.splitlines() if ln.strip()][:5]
    return "failed: " + "\n".join(ln[:160] for ln in lines or ["failed"])


def summary(rows: list[tuple[Any, HostResult]], wall: float) -> None:
    from rich.text import Text
    t = output.table(f"summary: {len(rows)} hosts in {wall:.1f}s", "host", "result",
                     "steps (seconds)", "seconds>")
    for ctx, r in rows:
        value = r.value if isinstance(r.value, dict) else {}
        steps = ", ".join(f"{n} {s:.1f}" for n, res, s in value.get("steps", []) if res != "skipped")
        host = label(ctx)
        # Text, not markup: error output may hold [brackets]
        result = Text(failure_cell(r.error, host), style="red") if r.error else \
            Text(f"ok{(' ' + value['verdict']) if value.get('verdict') else ''}")
        t.add_row(Text(host), result, steps or "-", f"{r.seconds:.1f}")
    output.console.print(t)
