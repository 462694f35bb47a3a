"""One rich console for everything the user reads; renderers take values and the console to
print to (``out``, the terminal by default; tests give one that writes to a buffer).

rich is imported when the first thing is printed, not with this module: ``--json`` output and
the program's start-up do without it. Nothing is cut: piped (no terminal, no ``$COLUMNS``) a
table takes its own width, one row per line; on a terminal, or at ``$COLUMNS``, cells wrap
(``overflow="fold"``) instead of ending in an ellipsis.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from .bootstrap import Applied
    from .compat import TorchChoice
    from .doctor import Finding
    from .facts.host import HostFacts
    from .plan import Plan

    console: Console  # what people read (stderr once a task prints JSON)
    err_console: Console  # errors and side notes

_CONSOLES: dict[str, Any] = {}
_JSON_LOCK = threading.Lock()
json_lines = False  # several hosts print JSON at once: one compact line each


PIPE_WIDTH = 1000  # piped, with no $COLUMNS: a table's own width (a row per line), not 80


def _make(name: str) -> Console:
    from rich.console import Console
    stream = sys.stdout if name == "console" else sys.stderr
    piped = not stream.isatty() and not os.environ.get("COLUMNS")
    made = Console(stderr=name != "console", highlight=False, soft_wrap=True,
                   width=PIPE_WIDTH if piped else None)
    kept: Console = _CONSOLES.setdefault(name, made)
    return kept


_HUMANS = {"to": "console"}  # which console `console` is: "err_console" once JSON owns stdout


def __getattr__(name: str) -> Any:
    if name == "console" and _HUMANS["to"] == "err_console":
        name = "err_console"
    if name in ("console", "err_console"):
        return _CONSOLES.get(name) or _make(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def humans_to_stderr() -> None:
    """From now on what people read goes to stderr: stdout is kept for JSON. (Nothing is
    imported until something is printed.)"""
    _HUMANS["to"] = "err_console"


def print_json(data: Any) -> None:
    """One JSON value on stdout (with several hosts at once: one line per value)."""
    text = json.dumps(data, default=str) if json_lines else \
        json.dumps(data, indent=2, sort_keys=False, default=str)
    with _JSON_LOCK:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def table(title: str, *columns: str, show_header: bool = True, **kw: Any) -> Table:
    """A table whose cells wrap rather than being cut; ``columns`` ending in ``>`` are
    right-aligned, the first is bold."""
    from rich.table import Table
    t = Table(title=title, title_justify="left", show_header=show_header, **kw)
    for i, col in enumerate(columns):
        right = col.endswith(">")
        t.add_column(col.rstrip(">"), justify="right" if right else "left", overflow="fold",
                     style="bold" if i == 0 else None)
    return t


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape
    return rich_escape(text)


def facts_table(host: str, f: HostFacts, out: Console | None = None) -> None:
    out = out or __getattr__("console")
    t = table(f"facts: {host}", "fact", "value", show_header=False)
    gpus = ", ".join(f"{g.index}: {g.name} ({g.memory_total_mib} MiB, sm {g.compute_cap}, "
                     f"{g.memory_used_mib} MiB used, {g.utilization_pct}% busy)" for g in f.gpus)
    rows = [
        ("os", f"{f.os.label} ({f.os.family or 'unknown family'}), kernel {f.kernel}, {f.arch}, "
               f"glibc {f.glibc}"),
        ("machine", f"{f.virtualization.kind} ({f.virtualization.what or '-'}: "
                    f"{f.virtualization.evidence}); pid 1 {f.pid1}"),
        ("platform", f"{f.platform or 'not detected'} ({f.platform_evidence})"),
        ("cpu", f"{f.cpu_model} x{f.cpu_cores}; memory {f.memory_gb} GB "
                f"({f.memory_available_gb} GB free)"),
        ("disk", "; ".join(f"{d.path}: {d.free_gb}/{d.total_gb} GB free" for d in f.disks) or "-"),
        ("user", "root" if f.root else ("sudo" if f.sudo else "no root, no sudo")),
        ("pci gpus", ", ".join(g.name for g in f.pci_gpus) or "none"),
        ("nvidia", f"{f.nvidia_state}: {f.nvidia_detail}"),
        ("driver", f"{f.driver or 'none'}"
                   + (f" ({'open' if f.driver_open else 'proprietary'} modules)"
                      if f.driver_open is not None else "")
                   + (f", CUDA <= {f.driver_cuda} ({f.driver_cuda_source})" if f.driver_cuda else "")),
        ("gpus", gpus or "none"),
        ("gpu processes", ", ".join(f"{p.pid} {p.name} {p.used_memory_mib} MiB"
                                    for p in f.gpu_processes) or "none"),
        ("nouveau", "loaded" if f.nouveau_loaded else "not loaded"),
        ("nvcc", f.nvcc or "none (not needed: wheels bring their own CUDA runtime)"),
        ("python", ", ".join(f.pythons) or "none"),
        ("conda", ", ".join(f.conda) or "none"),
        ("envs", ", ".join(f"{e.name} (py {e.python}, torch {e.torch or '-'})" for e in f.envs)
                 or "none"),
        ("mirrors", ", ".join(f"{k}={v}" for k, v in f.mirrors.items()) or "defaults"),
        ("boot id", f.boot_id),
        ("journal", "present" if f.journal else "none"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)
    for w in f.warnings:
        out.print(f"[yellow]warning:[/] {w}")


def plan_table(plan: Plan, out: Console | None = None) -> None:
    out = out or __getattr__("console")
    t = table(f"plan: {plan.host} (dry run: nothing was changed)", "step", "action", "why")
    for d in plan.decisions:
        t.add_row(d.step, d.action if d.changes else "[dim]nothing to do[/]", d.reason)
    out.print(t)
    for r in plan.risks:
        out.print(f"[yellow]risk:[/] {r}")
    if plan.blocked:
        out.print(f"[red]blocked:[/] {plan.blocked}")


def choice_text(choice: TorchChoice, out: Console | None = None) -> None:
    out = out or __getattr__("console")
    tv = f" torchvision {choice.torchvision}" if choice.torchvision else ""
    ta = f" torchaudio {choice.torchaudio}" if choice.torchaudio else " (no torchaudio)"
    out.print(f"[bold]{choice.label}[/]{tv}{ta}")
    out.print(f"index: {choice.index_url}")
    for r in choice.reasons:
        out.print(f"  - {r}")
    for r in choice.risks:
        out.print(f"  [yellow]risk:[/] {r}")
    pkgs = [f"torch=={choice.torch}"]
    if choice.torchvision:
        pkgs.append(f"torchvision=={choice.torchvision}")
    if choice.torchaudio:
        pkgs.append(f"torchaudio=={choice.torchaudio}")
    out.print(f"pip install {' '.join(pkgs)} --index-url {choice.index_url}")


def verdict_table(host: str, report: Mapping[str, Any], path: Any,
                  out: Console | None = None) -> None:
    out = out or __getattr__("console")
    colour = {"PASS": "green", "WARN": "yellow", "FAIL": "red"}[report["verdict"]]
    t = table(f"validate: {host} ({report['mode']} mode, torch {report.get('torch')}, "
              f"CUDA {report.get('cuda')})", "check", "status", "reason")
    for c in report["checks"]:
        t.add_row(c["name"], c["status"].upper(), c["reason"])
    out.print(t)
    out.print(f"verdict: [bold {colour}]{report['verdict']}[/] (report: {path})")


def steps_table(applied: Applied, out: Console | None = None) -> None:
    out = out or __getattr__("console")
    t = table(f"bootstrap: {applied.host} ({applied.executions} remote executions)",
              "step", "result", "seconds>")
    for s in applied.steps:
        t.add_row(s.name, s.result, f"{s.seconds:.1f}")
    out.print(t)


def findings_table(host: str, findings: Sequence[Finding], out: Console | None = None) -> None:
    """Blocks, not a table: fixes hold commands the user copies whole."""
    out = out or __getattr__("console")
    if not findings:
        out.print(f"doctor: {host}: no known problem found")
        return
    colour = {"error": "red", "warning": "yellow", "info": "cyan"}
    counts = ", ".join(f"{sum(f.level == lv for f in findings)} {lv}" for lv in colour
                       if any(f.level == lv for f in findings))
    out.print(f"doctor: {host}: {counts}")
    for f in findings:
        out.print(f"\n[bold {colour[f.level]}]{f.level}[/] {escape(f.diagnosis)}")
        out.print(f"  [bold]fix:[/] {escape(f.fix)}")
        out.print(f"  [dim]seen in {escape(f.evidence)}[/]")


def bench_table(host: str, r: dict[str, Any], path: Any, out: Console | None = None) -> None:
    from .compare import number
    out = out or __getattr__("console")
    t = table(f"bench: {host} ({r['mode']} mode, torch {r.get('torch')})", "figure", "value",
              show_header=False)
    for dtype, v in (r.get("tflops") or {}).items():
        t.add_row(f"matmul {dtype}", f"{v} TFLOPS")
    t.add_row("memory", number(r.get("memory_gb"), " GB"))
    t.add_row("host to device", number(r.get("h2d_gbs"), " GB/s"))
    t.add_row("CNN training", number(r.get("train_samples_s"), " samples/s"))
    t.add_row("detector inference", f"{number(r.get('infer_ms_b1'), ' ms', 2)} at batch 1, "
                                    f"{number(r.get('infer_ms_b32'), ' ms', 2)} at batch 32 "
                                    f"({number(r.get('infer_images_s'), ' images/s')})")
    t.add_row("disk", f"write {number(r.get('disk_write_mbs'), ' MB/s')}, read "
                      f"{number(r.get('disk_read_mbs'), ' MB/s')} ({r.get('disk_path')})")
    t.add_row("CPU", f"{r.get('cpu_cores')} cores, single-core score {r.get('cpu_single_score')}")
    for d in r.get("downloads") or []:
        t.add_row(f"download {d['kind']}", escape(number(d.get("mbs"), " MB/s") + f" {d['url']}"
                                                  + (f" ({d['error']})" if d.get("error") else "")))
    out.print(t)
    for n in r.get("notes") or []:
        out.print(f"note: {escape(n)}")
    out.print(f"report: {path}")


def compare_table(rows: Sequence[Any], notes: Sequence[str], out: Console | None = None) -> None:
    from .compare import money, number, significant
    out = out or __getattr__("console")
    t = table("compare: value for money (cheapest first)", "host", "platform", "GPU", "price/h>",
              "TFLOPS>", "samples/s>", "per 1M samples>", "per TFLOP-hour>", "download MB/s>")
    for r in rows:
        t.add_row(escape(r.host), r.platform or "-", escape(r.gpu), money(r.price, r.currency, 2),
                  significant(r.tflops) + (f" {r.tflops_dtype}" if r.tflops_dtype else ""),
                  number(r.samples_s), significant(r.cost_per_m_samples, r.currency),
                  significant(r.cost_per_tflop_hour, r.currency), number(r.download_mbs))
    out.print(t)
    for n in notes:
        out.print(f"note: {escape(n)}")
