"""The ``report`` task: one file with the evidence a platform's support needs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from invoke.context import Context

from ..config.secrets import push_values
from ..store import Store, run_id
from ..ui import console as output
from .taskkit import reports_errors, session_of, target_of, task


@task(help={"out": "the file to write (default reports/<host>/report-<time>.md)",
            "json": "print where it was written and what it holds as JSON"})
@reports_errors
def report(c: Context, out: str | None = None, json_: bool = False) -> dict[str, Any]:
    """Write one file for the platform's support: the facts, the last validation, nvidia-smi -q,
    the kernel log's NVIDIA and Xid lines, each job's GPU health from start to end and the
    steps' timings, with every secret masked (the pushed tokens, values named like secrets,
    strings shaped like well-known tokens). Reads only: one remote execution after the facts.

    Example: gpu-provision -H my-8xh100 report
    """
    from ..jobs import report as bundle

    target = target_of(c)
    store = Store.here()
    validation = store.last_report(target.name)
    with session_of(c) as s:
        facts = s.facts()
        parts = s.ex.query("report", bundle.script(), bundle.parse, what="the report's evidence",
                           reads_only=True)
    secrets = tuple(push_values(target, required=False).values())
    text = bundle.bundle(target.name, facts.as_json(), validation, parts, secrets, now=time.time())
    path = Path(out) if out else store.report_path(target.name, "report", run_id(), ext="md")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    said = {"path": str(path), "bytes": len(text.encode()), "validation": bool(validation),
            "parts": sorted(parts)}
    if json_:
        output.print_json(said)
    else:
        output.console.print(output.text(("report", "bold"), f" written: {path} ({said['bytes']} bytes; "
                                         "secrets masked)"))
    return said
