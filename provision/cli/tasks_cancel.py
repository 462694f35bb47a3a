"""``cancel``: stop a step of ours that runs detached on the host (remote/runtime.py ``cancel``)."""

from __future__ import annotations

from typing import Any

from invoke.context import Context

from ..ui import console as output
from .taskkit import reports_errors, session_of, task


@task(help={"step": "only this step (conda, env, torch, packages, validate, ...); default: "
                    "whichever of ours runs, e.g. --step torch",
            "json": "print what was stopped as JSON"})
@reports_errors
def cancel(c: Context, step: str = "", json_: bool = False) -> dict[str, Any]:
    """Stop the step bootstrap left running on the host (after Ctrl-C, or another run's).

    Its whole process group and session end, which frees the lock; what it left half-made is
    marked, and the next bootstrap redoes the step (a half-made env is made anew, a half-done
    torch install removed first). A step that runs as root (the driver) is not stopped midway.
    One remote execution. Example: gpu-provision -H my-4090 cancel
    """
    from ..remote.runtime import cancel as cancel_steps
    from ..remote.runtime import stopped_text
    with session_of(c) as s:
        stopped = cancel_steps(s.ex, step)
    if json_:
        output.print_json({"host": s.target.name, "stopped": stopped})
    else:
        output.console.print(output.text(f"{s.target.name}: {stopped_text(stopped, step)}"))
    return {"steps": [(x["step"], "cancelled", 0.0) for x in stopped if x.get("stopped")]}
