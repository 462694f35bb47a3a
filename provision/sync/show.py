"""Renderers for moving data and money: sync, its progress bar, autostop, cost. Each takes the
console to print to (``out``), as in provision/output.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from ..ui.console import console, err_console, table, text
from .plan import human

SHOWN = 40  # files listed by a dry run before "... and N more"


@contextmanager
def transfer_bar(label: str, out: Console = err_console
                 ) -> Iterator[Callable[[int, int], None]]:
    """A progress bar with bytes, rate and time left, shown from the first bytes on; yields
    the (done, total) callback."""
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeRemainingColumn())
    bar = Progress(*columns, console=out, transient=out.is_terminal)
    task: list[TaskID] = []

    def update(done: int, total: int) -> None:
        if not task:
            bar.start()
            task.append(bar.add_task(label, total=total))
        bar.update(task[0], completed=done, total=total)
    try:
        yield update
    finally:
        if task:
            bar.stop()


def sync_report(r: Mapping[str, Any], out: Console = console) -> None:
    # the source first, always: a download reads host -> here, and says it fetched
    up = r["direction"] == "up"
    src = f"{r['host']}:{r['source']}" if not up else r["source"]
    dest = f"{r['host']}:{r['dest']}" if up else r["dest"]
    head = f"sync {r['direction']}: {src} -> {dest}"
    verb, verbs = ("send", "sent") if up else ("fetch", "fetched")
    if r["dry_run"]:
        out.print(text(f"{head} (dry run: nothing was moved)"))
        out.print(text(f"would {verb} {r['files']} file(s), {human(r['bytes'])} by "
                       f"{r['transport']} ({r['transport_why']}); {r['same']} already the same"))
        for name in r["planned"][:SHOWN]:
            out.print(text(f"  {verb} {name}"))
        if len(r["planned"]) > SHOWN:
            out.print(text(f"  ... and {len(r['planned']) - SHOWN} more"))
        for name in r["deletions"][:SHOWN]:
            out.print(text(f"  delete {name}"))
        if len(r["deletions"]) > SHOWN:
            out.print(text(f"  ... and {len(r['deletions']) - SHOWN} more to delete"))
        links(r, out)
        return
    out.print(text(head))
    rate = f", {r['mbs']} MB/s" if r.get("mbs") else ""
    resumed = f"; {human(r['resumed_bytes'])} were already there from a cut run" \
        if r["resumed_bytes"] else ""
    out.print(text(f"{verbs} {r['files']} file(s), {human(r['sent_bytes'])} in {r['seconds']:.1f}s"
              f"{rate} by {r['transport']}{resumed}; {r['same']} already the same"
              + (f"; deleted {r['deleted']}" if r["deleted"] else "")))
    if r["files"]:
        out.print(text(f"checked: {r['verified']}"))
    links(r, out)


def links(r: Mapping[str, Any], out: Console = console) -> None:
    """The symbolic links made, and those left out because they point outside the folder."""
    if r.get("links"):
        made = "would make" if r["dry_run"] else "made"
        out.print(text(f"{made} {r['links']} symbolic link(s) (they point inside the folder)"))
    skipped = r.get("skipped_links") or ()
    if skipped:
        out.print(text(f"left out {len(skipped)} link(s) pointing outside the folder (never "
                       f"followed): {', '.join(skipped[:10])}"
                       + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else "")))


def watch_report(r: Mapping[str, Any], out: Console = console) -> None:
    out.print(text(f"sync down --watch: {r['host']}: {r['source']} ({r['pattern']}) -> "
              f"{r['dest']}: pulled {len(r['pulled'])} file(s); {r['ended']}"))


def autostop_status(s: Mapping[str, Any], out: Console = console) -> None:
    host = s["host"]
    if not s.get("set"):
        out.print(text(f"autostop: {host}: not set" + (f" ({s['note']})" if s.get("note") else "")))
        return
    c = s["config"]
    t = table(f"autostop: {host}", "", "", show_header=False)
    t.add_row("state", s["state_text"])
    waits = {"jobs_and_ssh": "no job of ours, queued job, busy process, tmux pane, SSH login, "
                             "forward or VS Code", "jobs": "no job of ours, queued job, busy "
                             "process or tmux pane", "gpu": "the GPUs alone"}
    t.add_row("when", f"GPUs idle (<= {c['util_max']}% busy, <= {c['mem_max_mib']} MiB used, no "
                      "process on them) and "
                      + waits.get(str(c.get("wait_for") or "jobs_and_ssh"), "no job of ours")
                      + f" for {c['idle_text']}"
                      + (f", after job {c['after_job']} ended" if c.get("after_job") else "")
                      + (", once the queue has run" if c.get("after_queue") else "")
                      + f"; sampled every {c['interval']}s")
    t.add_row("action", f"{c['action']}: {c['action_text']}")
    t.add_row("keeps", c.get("keeps") or "-")
    t.add_row("still billed", c.get("bills") or "-")
    if c.get("hook"):
        st = s.get("hook_result") or "not run yet"
        t.add_row("hook first", f"{c['hook']} (at most {c.get('hook_timeout')}s; last: {st})")
    if c.get("save"):
        t.add_row("saves first", f"{c['save']} -> {c.get('save_to') or '-'}"
                  + (f" (on {c['keep_base']}, checked file by file, flushed)"
                     if c.get("keep_base") else ""))
    if c.get("preempt"):
        t.add_row("preemption", f"the {str(c['preempt']).upper()} notice: SIGINT to our jobs, "
                                "then the hook")
    if s.get("spend"):
        t.add_row("max_spend", s["spend"])
    if s.get("held"):
        t.add_row("did not fire", s["held"])
    if s.get("unseen"):
        t.add_row("not seen", s["unseen"])
    t.add_row("runs as", s.get("supervisor") or "-")
    t.add_row("after a reboot", s.get("reboot_text") or "-")
    if s.get("last_failure"):
        t.add_row("last failure", s["last_failure"])
    if (s.get("state") or {}).get("last_fired"):
        t.add_row("fired before", s["state"]["last_fired"])
    for n in c.get("notes") or []:
        if n != f"still billed while stopped: {c.get('bills')}":  # the row above says it
            t.add_row("note", n)
    if s.get("dir"):
        t.add_row("files", s["dir"])
    out.print(t)
    for line in s.get("log_tail") or []:
        out.print(text((line, "dim")))


def cost_table(rows: Sequence[Mapping[str, Any]], out: Console = console) -> None:
    t = table("cost: what each host has cost so far")
    for col in ("host", "price/h", "since", "hours", "so far", "idle", "autostop"):
        t.add_column(col, justify="right" if col in ("price/h", "hours", "so far") else "left")
    for r in rows:
        t.add_row(r["host"], r["price_text"], r["since_text"], f"{r['hours']:.2f}",
                  r["cost_text"], r["idle_text"], r["autostop_text"])
    out.print(t)
    for r in rows:
        for w in r.get("warnings") or []:
            out.print(text(("warning:", "yellow"), f" {w}"))
