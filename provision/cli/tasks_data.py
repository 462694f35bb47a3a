"""Tasks for data and money: ``sync``, ``autostop``, ``cost``. Wiring only: resolve the host, call
provision/data_sync.py, autostop.py and cost.py, print through output_data.py. Each task imports
them when it runs (taskkit's conventions: start-up loads none of them)."""

from __future__ import annotations

from invoke.context import Context

from .taskkit import notify as _notify
from .taskkit import reports_errors, target_of, task

DEFAULT_IDLE = "30m"  # autostop: GPUs idle this long (and no job of ours) stop the machine
DEFAULT_INTERVAL = "60s"  # autostop: how often the watchdog samples

SYNC_HELP = {
    "direction": "up (this machine -> host) or down (host -> this machine)",
    "src": "what to send: a file or folder here (up) or on the host (down; relative to the data "
           "dir)",
    "dest": "where it lands (up: default the platform's data dir/<name>; down: ./<name>); a "
            "trailing '/' means into that folder",
    "exclude": "leave out files matching this rsync-style pattern (repeatable): '*.tmp', "
               "'cache/', '/top-only'",
    "delete": "also delete what the receiving side has and the source lacks (never by default)",
    "dry_run": "list what would be sent and deleted; move nothing",
    "transport": "auto (rsync where both ends have it, else SFTP), rsync or sftp",
    "links_as_files": "up: a symbolic link that points inside the folder sends the file it points "
                      "at (default: the link itself; links pointing outside are never followed)",
    "watch": "down only: keep pulling files matching this pattern below SRC as they complete, "
             "e.g. 'checkpoints/*.pt' (until Ctrl-C, or --until-idle)",
    "settle": "--watch: seconds a file's size and mtime must hold still (default 5)",
    "until_idle": "--watch: stop once no job of ours runs and nothing matching changed for "
                  "this long, e.g. 10m (default: until Ctrl-C)",
    "json": "print the report as JSON",
}


@task(positional=["direction", "src"], iterable=["exclude"], help=SYNC_HELP)
@reports_errors
def sync(c: Context, direction: str, src: str, dest: str | None = None,
         exclude: list[str] | None = None, delete: bool = False, dry_run: bool = False,
         transport: str = "auto", watch: str | None = None, settle: float = 5.0,
         until_idle: str | None = None, links_as_files: bool = False,
         json_: bool = False) -> None:
    """Move data to the host and checkpoints back, resumable and checked, over our connection.

    Resumable after a drop, each file checked, a progress bar; records the link's MB/s for
    `compare`. Relative host paths are under the platform's data dir.

    Example: gpu-provision -H my-4090 sync up ./data;
    gpu-provision -H my-4090 sync down runs/exp1 --watch 'checkpoints/*.pt'
    """
    from pathlib import Path

    from ..errors import UsageError
    from ..money.autostop import parse_duration
    from ..setup.session import session
    from ..store import Store
    from ..sync import show as output_data
    from ..sync import transfer as data_sync
    from ..sync import watch as sync_watch
    from ..sync.code import record_pulled
    from ..ui import console as output

    if direction not in ("up", "down"):
        raise UsageError(f"sync {direction!r}: say `sync up SRC` or `sync down SRC`")
    if watch and direction != "down":
        raise UsageError("--watch pulls from the host: use it with `sync down`")
    if links_as_files and direction != "up":
        raise UsageError("--links-as-files: with `sync up` (the host's links arrive as links)")
    opts = data_sync.Options(tuple(exclude or ()), delete, dry_run, transport,
                             links_as_files=links_as_files)
    store = Store.here()
    target = target_of(c)
    with data_sync.early_link(target, "sftp" if dry_run else transport) as link, \
            session(target, store, _notify) as s:
        if watch:
            idle = parse_duration(until_idle, "--until-idle") if until_idle else 0
            rep = sync_watch.watch(s.ex, target, src, dest, watch, opts, settle, 1.0, idle,
                                  lambda line: output.err_console.print(f"{target.name}: {line}",
                                                                        markup=False), link)
            if json_:
                output.print_json(rep.as_json())
            else:
                output_data.watch_report(rep.as_json())
            return
        label = f"{target.name}: sync {direction}"
        with output_data.transfer_bar(label) as bar:
            if direction == "up":
                report = data_sync.sync_up(s.ex, target, Path(src), dest, opts, bar, link)
            else:
                report = data_sync.sync_down(s.ex, target, src, dest, opts, bar, link)
                if not opts.dry_run:  # not the job's code: `run` leaves it out
                    record_pulled(store.root, Path(report.dest))
    measured = report.link()
    if measured is not None:
        store.save_report(target.name, measured, kind="link", run=s.run)
    if json_:
        output.print_json(report.as_json())
    else:
        output_data.sync_report(report.as_json())


