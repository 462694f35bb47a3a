"""What the tasks of the renter's day after bootstrap do (run, logs, jobs, kill, watch; the
tasks themselves are in provision/tasks_jobs.py, which imports this when one runs). Wiring only:
resolve the hosts, open sessions, call provision/jobs/, print through provision/output."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from fabric import Connection
from invoke.context import Context
from invoke.exceptions import Exit

from ..config.inventory import Target, expand_hosts, settings_for
from ..config.recipes import all_platforms, load_recipe
from ..errors import ProvisionError, SSHError, UsageError
from ..facts.gather import data_dirs
from ..facts.host import HostFacts
from ..jobs import DEFAULT_PORT, SHOWN, remote
from ..jobs.distributed import Node, nproc_for, rendezvous, torchrun_argv
from ..jobs.health import health_notes
from ..jobs.monitor import Monitor, parse_sample
from ..jobs.reader import Position, Reader, load, position_path
from ..jobs.spec import (
    JobSpec,
    check_name,
    check_ref,
    command_after_dashes,
    command_of,
    default_name,
    new_id,
    parse_gpus,
    validation_env,
)
from ..jobs.state import HostJobs
from ..money.notify import for_target
from ..remote.executor import Executor
from ..setup.session import Session, open_executor
from ..store import Store, run_id
from ..sync.code import LAST_JOB_ID, check_size, code_folder, named_files, selection
from ..sync.plan import human
from ..sync.transfer import Options as SyncOptions
from ..sync.transfer import sync_up
from ..ui import console as output
from .queue_commands import queue_gpus, show_queued
from .taskkit import ONE_HOST, has_host, host_target, target_of
from .taskkit import notify as _notify

A = TypeVar("A")
T = TypeVar("T")
TAIL_LINES = 400  # the end of a followed log that doctor reads when the job fails
BOTH = "give the hosts once: -H a,b (a job on each) or --hosts a,b (one job over them)"


def targets_of(c: Context, hosts: str | None) -> list[Target]:
    """The hosts a task talks to: ``--hosts a,b`` (or a group), else ``-H``'s one host."""
    if hosts:
        specs = expand_hosts(hosts)
        if not specs:
            raise UsageError("--hosts: no host given")
        base = c.config if isinstance(c, Context) else None
        out = []
        for spec in specs:
            # Fabric splits user@host:port as it would for -H; the ssh configuration and -i
            # complete it as for -H (taskkit.host_target)
            cx = Connection(spec, config=base) if base is not None else Connection(spec)
            out.append(host_target(cx, cx.original_host))
        return out
    if not has_host(c):
        raise UsageError(f"{ONE_HOST} (or --hosts a,b)")
    return [target_of(c)]


def on_each(items: Sequence[A], fn: Callable[[A], T],
            stop: Callable[[], None] | None = None) -> list[T]:
    """``fn`` on every host at once, in order; the first failure is raised after all ended.
    ``stop``: what makes them end when Ctrl-C comes (close their connections)."""
    if len(items) == 1:
        return [fn(items[0])]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(items)))) as pool:
        futures = [pool.submit(fn, t) for t in items]
        try:
            errors = [f.exception() for f in futures]
        except KeyboardInterrupt:
            if stop is not None:
                stop()
            raise
    for e in errors:
        if e is not None:
            raise e
    return [f.result() for f in futures]


@contextmanager
def opened(targets: Sequence[Target], store: Store, keep_log: bool = True
           ) -> Iterator[list[Session]]:
    """A session on every host, opened at once and always closed. ``keep_log`` False: a streamed
    log or the sampler's lines are not copied into the local run logs (the host keeps them)."""
    run = run_id()
    sessions: list[Session | None] = [None] * len(targets)

    def one(i: int) -> None:
        ex = open_executor(targets[i], store, run, _notify)
        if not keep_log:
            ex.log_dir = None
        sessions[i] = Session(targets[i], ex, store, _notify, run)

    try:
        on_each(list(range(len(targets))), one)
        yield [s for s in sessions if s is not None]
    finally:
        for s in sessions:
            if s is not None:
                s.ex.conn.close()


