"""What a plan and an applied bootstrap look like on the console."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ui.console import table, text

if TYPE_CHECKING:
    from rich.console import Console

    from .engine import Applied
    from .plan import Plan


def console() -> Console:
    from ..ui import console as output
    return output.console


def plan_table(plan: Plan, out: Console | None = None) -> None:
    out = out or console()
    t = table(f"plan: {plan.host} (dry run: nothing was changed)", "step", "action", "why")
    for d in plan.decisions:
        t.add_row(d.step, d.action if d.changes else text(("nothing to do", "dim")), d.reason)
    out.print(t)
    if plan.fit is not None and plan.fit.needs:  # what it fetches, where, and what is free
        out.print(text(("disk:", "cyan"), f" {plan.fit.summary()}"))
    for r in plan.risks:
        out.print(text(("risk:", "yellow"), f" {r}"))
    if plan.blocked:
        out.print(text(("blocked:", "red"), f" {plan.blocked}"))


def steps_table(applied: Applied, out: Console | None = None) -> None:
    out = out or console()
    t = table(f"bootstrap: {applied.host} ({applied.executions} remote executions)",
              "step", "result", "seconds>")
    for s in applied.steps:
        t.add_row(s.name, s.result, f"{s.seconds:.1f}")
    out.print(t)
