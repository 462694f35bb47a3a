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
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..units import size

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table
    from rich.text import Text

    from ..doctor.match import Finding
    from ..facts.host import HostFacts
    from ..jobs.monitor import Monitor
    from ..jobs.remote import Launched
    from ..jobs.spec import JobSpec
    from ..jobs.state import HostJobs
    from ..wheels.rule import TorchChoice

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
    # markup and emoji off: a string printed here is shown as it is, never read as our markup
    # (a rented host's GPU name or log line must not make links or hide text); styling is Text
    made = Console(stderr=name != "console", highlight=False, soft_wrap=True, markup=False,
                   emoji=False, width=PIPE_WIDTH if piped else None)
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


def text(*parts: str | tuple[str, str]) -> Text:
    """The one way text reaches the console: host strings and our styling side by side, never
    parsed as markup. ``text(("risk:", "yellow"), " ", reason)``."""
    from rich.text import Text
    return Text.assemble(*parts)


def table(title: str, *columns: str, show_header: bool = True, **kw: Any) -> Table:
    """A table whose cells wrap rather than being cut; ``columns`` ending in ``>`` are
    right-aligned, the first is bold. Its title and every string cell are plain text."""
    from rich.table import Table
    from rich.text import Text

    class Plain(Table):
        def add_row(self, *cells: Any, **row: Any) -> None:
            super().add_row(*(Text(c) if isinstance(c, str) else c for c in cells), **row)

    t = Plain(title=Text(title), title_justify="left", show_header=show_header, **kw)
    for i, col in enumerate(columns):
        right = col.endswith(">")
        t.add_column(col.rstrip(">"), justify="right" if right else "left", overflow="fold",
                     style="bold" if i == 0 else None)
    return t


def _cgroup_text(f: Any) -> str:
    """"; a job gets 2 GB and 1.5 cores (the cgroup's limit)" where the cgroup allows less than
    /proc and nproc show."""
    lim, parts = f.limits, []
    if lim.memory_limit_gb is not None and lim.memory_limit_gb < f.memory_gb:
        parts.append(f"{lim.memory_limit_gb:g} GB")
    if lim.cpu_quota is not None and lim.cpu_quota < f.cpu_cores:
        parts.append(f"{lim.cpu_quota:g} cores")
    return f"; a job gets {' and '.join(parts)} (the cgroup's limit)" if parts else ""

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
                f"({f.memory_available_gb} GB free)" + _cgroup_text(f)),
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
        ("torch outside conda", ", ".join(f"{t.python_bin} (py {t.python}, torch {t.torch})"
                                          for t in f.image_torches) or "none"),
        ("mirrors", ", ".join(f"{k}={v}" for k, v in f.mirrors.items()) or "defaults"),
        ("boot id", f.boot_id),
        ("journal", "present" if f.journal else "none"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)
    for w in f.warnings:
        out.print(text(("warning:", "yellow"), f" {w}"))


def choice_text(choice: TorchChoice, out: Console | None = None) -> None:
    out = out or __getattr__("console")
    tv = f" torchvision {choice.torchvision}" if choice.torchvision else ""
    ta = f" torchaudio {choice.torchaudio}" if choice.torchaudio else " (no torchaudio)"
    out.print(text((choice.label, "bold"), f"{tv}{ta}"))
    out.print(text(f"index: {choice.index_url}"))
    for r in choice.reasons:
        out.print(text(f"  - {r}"))
    for r in choice.risks:
        out.print(text("  ", ("risk:", "yellow"), f" {r}"))
    pkgs = [f"torch=={choice.torch}"]
    if choice.torchvision:
        pkgs.append(f"torchvision=={choice.torchvision}")
    if choice.torchaudio:
        pkgs.append(f"torchaudio=={choice.torchaudio}")
    out.print(text(f"pip install {' '.join(pkgs)} --index-url {choice.index_url}"))