@contextmanager
def connecting(targets: Sequence[Target], store: Store) -> Iterator[Callable[[], list[Session]]]:
    """``opened``, connecting in the background: the caller gets a function that waits for the
    sessions, and prepares what it sends meanwhile."""
    cm = opened(targets, store)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(cm.__enter__)
        try:
            yield pending.result
        finally:
            if pending.exception() is None:  # (waits for it) connected: close it
                cm.__exit__(None, None, None)


def log_dirs(target: Target) -> tuple[str, ...]:
    """Where a job's log may go: the data dir the inventory (or its platform) names, else every
    platform's data dir (the host uses the first that exists)."""
    settings = settings_for(target, None)
    return (settings.data_dir,) if settings.data_dir else data_dirs(all_platforms())


def how_to_follow(c: Context, hosts: str | None, job: str) -> str:
    """The command that follows the job, with the hosts as the user named them."""
    if hosts:
        return f"gpu-provision logs {job} --hosts {hosts} -f"
    return f"gpu-provision -H {getattr(c, 'original_host', None) or '?'} logs {job} -f"


def run(c: Context, name: str | None = None, gpus: str | None = None, workdir: str | None = None,
        share: bool = False, hosts: str | None = None, nproc_per_node: int = 0,
        master_port: int = DEFAULT_PORT, master_addr: str | None = None, launcher: str = "auto",
        code: str | None = None, no_code: bool = False, exclude: Sequence[str] = (),
        json_: bool = False, queue: bool = False, parallel: int | None = None) -> dict[str, Any]:
    """The `run` task's body; its help is in provision/tasks_jobs.py."""
    if hosts and has_host(c):
        raise UsageError(BOTH)
    gpu_count = queue_gpus(gpus, hosts, parallel) if queue else None
    if gpu_count is not None:
        gpus = None  # --gpus N: that many free GPUs, when they are
    if parallel is not None and not queue:
        raise UsageError("--parallel limits the queue: use it with --queue")
    if no_code and (code or exclude):
        raise UsageError("--no-code sends nothing: leave out --code and --exclude, or --no-code")
    targets = targets_of(c, hosts)
    asked = parse_gpus(gpus)
    given = check_name(name) if name else None
    folder = None if no_code else code_folder(code)
    store = Store.here()
    # the handshake goes on while the job is made ready to send: run costs about one bare ssh
    with connecting(targets, store) as connected:
        first = settings_for(targets[0], None)
        command = command_of(command_after_dashes(), load_recipe(first.recipe).job, first.recipe)
        job_name = given or default_name(command)
        job_id = new_id(job_name) if given else _unused_id(store, job_name)
        base = JobSpec(id=job_id, name=job_name, argv=command, gpus=asked,
                       workdir=workdir or "~", share=share, launcher=launcher,
                       files=named_files(command), sent=str(folder or ""))
        facts = on_each(connected(), lambda s: s.facts()) if hosts else None
        specs = _specs(base, targets, store, facts, nproc_per_node, master_port, master_addr)
        sessions = connected()
        if folder is not None:  # the code first: the job's working folder is where it landed
            dests = on_each(sessions, lambda s: send_code(s, folder, workdir, exclude))
            specs = [replace(x, workdir=d) for x, d in zip(specs, dests, strict=True)]
        specs = [replace(x, notify_script=for_target(t))
                 for x, t in zip(specs, targets, strict=True)]
        scripts = [remote.launch_script(x, queue, gpu_count, parallel) for x in specs]
        items = list(zip(sessions, specs, scripts, strict=True))
        if queue:
            queued = on_each(items, lambda x: remote.submit(x[0].ex, x[2]))
        else:
            try:
                started = on_each(items, lambda x: remote.launch(x[0].ex, x[1], x[2]))
            except ProvisionError:
                if len(items) > 1:  # the others would wait for the rendezvous: stop them
                    on_each(items, lambda x: _kill_quietly(x[0], job_id))
                raise
    if queue:
        show_queued(queued, json_)
        return {"job": job_id}
    follow = how_to_follow(c, hosts, job_id)
    if json_:
        output.print_json({"id": job_id, "hosts": [x.as_json() for x in started],
                           "follow": follow})
    else:
        output.job_started(started, specs, follow)
    return {"job": job_id}


