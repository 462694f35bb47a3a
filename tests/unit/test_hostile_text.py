"""A rented host is not trusted: what it says (GPU names, paths, job ids and log lines, error
texts, report fields) reaches the terminal as text, never as our markup. Each renderer is fed
strings that would make a clickable link, hide text or turn into an emoji if rich read them as
markup, on a colour terminal, and must show them exactly as they came."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from provision.doctor.match import Finding
from provision.jobs.monitor import Monitor
from provision.jobs.remote import Launched
from provision.jobs.spec import JobSpec
from provision.jobs.state import HostJobs, JobState
from provision.money.compare import rows
from provision.setup import show
from provision.setup.engine import Applied, StepRecord
from provision.sync import show as sync_show
from provision.ui import console as output
from tests.cases import CASES, captured, case_plan

ROOT = Path(__file__).resolve().parents[2]
LINK = "[link=https://x.invalid]see fix[/link]"
HIDDEN = "[black on black]secret[/]"
EMOJI = ":warning:"
HOSTILE = f"{LINK} {HIDDEN} {EMOJI}"


def on_terminal(draw: Callable[[Console], None]) -> str:
    """What a colour terminal would be sent (a console as a test makes it: markup on)."""
    buf = io.StringIO()
    draw(Console(file=buf, width=400, color_system="truecolor", force_terminal=True))
    return buf.getvalue()


def shown_as_is(out: str) -> None:
    assert "\x1b]8;" not in out, "a hyperlink (OSC 8) reached the terminal"
    for s in (LINK, HIDDEN, EMOJI):
        assert s in out, f"{s!r} was read as markup: {out[:400]!r}"


def test_facts() -> None:
    f = captured("h200")
    gpus = tuple(dataclasses.replace(g, name=f"NVIDIA H200 {HOSTILE}") for g in f.gpus)
    hostile = dataclasses.replace(f, gpus=gpus, kernel=HOSTILE, warnings=(HOSTILE,))
    shown_as_is(on_terminal(lambda c: output.facts_table("box", hostile, out=c)))


def test_plan_and_steps() -> None:
    plan = case_plan(CASES / "plan" / "cpu-fresh.yaml")[1]
    hostile = dataclasses.replace(plan, host=HOSTILE, risks=(HOSTILE,), blocked=HOSTILE)
    shown_as_is(on_terminal(lambda c: show.plan_table(hostile, out=c)))
    applied = Applied(host=HOSTILE, steps=[StepRecord(HOSTILE, "ok", 1.0)], executions=1)
    shown_as_is(on_terminal(lambda c: show.steps_table(applied, out=c)))


def test_verdict_and_findings() -> None:
    report = {"verdict": "WARN", "mode": "gpu", "torch": HOSTILE, "cuda": "12.4",
              "checks": [{"name": HOSTILE, "status": "warn", "reason": HOSTILE}]}
    shown_as_is(on_terminal(lambda c: output.verdict_table("box", report, HOSTILE, out=c)))
    found = [Finding("x", "error", HOSTILE, HOSTILE, HOSTILE)]
    shown_as_is(on_terminal(lambda c: output.findings_table(HOSTILE, found, out=c)))


def test_bench_and_compare() -> None:
    bench = {"mode": "gpu", "torch": HOSTILE, "tflops": {"fp16": 1.0}, "notes": [HOSTILE],
             "disk_path": HOSTILE, "link": {"error": HOSTILE},
             "downloads": [{"kind": "pypi", "url": HOSTILE, "mbs": 3.0, "error": HOSTILE}]}
    shown_as_is(on_terminal(lambda c: output.bench_table("box", bench, HOSTILE, out=c)))
    reports = [(str(p), json.loads(p.read_text()))
               for p in sorted((ROOT / "bench" / "published").glob("*.json"))][:2]
    for _, r in reports:
        r["host"], r["gpu"] = HOSTILE, HOSTILE
    table = rows(reports, lambda r: (r.get("price_per_hour"), r.get("currency")))
    shown_as_is(on_terminal(lambda c: output.compare_table(table, [HOSTILE], out=c)))


def job(**more: object) -> JobState:
    return JobState(host=HOSTILE, id=HOSTILE, name=HOSTILE, argv=(HOSTILE,), state="running",
                    last_line=HOSTILE, log_path=HOSTILE, **more)  # type: ignore[arg-type]


def test_jobs() -> None:
    started = [Launched(HOSTILE, HOSTILE, 7, "tmux", HOSTILE, HOSTILE, "", HOSTILE, HOSTILE)]
    spec = JobSpec(id=HOSTILE, name=HOSTILE, argv=(HOSTILE,))
    shown_as_is(on_terminal(lambda c: output.job_started(started, [spec], HOSTILE, out=c)))
    listed = [HostJobs(host=HOSTILE, now=0.0, boot="b", jobs=(job(),))]
    shown_as_is(on_terminal(lambda c: output.jobs_table(listed, [HOSTILE], out=c)))
    killed = {"host": HOSTILE, "id": HOSTILE, "was_running": False}
    shown_as_is(on_terminal(lambda c: output.kill_report(killed, out=c)))
    monitor = Monitor()
    monitor.errors[HOSTILE] = HOSTILE
    shown_as_is(on_terminal(lambda c: c.print(output.watch_view(monitor, [HOSTILE], [HOSTILE]))))


def test_sync_autostop_and_cost() -> None:
    sync = {"direction": "down", "host": HOSTILE, "source": HOSTILE, "dest": HOSTILE,
            "dry_run": True, "files": 1, "bytes": 3, "transport": "sftp",
            "transport_why": HOSTILE, "same": 0, "planned": [HOSTILE], "deletions": [HOSTILE]}
    shown_as_is(on_terminal(lambda c: sync_show.sync_report(sync, out=c)))
    status = {"host": HOSTILE, "set": True, "state_text": HOSTILE, "supervisor": HOSTILE, "reboot_text": HOSTILE,
              "log_tail": [HOSTILE],
              "config": {"util_max": 5, "mem_max_mib": 512, "idle_text": HOSTILE, "interval": 60,
                         "action": "stop", "action_text": HOSTILE, "keeps": HOSTILE,
                         "bills": HOSTILE, "after_job": HOSTILE}}
    shown_as_is(on_terminal(lambda c: sync_show.autostop_status(status, out=c)))
    cost = [{"host": HOSTILE, "price_text": "1", "since_text": "x", "hours": 1.0, "cost_text": "1",
             "idle_text": HOSTILE, "autostop_text": HOSTILE, "warnings": [HOSTILE]}]
    shown_as_is(on_terminal(lambda c: sync_show.cost_table(cost, out=c)))


@pytest.mark.parametrize("name", ["console", "err_console"])
def test_the_programs_own_consoles_read_no_markup(name: str) -> None:
    console = getattr(output, name)
    assert console._markup is False and console._emoji is False