def verdict_table(host: str, report: Mapping[str, Any], path: Any,
                  out: Console | None = None) -> None:
    out = out or __getattr__("console")
    colour = {"PASS": "green", "WARN": "yellow", "FAIL": "red"}[report["verdict"]]
    t = table(f"validate: {host} ({report['mode']} mode, torch {report.get('torch')}, "
              f"CUDA {report.get('cuda')})", "check", "status", "reason")
    for c in report["checks"]:
        t.add_row(c["name"], c["status"].upper(), c["reason"])
    out.print(t)
    if report.get("python"):  # the interpreter it ran in, and where its torch came from
        base = f" (it runs {report['python_base']})" if report.get("python_base") else ""
        out.print(text(f"python: {report['python']}{base}, torch from {report.get('torch_file')}"))
    out.print(text("verdict: ", (str(report["verdict"]), f"bold {colour}"), f" (report: {path})"))


def next_steps(host: str, report: Mapping[str, Any], out: Console | None = None) -> None:
    """The command to type after a verdict: the work after PASS or WARN, doctor after FAIL."""
    out = out or __getattr__("console")
    if report.get("verdict") == "FAIL":
        failing = next((str(c.get("name")) for c in report.get("checks", [])
                        if str(c.get("status", "")).lower() == "fail"), "")
        out.print(text(f"next: gpu-provision -H {host} doctor"
                       + (f" (it starts from the failing check: {failing})" if failing else "")))
    else:
        out.print(text(f"next: gpu-provision -H {host} run -- python train.py; "
                       f"gpu-provision -H {host} shell; or gpu-provision -H {host} ssh-config, "
                       "then plain ssh"))


def findings_table(host: str, findings: Sequence[Finding], out: Console | None = None) -> None:
    """Blocks, not a table: fixes hold commands the user copies whole."""
    out = out or __getattr__("console")
    if not findings:
        out.print(text(f"doctor: {host}: no known problem found"))
        return
    colour = {"error": "red", "warning": "yellow", "info": "cyan"}
    counts = ", ".join(f"{sum(f.level == lv for f in findings)} {lv}" for lv in colour
                       if any(f.level == lv for f in findings))
    out.print(text(f"doctor: {host}: {counts}"))
    for f in findings:
        out.print(text("\n", (f.level, f"bold {colour[f.level]}"), f" {f.diagnosis}"))
        out.print(text("  ", ("fix:", "bold"), f" {f.fix}"))
        out.print(text((f"  seen in {f.evidence}", "dim")))


def bench_table(host: str, r: dict[str, Any], path: Any, out: Console | None = None) -> None:
    from ..money.compare import number
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
    quota = (f" (the cgroup's quota {r['cpu_quota']:g}; nproc shows {r.get('cpu_count')})"
             if r.get("cpu_quota") is not None and r["cpu_quota"] < (r.get("cpu_count") or 0)
             else "")
    t.add_row("CPU", f"{r.get('cpu_cores')} cores{quota}, single-core score "
                     f"{r.get('cpu_single_score')}")
    if r.get("host_memory_gb") is not None:  # reports before schema 2's host figures lack it
        limit = r.get("memory_limit_gb")
        t.add_row("host memory", number(r.get("host_memory_gb"), " GB") + (
            f" (the cgroup's limit; /proc/meminfo shows {r.get('meminfo_gb')} GB)"
            if limit is not None and limit < (r.get("meminfo_gb") or 0) else ""))
    link = r.get("link") or {}
    t.add_row("link (this machine)", f"up {number(link.get('up_mbs'), ' MB/s')}, down "
                                     f"{number(link.get('down_mbs'), ' MB/s')}"
              + (f" ({link['error']})" if link.get("error") else ""))
    for d in r.get("downloads") or []:
        t.add_row(f"download {d['kind']}", number(d.get("mbs"), " MB/s") + f" {d['url']}"
                  + (f" ({d['error']})" if d.get("error") else ""))
    out.print(t)
    for n in r.get("notes") or []:
        out.print(text(f"note: {n}"))
    out.print(text(f"report: {path}"))