def _unused_id(store: Store, name: str) -> str:
    """A new id for a job named for its command: ids are to the second, so a run started in the
    same second as the last one from here (a script starting two) waits for the next second
    rather than being refused as a job that exists already."""
    last = store.root / LAST_JOB_ID
    job_id = new_id(name)
    try:
        if last.read_text().strip() == job_id:
            time.sleep(1 - time.time() % 1 + 0.01)
            job_id = new_id(name)
    except OSError:
        pass
    try:
        store.root.mkdir(parents=True, exist_ok=True)
        last.write_text(job_id + "\n")
    except OSError:
        pass
    return job_id


def send_code(s: Session, folder: Path, workdir: str | None, exclude: Sequence[str]) -> str:
    """Send ``folder`` to the host (``workdir``, else ``<data dir>/<folder's name>``) through
    sync up; returns the folder it is in on the host."""
    only, patterns, how = selection(folder, exclude, s.store.root)
    check_size(folder, only, patterns)
    rep = sync_up(s.ex, s.target, folder, workdir or folder.name,
                  SyncOptions(excludes=patterns, only=only))
    _notify(f"{s.target.name}: code {folder} -> {rep.dest}: sent {rep.files} file(s) "
            f"({human(rep.bytes)}), {rep.same} unchanged ({how})")
    return rep.dest


def _kill_quietly(s: Session, job: str) -> None:
    try:
        remote.kill(s.ex, job, 2)
    except ProvisionError:
        pass


def _specs(base: JobSpec, targets: Sequence[Target], store: Store, facts: list[HostFacts] | None,
           nproc: int, port: int, addr: str | None) -> list[JobSpec]:
    """Each host's spec: the fixes its last validation named; over --hosts (with each host's
    facts), torchrun with its rank and the rendezvous, and the interface its collectives use."""
    specs = []
    rdzv = None
    if facts is not None:
        nodes = [Node(t.name, t.host, f) for t, f in zip(targets, facts, strict=True)]
        rdzv = rendezvous(nodes, port, addr)
        _notify(f"rendezvous on {rdzv.addr}:{rdzv.port} ({rdzv.reason})")
    for rank, target in enumerate(targets):
        env, why = validation_env(store.last_report(target.name))
        for line in why:
            _notify(f"{target.name}: applying {line}")
        argv = base.argv
        if rdzv is not None and facts is not None:
            argv = torchrun_argv(base.argv, nnodes=len(targets), node_rank=rank,
                                 nproc_per_node=nproc_for(facts[rank], base.gpus, nproc),
                                 master_addr=rdzv.addr, master_port=rdzv.port)
            env = {**env, **rdzv.env(rank)}
        specs.append(replace(base, argv=argv, env=env, data_dirs=log_dirs(target), rank=rank,
                             nnodes=len(targets),
                             hosts=tuple(t.name for t in targets) if rdzv else ()))
    return specs




def job_log_tail(ex: Executor, job: str, limit: int = 256 * 1024) -> tuple[str, str]:
    """(the job's id, the end of its log on the host, at most ``limit`` bytes): what
    `doctor --job` reads. One listing for the log's size, then one read from near its end."""
    check_ref(job)
    listed = remote.list_jobs(ex).jobs  # newest first, as find_job picks a name's newest
    found = next((j for j in listed if j.id == job), None) or \
        next((j for j in listed if j.name == job), None)
    if found is None:
        prefixed = [j for j in listed if j.id.startswith(job)]
        found = prefixed[0] if len(prefixed) == 1 else None
    offset = max(0, (found.log_size or 0) - limit) if found is not None else 0
    kept: deque[str] = deque(maxlen=20000)

    def keep(line: str) -> None:
        if not line.startswith(remote.JOB_HEADER) and not remote.is_result_line(line):
            kept.append(line)

    remote.follow_log(ex, job, expect=found.id if found is not None else "", offset=offset,
                      follow=False, on_line=keep, on_err=lambda line: None)
    return (found.id if found is not None else job), "\n".join(kept)


