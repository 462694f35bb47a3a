"""One rich console for everything the user reads; renderers take values and the console to
print to (``out``, the terminal by default; tests give one that writes to a buffer)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .compat import TorchChoice
from .doctor import Finding
from .facts.host import HostFacts
from .plan import Plan

if TYPE_CHECKING:
    from .bootstrap import Applied

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def facts_table(host: str, f: HostFacts, out: Console = console) -> None:
    t = Table(title=f"facts: {host}", show_header=False, title_justify="left")
    t.add_column("fact", style="bold")
    t.add_column("value")
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


def plan_table(plan: Plan, out: Console = console) -> None:
    t = Table(title=f"plan: {plan.host} (dry run: nothing was changed)", title_justify="left")
    t.add_column("step", style="bold")
    t.add_column("action")
    t.add_column("why")
    for d in plan.decisions:
        t.add_row(d.step, d.action if d.changes else "[dim]nothing to do[/]", d.reason)
    out.print(t)
    for r in plan.risks:
        out.print(f"[yellow]risk:[/] {r}")
    if plan.blocked:
        out.print(f"[red]blocked:[/] {plan.blocked}")


def choice_text(choice: TorchChoice, out: Console = console) -> None:
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
                  out: Console = console) -> None:
    colour = {"PASS": "green", "WARN": "yellow", "FAIL": "red"}[report["verdict"]]
    t = Table(title=f"validate: {host} ({report['mode']} mode, torch {report.get('torch')}, "
                    f"CUDA {report.get('cuda')})", title_justify="left")
    t.add_column("check", style="bold")
    t.add_column("status")
    t.add_column("reason")
    for c in report["checks"]:
        t.add_row(c["name"], c["status"].upper(), c["reason"])
    out.print(t)
    out.print(f"verdict: [bold {colour}]{report['verdict']}[/] (report: {path})")


def steps_table(applied: Applied, out: Console = console) -> None:
    t = Table(title=f"bootstrap: {applied.host} ({applied.executions} remote executions)",
              title_justify="left")
    t.add_column("step", style="bold")
    t.add_column("result")
    t.add_column("seconds", justify="right")
    for s in applied.steps:
        t.add_row(s.name, s.result, f"{s.seconds:.1f}")
    out.print(t)


def findings_table(host: str, findings: Sequence[Finding], out: Console = console) -> None:
    """Blocks, not a table: fixes hold commands the user copies whole."""
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


def bench_table(host: str, r: dict[str, Any], path: Any, out: Console = console) -> None:
    from .compare import number
    t = Table(title=f"bench: {host} ({r['mode']} mode, torch {r.get('torch')})",
              title_justify="left", show_header=False)
    t.add_column("figure", style="bold")
    t.add_column("value")
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
    link = r.get("link") or {}
    t.add_row("link (this machine)", f"up {number(link.get('up_mbs'), ' MB/s')}, down "
                                     f"{number(link.get('down_mbs'), ' MB/s')}"
              + (f" ({escape(link['error'])})" if link.get("error") else ""))
    for d in r.get("downloads") or []:
        t.add_row(f"download {d['kind']}", escape(number(d.get("mbs"), " MB/s") + f" {d['url']}"
                                                  + (f" ({d['error']})" if d.get("error") else "")))
    out.print(t)
    for n in r.get("notes") or []:
        out.print(f"note: {escape(n)}")
    out.print(f"report: {path}")


def compare_table(rows: Sequence[Any], notes: Sequence[str], out: Console = console) -> None:
    from .compare import money, number, upload_text
    t = Table(title="compare: value for money (cheapest first)", title_justify="left")
    for col in ("host", "platform", "GPU", "price/h", "TFLOPS", "samples/s", "per 1M samples",
                "per TFLOP-hour", "download MB/s", "link up/down MB/s", "100 GB up"):
        t.add_column(col, justify="right" if col not in ("host", "platform", "GPU") else "left")
    for r in rows:
        t.add_row(escape(r.host), r.platform or "-", escape(r.gpu), money(r.price, r.currency, 2),
                  number(r.tflops) + (f" {r.tflops_dtype}" if r.tflops_dtype else ""),
                  number(r.samples_s), money(r.cost_per_m_samples, r.currency),
                  money(r.cost_per_tflop_hour, r.currency), number(r.download_mbs),
                  f"{number(r.link_up_mbs)} / {number(r.link_down_mbs)}", upload_text(r))
    out.print(t)
    for n in notes:
        out.print(f"note: {escape(n)}")