def compare_table(rows: Sequence[Any], notes: Sequence[str], out: Console | None = None,
                  title: str = "compare: value for money, sorted by per 1M samples, cheapest first"
                  ) -> None:
    from ..money.compare import money, number, significant, upload_text
    out = out or __getattr__("console")
    t = table(title, "host", "platform", "GPU", "price/h>",
              "TFLOPS>", "samples/s>", "per 1M samples>", "per TFLOP-hour>", "download MB/s>",
              "link up/down MB/s>", "100 GB up>")
    for r in rows:
        t.add_row(r.host, r.platform or "-", r.gpu, money(r.price, r.currency, 2),
                  significant(r.tflops) + (f" {r.tflops_dtype}" if r.tflops_dtype else ""),
                  number(r.samples_s), significant(r.cost_per_m_samples, r.currency),
                  significant(r.cost_per_tflop_hour, r.currency), number(r.download_mbs),
                  f"{number(r.link_up_mbs)} / {number(r.link_down_mbs)}", upload_text(r))
    out.print(t)
    for n in notes:
        out.print(text(f"note: {n}"))


# -- jobs: run, logs, jobs, kill, watch ---------------------------------------------------------

def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else \
        f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def job_started(started: Sequence[Launched], specs: Sequence[JobSpec], follow: str,
                out: Console | None = None) -> None:
    out = out or __getattr__("console")
    for x, spec in zip(started, specs, strict=True):
        gpus = f"GPUs {x.gpus}" if x.gpus else "no GPU"
        how = f"tmux session {x.session}" if x.launcher == "tmux" else "setsid"
        rank = f" rank {spec.rank}/{spec.nnodes}" if spec.nnodes > 1 else ""
        out.print(text(f"{x.host}: started job ", (x.id, "bold"), f"{rank} (pid {x.wrapper}, "
                       f"{gpus}, {how}) in {x.workdir}"))
        out.print(text(f"  $ {' '.join(quote_arg(a) for a in spec.argv)}"), highlight=False)
        out.print(text(f"  log {x.log}"))
    out.print(text(f"follow it: {follow}"))


def quote_arg(arg: str) -> str:
    from ..remote.command import quote
    return quote(arg)


def log_line(line: str, out: Console | None = None) -> None:
    out = out or __getattr__("console")
    """One line of a job's log, as it is (no markup, no wrapping)."""
    out.file.write(line + "\n")
    out.file.flush()


def jobs_table(listed: Sequence[HostJobs], notes: Sequence[str] = (),
               out: Console | None = None) -> None:
    out = out or __getattr__("console")
    from rich.table import Table
    from rich.text import Text

    many = len(listed) > 1
    t = Table(title=Text("jobs" + ("" if many else f": {listed[0].host}" if listed else "")),
              title_justify="left")
    rows: list[list[str]] = []
    styles: list[str] = []
    for h in listed:
        for j in h.jobs:
            styles.append("green" if j.running else "red" if j.failed else "default")
            started = time.strftime("%m-%d %H:%M", time.localtime(j.started)) if j.started else "-"
            rank = f" (rank {j.rank})" if j.nnodes > 1 else ""
            rows.append(([h.host] if many else []) + [
                j.id + rank, j.label, started, duration(j.duration(h.now)),
                ",".join(map(str, j.gpus)) or "-",
                f"{j.gpu_memory_mib} MiB" if j.gpu_memory_mib is not None else "-",
                size(j.log_size), j.last_line[:160]])
    cols = (["host"] if many else []) + ["job", "state", "started", "for", "GPUs", "GPU mem", "log",
                                         "last line"]
    widths = [max([len(col)] + [len(r[i]) for r in rows]) for i, col in enumerate(cols)]
    left = out.width - sum(widths[:-1]) - 3 * len(cols) - 1
    for i, col in enumerate(cols):
        # every cell but the last line is shown whole (ids are copied from here); the last line
        # gets the width that is left
        last = col == "last line"
        t.add_column(col, no_wrap=True, overflow="ellipsis" if last else "fold",
                     min_width=None if last else widths[i],
                     max_width=max(12, min(left, widths[i])) if last else None)
    for r, style in zip(rows, styles, strict=True):
        cells: list[Text | str] = [Text(x) for x in r]
        cells[len(cols) - 7] = Text(r[len(cols) - 7], style=style)  # the state
        t.add_row(*cells)
    if not rows:
        out.print(text("no jobs" + ("" if many else f" on {listed[0].host}" if listed else "")))
    else:
        out.print(t)
    for n in notes:
        out.print(text(("note:", "yellow"), f" {n}"))