def failure_note(host: str, job: str, log_tail: str, how: str) -> str:
    """One line for a job that did not exit 0: doctor's diagnosis of the end of its log, and
    the command that says more (the full diagnosis with this host's facts)."""
    from ..doctor.match import diagnose, headline

    line = headline(diagnose({f"job {job}": log_tail})) if log_tail.strip() else None
    return (f"{host}: {job} {how}: {line or 'no known failure in the end of its log'}; "
            f"`gpu-provision -H {host} doctor --job {job}` says more")


def logs(c: Context, job: str, follow: bool = False, all_: bool = False,
         hosts: str | None = None) -> None:
    """The `logs` task's body; its help is in provision/tasks_jobs.py."""
    check_ref(job)
    targets = targets_of(c, hosts)
    store = Store.here()
    many = len(targets) > 1
    lock = threading.Lock()
    codes: list[int | None] = []
    streaming: list[Session] = []

    def stop() -> None:
        with lock:
            for s in streaming:
                s.ex.conn.close()

    def one(target: Target) -> int | None:
        path = position_path(store, target.name, job)
        start = Position("") if all_ else load(path)
        prefix = f"{target.name}: " if many else ""

        last: deque[str] = deque(maxlen=TAIL_LINES)

        def emit(line: str) -> None:
            last.append(line)
            with lock:
                output.log_line(prefix + line)

        reader = Reader(path, start, emit)
        if start.offset or start.lines:
            _notify(f"{target.name}: resuming where the last reader stopped (--all prints the "
                    "whole log)")
        with opened([target], store, keep_log=False) as [s]:
            with lock:
                streaming.append(s)
            try:
                r = remote.follow_log(s.ex, job, expect=start.job, offset=start.offset,
                                      lines=start.lines, follow=follow, on_line=reader.on_line,
                                      on_err=lambda line: None)
            except SSHError as exc:
                reader.close()
                raise ProvisionError(f"{exc}; {reader.lines - start.lines} new line(s) printed: "
                                     "run the same command again to resume there") from None
            except BaseException:
                reader.close()
                raise
            ended = isinstance(r.result, dict) and isinstance(r.result.get("rc"), int)
            changed = _health_of(s, job) if ended else []
        reader.finished(r.size, ended)
        for line in changed:  # what the job's GPUs went through while it ran
            _notify(f"{target.name}: health: {line}")
        if ended:
            rc = int(r.result["rc"])
            if follow and rc != 0:
                _notify(failure_note(target.name, job, "\n".join(last), f"exited {rc}"))
            return rc
        if not follow:
            return None
        _notify(f"{target.name}: the job ended without an exit code (lost in a reboot, or its "
                "supervisor was killed): `jobs` says which")
        return 255

    try:
        codes = on_each(targets, one, stop)
    except KeyboardInterrupt:
        raise Exit("stopped following; the job goes on. Run the same command again to resume",
                   code=130) from None
    if follow:
        bad = [x for x in codes if x]
        if bad:
            raise Exit(code=max(x for x in bad if x is not None))




def _health_of(s: Session, job: str) -> list[str]:
    """The job's health lines; a host that cannot say is not an error of `logs`."""
    try:
        return remote.job_health(s.ex, job)
    except ProvisionError:
        return []


