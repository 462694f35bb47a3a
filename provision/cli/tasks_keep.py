"""``keepers``: the kept connections of this user (remote/keep.py), and ending them."""

from __future__ import annotations

from typing import Any

from invoke.context import Context

from ..ui import console as output
from .taskkit import has_host, reports_errors, target_of, task


def _ago(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


@task(optional=["stop"], help={
    "stop": "end the kept connections: all of them, or those of this host (an inventory name "
            "or user@host:port), e.g. --stop my-4090; with -H, that host's",
    "json": "print the list as JSON"})
@reports_errors
def keepers(c: Context, stop: Any = None, json_: bool = False) -> None:
    """List the connections kept open for later commands (host, age, idle, open channels).

    Each ends by itself once idle for its keep time (--keep, $GPU_PROVISION_KEEP, the
    inventory's keep:, else 10 minutes). Example: gpu-provision keepers --stop my-4090
    """
    from ..remote import keep
    from ..remote.connection import known_hosts_path
    from .warm import ask, servers

    found = keep.keepers()
    if has_host(c):
        target = target_of(c)
        found = [k for k in found if k.get("pin") == target.pin_name
                 and k.get("known_hosts") == str(known_hosts_path())]
    if isinstance(stop, str):
        found = [k for k in found if stop in (k.get("host"), k.get("address"))
                 or k.get("address", "").endswith(f"@{stop}")]
    warm = [] if has_host(c) or isinstance(stop, str) else servers()
    if stop:
        for k in found:
            keep.stop(k["path"])
        for w in warm:
            ask(str(w["path"]), "stop")
        also = f" and {len(warm)} warm start(s)" if warm else ""
        output.console.print(f"stopped {len(found)} kept connection(s){also}", markup=False)
        return
    rows = [{"host": k["host"], "address": k["address"], "age": k["now"] - k["started"],
             "idle": 0.0 if k["channels"] else k["now"] - k["last"], "channels": k["channels"],
             "keep": k["keep"], "pid": k["pid"]} for k in found]
    if json_:
        output.print_json(rows + [{"warm_start": True, "age": w["now"] - w["started"],
                                   "idle": w["now"] - w["last"], "served": w["served"],
                                   "keep": w["keep"], "pid": w["pid"]} for w in warm])
        return
    if not rows:
        output.console.print("no kept connections", markup=False)
    for r in rows:
        output.console.print(f"{r['host']} ({r['address']}): age {_ago(r['age'])}, idle "
                             f"{_ago(r['idle'])} of {_ago(r['keep'])}, {r['channels']} "
                             f"channel(s) open, pid {r['pid']}", markup=False)
    for w in warm:  # the program itself, loaded and waiting for the next command (warm.py)
        output.console.print(f"warm start: age {_ago(w['now'] - w['started'])}, idle "
                             f"{_ago(w['now'] - w['last'])} of {_ago(w['keep'])}, served "
                             f"{w['served']} command(s), pid {w['pid']}", markup=False)