def kill_report(report: Mapping[str, Any], out: Console | None = None) -> None:
    out = out or __getattr__("console")
    host, job = str(report["host"]), str(report["id"])
    if not report.get("was_running"):
        out.print(text(f"{host}: job {job} was not running"))
        return
    parts = [f"{s['signal']}: {'ended' if s['ended'] else 'still running'} after {s['after']}s"
             for s in report.get("steps") or []]
    rc = (report.get("exit") or {}).get("rc")
    out.print(text(f"{host}: job {job}: {'; '.join(parts)}"
                   + (f" (exit code {rc})" if rc is not None else "")))


def _of(value: float | None, limit: float | None, unit: str, fmt: str = ".0f") -> str:
    """``12/24 GiB``, ``41 C``; ``-`` for a value nvidia-smi did not give."""
    if value is None:
        return "-"
    return f"{value:{fmt}}" + (f"/{limit:{fmt}}" if limit is not None else "") + unit


def watch_view(monitor: Monitor, hosts: Sequence[str], notes: Sequence[str] = ()) -> RenderableType:
    """The live view: GPUs, jobs, disk and memory of every host, then the alerts."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    g = Table(title=Text(f"watch: {', '.join(hosts)} ({time.strftime('%H:%M:%S')})"),
              title_justify="left")
    for col in ("host", "GPU", "util", "memory", "temp", "power", "SM clock", "clocks held by"):
        g.add_column(col, justify="right" if col not in ("host", "clocks held by") else "left")
    j = Table(show_header=True, title=None)
    for col in ("host", "job", "state", "for", "GPUs", "GPU mem", "log", "last line"):
        j.add_column(col, overflow="ellipsis" if col == "last line" else "fold", no_wrap=True)
    lines: list[Any] = []
    alerts = []
    for host in hosts:
        s = monitor.latest.get(host)
        if s is None:
            lines.append(Text(f"{host}: {monitor.errors.get(host, 'waiting for the first sample')}",
                              style="red" if host in monitor.errors else "dim"))
            continue
        for x in s.gpus:
            g.add_row(Text(host), str(x.index), _of(x.utilization_pct, None, "%"),
                      _of(x.memory_used_mib and x.memory_used_mib / 1024,
                          x.memory_total_mib and x.memory_total_mib / 1024, " GiB", ".1f"),
                      _of(x.temperature_c, None, " C"), _of(x.power_w, x.power_limit_w, " W"),
                      _of(x.sm_clock_mhz, x.sm_clock_max_mhz, " MHz"),
                      Text(", ".join(x.reason_names) or "-",
                           style="yellow" if x.throttled else "default"))
        for job in s.jobs:
            rate = monitor.log_rate.get((host, job.id))
            j.add_row(Text(host), Text(job.id), Text(job.label, style="green" if job.running else
                                               "red" if job.failed else "default"),
                      duration(job.duration(s.t)), ",".join(map(str, job.gpus)) or "-",
                      f"{job.gpu_memory_mib} MiB" if job.gpu_memory_mib is not None else "-",
                      size(job.log_size) + (f" +{size(rate)}/s" if rate else ""),
                      Text(job.last_line[:120]))
        disks = ", ".join(f"{d.path} {d.free_gb}/{d.total_gb} GB free" for d in s.disks)
        limit = f" (the cgroup's limit; the machine has {s.memory_gb:g})" if s.limited else ""
        lines.append(Text(f"{host}: memory {s.free_gb:g}/{s.usable_gb:g} GB free{limit}; disk "
                          f"{disks or '-'}" + (f"; {s.gpu_note}" if s.gpu_note else "")))
        alerts += monitor.alerts(host)
    colour = {"error": "red", "warning": "yellow", "info": "cyan"}
    parts: list[Any] = [g] if g.row_count else [Text("no GPU on " + ", ".join(hosts), style="dim")]
    parts += [j] if j.row_count else [Text("no jobs", style="dim")]
    parts += lines
    parts += [Text(f"{a.level}: {a.host}: {a.text}", style=colour[a.level]) for a in alerts]
    parts += [Text(f"note: {n}", style="yellow") for n in notes]
    return Group(*parts)