def jobs(c: Context, json_: bool = False, all_: bool = False, hosts: str | None = None) -> None:
    """The `jobs` task's body; its help is in provision/tasks_jobs.py."""
    targets = targets_of(c, hosts)
    store = Store.here()

    def one(target: Target) -> HostJobs:
        with opened([target], store, keep_log=False) as [s]:  # read-only: no run folder
            found = remote.list_jobs(s.ex)
        return replace(found, host=target.name, jobs=tuple(replace(j, host=target.name)
                                                            for j in found.jobs))

    listed = on_each(targets, one)
    notes = []
    if not all_:
        shown = []
        for h in listed:
            ended = [j for j in h.jobs if not j.running and j.state != "queued"]
            keep = {j.id for j in ended[:SHOWN]} | {j.id for j in h.jobs
                                                    if j.running or j.state == "queued"}
            shown.append(replace(h, jobs=tuple(j for j in h.jobs if j.id in keep)))
            if len(ended) > SHOWN:
                notes.append(f"{h.host}: {len(ended) - SHOWN} older job(s) not shown (--all)")
        listed = shown
    failed = {(h.host, j.id): failure_note(h.host, j.id, j.log_tail, j.label)
              for h in listed for j in h.jobs
              if j.failed and (j.log_tail or j.state == "exited")}
    health = health_notes(listed)
    if json_:
        output.print_json([{**j.as_json(h.now), "diagnosis": failed.get((h.host, j.id)),
                            "health": health.get((h.host, j.id), [])} for h in listed for j in h.jobs])
    else:
        output.jobs_table(listed, [*notes, *failed.values(),
                                   *(f"{host}: job {jid}: {line}" for (host, jid), lines in health.items()
                                     for line in lines)])




def kill(c: Context, job: str, grace: int = 10, hosts: str | None = None,
         json_: bool = False) -> None:
    """The `kill` task's body; its help is in provision/tasks_jobs.py."""
    check_ref(job)
    if grace < 0:
        raise UsageError("--grace: seconds, 0 or more")
    targets = targets_of(c, hosts)
    store = Store.here()

    def one(target: Target) -> dict[str, Any]:
        with opened([target], store) as [s]:
            return {"host": target.name, **remote.kill(s.ex, job, grace)}

    reports = on_each(targets, one)
    if json_:
        output.print_json(reports)
    else:
        for r in reports:
            output.kill_report(r)






def watch(c: Context, once: bool = False, json_: bool = False, interval: int = 2,
          samples: int = 0, idle_minutes: float = 10.0, hosts: str | None = None) -> None:
    """The `watch` task's body; its help is in provision/tasks_jobs.py."""
    if interval < 1:
        raise UsageError("--interval: 1 second or more")
    targets = targets_of(c, hosts)
    names = [t.name for t in targets]
    monitor = Monitor(idle_minutes=idle_minutes)
    lock = threading.Lock()
    store = Store.here()
    count = 1 if once else max(0, samples)
    live_sessions: list[Session] = []

    def one(target: Target) -> None:
        def on_line(line: str) -> None:
            sample = parse_sample(line, target.name)
            if sample is not None:
                with lock:
                    monitor.update(sample)

        try:
            with opened([target], store, keep_log=False) as [s]:
                with lock:
                    live_sessions.append(s)
                remote.sample(s.ex, on_line, interval=interval, samples=count,
                              data_dirs=log_dirs(target))
        except ProvisionError as exc:
            with lock:
                monitor.errors[target.name] = str(exc)

    threads = [threading.Thread(target=one, args=(t,), daemon=True) for t in targets]
    for th in threads:
        th.start()
    try:
        if once or json_:
            for th in threads:
                th.join()
        else:
            from rich.live import Live

            def view() -> Any:
                with lock:
                    return output.watch_view(monitor, names)

            with Live(view(), console=output.console, refresh_per_second=2) as live:
                while any(th.is_alive() for th in threads):
                    time.sleep(0.25)
                    live.update(view())
    except KeyboardInterrupt:
        pass  # Ctrl-C ends the watch; closing the connections ends the samplers
    finally:
        with lock:
            for s in live_sessions:
                s.ex.conn.close()
    for th in threads:
        th.join(timeout=10)
    with lock:
        if json_:
            output.print_json(monitor.as_json(names))
        elif once:
            output.console.print(output.watch_view(monitor, names))
        failed = [n for n in names if n not in monitor.latest]
    if failed and len(failed) == len(names) and monitor.errors:
        raise ProvisionError("; ".join(monitor.errors[n] for n in failed if n in monitor.errors))