AUTOSTOP_HELP = {
    "idle": "stop after the GPUs and our jobs have been idle this long (default 30m; e.g. 5s)",
    "interval": "how often the watchdog samples (default 60s)",
    "after_job": "arm only once this job (of `run`) has run and ended",
    "after_queue": "arm only once the host's job queue (run --queue) has run: the machine stops "
                   "when the queue is empty and its last job ended (with --idle after)",
    "action": "stop | shutdown | terminate | none (default: the platform's; terminate only when "
              "given explicitly; none stops nothing, and still watches for the preemption "
              "notice and the spend cap's warning)",
    "save": "a checkpoint folder on the host (relative: under the data dir) to copy to the "
            "platform's persistent storage before the stop",
    "save_to": "where --save goes instead of the platform's persistent storage",
    "instance_id": "the platform's id of this instance, where the host cannot find it itself "
                   "(Lambda)",
    "gpu_util": "a GPU above this utilisation (percent) is busy (default 5)",
    "gpu_mem": "a GPU holding more than this many MiB is busy (default 512)",
    "stop_wait": "the machine still up this long after its stop was accepted: the stop failed, "
                 "and is tried again (default 5m)",
    "wait_for": "what counts as activity besides the GPUs: jobs_and_ssh (default: our jobs, tmux "
                "panes, busy processes and downloads, an open SSH login, a forward, VS Code), "
                "jobs (the same without SSH), gpu (the GPUs alone)",
    "hook": "a command run (bash -lc, in the home) before any stop the watchdog makes and "
            "within a preemption notice, e.g. 'git -C ~/code push'",
    "hook_timeout": "how long --hook may take (default 5m)",
    "save_rate": "cap the copy of --save at this many KiB/s (default: no cap)",
    "cpu_busy": "a process (or all together) above this % of one CPU is busy (default 20)",
    "io_busy": "processes reading or writing more than this many KiB/s are busy (default 1024)",
    "preemption": "auto (default: on an AWS, GCP or Azure Spot machine), aws, gcp, azure or "
                  "off: whose preemption notice sends SIGINT to our jobs and runs --hook",
    "metadata_address": "the instance metadata service, HOST[:PORT] (default 169.254.169.254)",
    "cancel": "remove the watchdog",
    "status": "show what is set and the watchdog's last sample",
    "json": "print the result as JSON",
}


@task(help=AUTOSTOP_HELP)
@reports_errors
def autostop(c: Context, idle: str = DEFAULT_IDLE,
             interval: str = DEFAULT_INTERVAL, after_job: str | None = None,
             after_queue: bool = False,
             action: str | None = None, save: str | None = None, save_to: str | None = None,
             instance_id: str | None = None, gpu_util: int = 5, gpu_mem: int = 512,
             stop_wait: str = "5m", wait_for: str = "jobs_and_ssh", hook: str | None = None,
             hook_timeout: str = "5m", save_rate: int = 0, cpu_busy: int = 20,
             io_busy: int = 1024, preemption: str = "auto",
             metadata_address: str = "169.254.169.254", cancel: bool = False,
             status: bool = False, json_: bool = False) -> None:
    """Stop the machine by itself once its GPUs sit idle (an on-host watchdog, no laptop needed).

    The watchdog calls the platform's own stop once nothing has been busy for the period (the
    GPUs, our jobs and queue, busy processes, downloads, SSH logins: --wait-for), after --hook
    and after copying --save onto storage the stop keeps, checked file by file and flushed; a
    job started meanwhile keeps the machine up. What the stop keeps and still bills is shown; a
    stop that deletes data is refused unless --action terminate is given, and a --save that
    would land on the disk it deletes is refused. The inventory's max_spend: caps the spend
    since the machine started (price_per_hour: a word at 80%, the action at 100%).

    Example: gpu-provision -H my-4090 autostop --idle 30m --save /root/autodl-tmp/ckpt
    """
    from ..config.inventory import settings_for
    from ..config.recipes import load_platform
    from ..config.secrets import digest, push_values
    from ..money import autostop as autostop_mod
    from ..money.autostop import parse_duration
    from ..money.notify import for_target
    from ..ops.layout import expand_home
    from ..ops.secrets import secrets_step
    from ..setup.engine import run_step
    from ..setup.session import session
    from ..store import Store
    from ..sync import show as output_data
    from ..ui import console as output

    target = target_of(c)
    req, platform = None, None
    if not (cancel or status):  # the flags are checked before connecting (exit 2)
        req = autostop_mod.Request(
            idle=parse_duration(idle, "--idle"), interval=parse_duration(interval, "--interval"),
            after_job=after_job, action=action, save=save, save_to=save_to,
            instance_id=instance_id, util_max=gpu_util, mem_max_mib=gpu_mem,
            stop_wait=parse_duration(stop_wait, "--stop-wait"), wait_for=wait_for, hook=hook,
            hook_timeout=parse_duration(hook_timeout, "--hook-timeout"), save_rate=save_rate,
            cpu_busy=cpu_busy, io_busy=io_busy, preemption=preemption,
            metadata=metadata_address, max_spend=target.settings.get("max_spend"),
            after_queue=after_queue,
            price_per_hour=target.settings.get("price_per_hour"))
        autostop_mod.validate(req)
    with session(target, Store.here(), _notify) as s:
        if cancel:
            removed = autostop_mod.cancel(s.ex)
            if json_:
                output.print_json({"host": target.name, "removed": removed})
            else:
                output.console.print(output.text(f"autostop: {target.name}: "
                                     + ("removed" if removed else "was not set")))
            return
        if req is not None:
            facts = s.facts()
            settings = settings_for(target, facts.platform)
            platform = load_platform(settings.platform)
            base = expand_home(settings.data_dir, facts.home) if settings.data_dir else None
            decision = autostop_mod.decide(platform, req, facts.home, base,
                                           machine=facts.hostname)
            # the platform's API key, if the inventory pushes one: pushed only when every
            # push_env name is set here (the env file is written whole; a partial set would drop
            # the host's other tokens); else the key already on the host is checked for
            values = push_values(target, required=False)
            if values and len(values) == len(target.settings.get("push_env") or ()):
                step = secrets_step(facts, values, digest(values))
                if step.body is not None:  # None: these values are on the host already
                    run_step(s.ex, step, s.run, output.console)
            done = autostop_mod.install(s.ex, decision, req, platform, _addresses(target.host),
                                        for_target(target))
            for w in done.get("warnings") or []:
                _notify(f"autostop: {target.name}: warning: {w}")
        view = autostop_mod.status_view(target.name, autostop_mod.raw_status(s.ex),
                                        platform)
    if json_:
        output.print_json(view)
    else:
        output_data.autostop_status(view)


