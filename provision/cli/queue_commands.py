"""What the `queue` task does (its help is in provision/cli/tasks_jobs.py): one remote execution
that lists, moves or drops queued jobs, or sets the parallel limit, on the host's own queue
(templates/jobs/queue_ctl.sh.j2; the runner, templates/jobs/queue_runner.sh.j2, starts them).
Wiring only."""

from __future__ import annotations

from collections.abc import Sequence
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


def queue_gpus(gpus: str | None, hosts: str | None, parallel: int | None) -> int | None:
    """`run --queue`'s checks; the GPU count ``--gpus N`` asks for (None: indexes or all)."""
    if hosts:
        raise UsageError("--queue: a host's own queue; a job over --hosts starts at once")
    if parallel is not None and parallel < 0:
        raise UsageError("--parallel: 0 (no limit) or more")
    if gpus and gpus.strip().isdigit():
        if int(gpus) < 1:
            raise UsageError("--gpus 0: a queued job asks for at least one GPU (or leave "
                             "--gpus out: every GPU)")
        return int(gpus)
    return None


def show_queued(queued: Sequence[remote.Queued], json_: bool) -> None:
    for q in queued:
        if json_:
            output.print_json({"id": q.id, "host": q.host, "queued": q.position,
                               "workdir": q.workdir, "log": q.log})
        else:
            output.console.print(output.text(
                f"{q.host}: {q.id} queued at #{q.position}; it runs in {q.workdir} once its "
                f"GPUs are free (gpu-provision -H {q.host} queue)"))


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
