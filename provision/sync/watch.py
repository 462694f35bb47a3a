"""``sync down --watch``: each checkpoint pulled once it is complete, never half written; the
host's watcher runs as a step (re-attachable) and says READY per settled file."""

from __future__ import annotations

import base64
import posixpath
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config.inventory import Target
from ..errors import ProvisionError, RemoteError
from ..ops.step import inputs_hash
from ..remote.executor import Executor, file_sha256
from ..remote.runtime import run_detached
from ..remote.templating import render
from . import rsync
from .plan import Changes, Entry, Side, human
from .transfer import Options, choose_transport, local_landing, resolve
from .transport import join, rsync_down, sftp_down

WATCH_GRACE = 10  # seconds the host's watcher waits for a follower before it stops


@dataclass(frozen=True)
class Ready:
    rel: str
    size: int
    mtime: int


@dataclass
class WatchReport:
    host: str
    source: str
    dest: str
    pattern: str
    transport: str
    pulled: list[dict[str, Any]] = field(default_factory=list)
    ended: str = ""  # why the watch ended

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_ready(line: str) -> Ready | None:
    """``READY <size> <mtime> <base64 of the path below the watched folder>``."""
    parts = line.split(" ")
    if len(parts) != 4 or parts[0] != "READY":
        return None
    try:
        rel = base64.b64decode(parts[3], validate=True).decode("utf-8", "surrogateescape")
        return Ready(rel, int(parts[1]), int(parts[2]))
    except ValueError:
        return None


def watch_body(root: str, pattern: str, settle: float, interval: float, until_idle: float) -> str:
    return render("sync/sync_watch.sh.j2", root=root, pattern=pattern, settle=int(settle),
                  interval=interval, until_idle=int(until_idle), grace=WATCH_GRACE)


def watch(ex: Executor, target: Target, src: str, dest: str | None, pattern: str,
          opts: Options, settle: float, interval: float, until_idle: float,
          show: Callable[[str], None], link: rsync.Link | None = None) -> WatchReport:
    """Pull each file below ``src`` that matches ``pattern`` once it is complete, until the
    watcher ends (``until_idle``: no job of ours runs and nothing matching changed for that
    long) or Ctrl-C. ``show`` gets one line per file pulled."""
    host = resolve(ex, target, src, posixpath.basename(src.rstrip("/")))
    there = host.side
    if there.kind != "d":
        raise ProvisionError(f"{target.name}: {there.path}: --watch needs a folder on the host "
                             f"({'a file' if there.kind == 'f' else 'missing'})")
    name = posixpath.basename(there.path.rstrip("/"))
    here = local_landing(dest, name)
    transport, _ = choose_transport(opts.transport, target, host.listing)
    report = WatchReport(target.name, there.path, str(here), pattern, transport)
    key = inputs_hash(root=there.path, pattern=pattern)
    step = f"sync-watch-{key[:10]}"
    body = watch_body(there.path, pattern, settle, interval, until_idle)
    events: queue.Queue[Any] = queue.Queue()

    def on_line(line: str) -> None:
        ready = parse_ready(line.strip())
        if ready is not None:
            events.put(ready)

    def follow() -> None:
        try:
            events.put(run_detached(ex, step, body, inputs=inputs_hash(
                body=body), lock=step, on_line=on_line, again="the same sync --watch"))
        except BaseException as exc:  # handed to the main thread
            events.put(exc)

    threading.Thread(target=follow, daemon=True, name="sync-watch").start()
    try:
        while True:
            try:
                ev = events.get(timeout=0.5)
            except queue.Empty:
                continue
            if isinstance(ev, Ready):
                _pull(ex, target, there.path, here, ev, transport, report, show, link)
            elif isinstance(ev, BaseException):
                raise ev
            else:
                report.ended = "the watcher on the host ended (nothing changed while no job ran)"
                return report
    except KeyboardInterrupt:
        report.ended = "interrupted (the watcher on the host stops by itself once nobody follows)"
        return report


def _pull(ex: Executor, target: Target, root: str, here: Path, ev: Ready, transport: str,
          report: WatchReport, show: Callable[[str], None], link: rsync.Link | None) -> None:
    final = here / ev.rel
    try:
        st = final.stat()
        if (st.st_size, int(st.st_mtime)) == (ev.size, ev.mtime):
            return  # pulled before (by this watch, or an earlier one)
    except FileNotFoundError:
        pass
    final.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    src = join(root, ev.rel)
    entry = Entry(ev.rel, ev.size, ev.mtime)
    plan = Changes((entry,), 0)
    try:
        if transport == "rsync":
            rsync_down(ex, target, Side(src, "f", 0, {"": Entry("", ev.size, ev.mtime)}), final,
                        Changes((Entry("", ev.size, ev.mtime),), 0), None, link)
            digest = file_sha256(final)
        else:
            sftp_down(ex, Side(root, "d"), here, plan, None)
            digest = file_sha256(final)
    except RemoteError as exc:  # it changed while it was read: it will be named again
        show(f"{ev.rel}: changed while it was read; it is pulled once it settles again ({exc})")
        return
    st = final.stat()
    if (st.st_size, int(st.st_mtime)) != (ev.size, ev.mtime):
        show(f"{ev.rel}: changed on the host while it was pulled; pulled again when it settles")
        return
    seconds = time.monotonic() - started
    report.pulled.append({"path": ev.rel, "size": ev.size, "mtime": ev.mtime, "sha256": digest,
                          "seconds": round(seconds, 3)})
    show(f"pulled {ev.rel} ({human(ev.size)}, {human(ev.size / max(seconds, 1e-6))}/s)")
