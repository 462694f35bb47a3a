"""What the `queue` task does (its help is in provision/cli/tasks_jobs.py): one remote execution
that lists, moves or drops queued jobs, or sets the parallel limit, on the host's own queue
(templates/jobs/queue_ctl.sh.j2; the runner, templates/jobs/queue_runner.sh.j2, starts them).
Wiring only."""

from __future__ import annotations

from typing import Any

from invoke.context import Context

from ..errors import UsageError
from ..jobs import remote
from ..jobs.spec import check_ref
from ..setup.session import session
from ..store import Store
from ..ui import console as output
from .taskkit import notify as _notify
from .taskkit import target_of


def queue(c: Context, move: str | None = None, to: int = 0, drop: str | None = None,
          parallel: int = -1, json_: bool = False) -> None:
    given = [x for x in (move, drop, parallel >= 0 or None) if x]
    if len(given) > 1:
        raise UsageError("queue: one of --move JOB --to N, --drop JOB, --parallel N at a time")
    if move is not None and to < 1:
        raise UsageError("--move: say where with --to N (1: next to start)")
    if to and move is None:
        raise UsageError("--to: with --move JOB")
    for ref in (move, drop):
        if ref is not None:
            check_ref(ref)
    target = target_of(c)
    mode = "move" if move else "drop" if drop else "parallel" if parallel >= 0 else "list"
    with session(target, Store.here(), _notify) as s:
        if mode == "list":
            s.ex.log_dir = None  # read-only: no run folder
        got = remote.queue_ctl(s.ex, mode, job=move or drop or "", to=to,
                               parallel=max(parallel, 0))
    view: dict[str, Any] = {"host": target.name, **got}
    if json_:
        output.print_json(view)
        return
    limit = got.get("parallel") or 0
    head = (f"queue: {target.name}: {len(got['queued'])} waiting"
            + (f", at most {limit} at once" if limit else "")
            + ("" if got.get("runner") or not got["queued"] else "; the runner is not running"))
    if not got["queued"]:
        output.console.print(output.text(head))
        return
    t = output.table(head, "#", "job", "name", "asks for")
    for q in got["queued"]:
        t.add_row(str(q["position"]), q["id"], q["name"], q["wants"])
    output.console.print(t)