# --instance-id names one machine: `-H a,b` would give both hosts the one id (cli/fanout.py)
autostop.one_host_flags = ("instance_id",)


def _addresses(host: str) -> tuple[str, ...]:
    """The addresses ``host`` resolves to here: the machine we reach (the platform's API must
    name one of them for the instance id given)."""
    import socket
    try:
        return tuple(sorted({str(a[4][0]) for a in socket.getaddrinfo(host, None)}))
    except OSError:
        return ()


@task(help={"json": "print the rows as JSON"})
@reports_errors
def cost(c: Context, json_: bool = False) -> None:
    """What each host has cost so far, how long it has sat idle, and what autostop saves.

    Hours since the machine (or its container) started, times price_per_hour from the
    inventory. One remote execution.

    Example: gpu-provision -H my-4090,my-a100 cost
    """
    from ..money import cost as cost_mod
    from ..setup.session import session
    from ..store import Store
    from ..sync import show as output_data
    from ..ui import console as output

    target = target_of(c)
    with session(target, Store.here(), _notify) as s:
        s.ex.log_dir = None  # read-only: no run folder
        p = cost_mod.probe(s.ex)
    price, currency = cost_mod.price_of(target.settings)
    line = cost_mod.row(target.name, price, currency, p)
    if json_:
        output.print_json(line)
    else:
        output_data.cost_table([line])


@task(help={"older": "remove what is older than this, e.g. 7d, 12h (default 7d)",
            "dry_run": "list what would go; remove nothing",
            "json": "print what was removed as JSON"})
@reports_errors
def prune(c: Context, older: str = "7d", dry_run: bool = False, json_: bool = False) -> None:
    """Local: remove old run logs and reports (each host's newest run and newest report of each
    kind stay: doctor, run and compare read them).

    Example: gpu-provision prune --older 7d
    """
    from ..money.autostop import parse_duration
    from ..store import Store
    from ..ui import console as output

    store = Store.here()
    gone = store.prune(parse_duration(older, "--older"), dry_run=dry_run)
    if (moved := store.moved_note()) is not None:  # pruned where new ones go, not there
        _notify(moved)
    if json_:
        output.print_json({"removed": [str(p) for p in gone], "dry_run": dry_run})
        return
    verb = "would remove" if dry_run else "removed"
    for p in gone:
        output.console.print(f"{verb} {p}", markup=False)
    output.console.print(f"{verb} {len(gone)} old run folder(s) and report(s) under {store.root}",
                         markup=False)
