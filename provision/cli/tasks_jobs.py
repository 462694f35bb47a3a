"""The renter's day after bootstrap: run, logs, jobs, kill, watch.

Declarations only: each task imports provision/jobs/commands.py when it runs, so listing the
tasks and the other commands' start-up load none of it (Fabric, paramiko, the job modules).
"""

from __future__ import annotations

from typing import Any

from invoke.context import Context

from ..jobs import DEFAULT_PORT, SHOWN
from .taskkit import reports_errors, task

RUN_HELP = {
    "name": "the job's name (default: the script's, train for python train.py)",
    "gpus": "GPU indexes for CUDA_VISIBLE_DEVICES, e.g. 0,1 (default: all)",
    "workdir": "the folder it runs in on the host, where the code goes (default: <data dir>/<the "
               "code folder's name>; with --no-code the home; ~ and relative paths are "
               "the home's)",
    "share": "run even when another job uses these GPUs",
    "hosts": "one job over these hosts (or a group): torchrun on each, the rendezvous on the first",
    "nproc_per_node": "with --hosts: processes per host (default: one per GPU, 1 without GPUs)",
    "master_port": f"with --hosts: the rendezvous port on the first host (default {DEFAULT_PORT})",
    "master_addr": "with --hosts: the address the others reach the first host at (default: from "
                   "the facts)",
    "launcher": "auto (tmux when the host has it, else setsid + nohup), tmux or setsid",
    "code": "the folder sent to the host as the job's code (default: the current one); it "
            "runs in <data dir>/<folder's name>, or --workdir",
    "no_code": "send no code: run in --workdir (default the home) as the host has it",
    "exclude": "leave out of the code files matching this rsync-style pattern (repeatable), "
               "besides what .gitignore leaves out, e.g. 'data/'",
    "json": "print what was started as JSON",
    "queue": "put the job in the host's queue: it starts once the GPUs it asks for are free "
             "(--gpus N: that many free GPUs, lowest indexes first; --gpus 0,1: those), with "
             "its code as it is now; `queue` shows, moves and drops queued jobs",
    "parallel": "with --queue: at most this many jobs of the queue at once from now on (default: "
                "as many as the GPUs allow)",
}


@task(help=RUN_HELP, command=True, iterable=["exclude"])
@reports_errors
def run(c: Context, name: str | None = None, gpus: str | None = None, workdir: str | None = None,
        share: bool = False, hosts: str | None = None, nproc_per_node: int = 0,
        master_port: int = DEFAULT_PORT, master_addr: str | None = None, launcher: str = "auto",
        code: str | None = None, no_code: bool = False, exclude: list[str] | None = None,
        json_: bool = False, queue: bool = False, parallel: int = -1) -> dict[str, Any]:
    """Send the code, start a job detached from SSH in the bootstrapped env, return at once.

    The current folder (or --code DIR) goes to the host first, through sync up: what .gitignore
    leaves out stays here, only what changed moves; the job runs there. A script the command
    names (train.py) that is not there is refused before anything starts.
    The command after -- runs as given (its words are argv, never re-split by a shell), with the
    pushed tokens, CUDA_VISIBLE_DEVICES, PYTHONUNBUFFERED=1 and the fixes the last validation
    named (NCCL_P2P_DISABLE=1 ...); output to a log under the data dir. Without -- it runs the
    recipe's job:. A job on GPUs another running job uses is refused unless --share. With
    --hosts a,b it is torchrun on each host, the rendezvous on the first.
    Example: gpu-provision -H my-4090 run --gpus 0,1 -- python train.py --epochs 10
    """
    from . import jobs_commands as commands
    return commands.run(c, name=name, gpus=gpus, workdir=workdir, share=share, hosts=hosts,
                        nproc_per_node=nproc_per_node, master_port=master_port,
                        master_addr=master_addr, launcher=launcher, code=code, no_code=no_code,
                        exclude=tuple(exclude or ()), json_=json_, queue=queue,
                        parallel=None if parallel < 0 else parallel)


LOGS_HELP = {
    "job": "the job: its id, its name (the newest job of that name) or the start of its id",
    "follow": "keep streaming until the job ends; exit with its exit code",
    "all": "from the start of the log, whatever an earlier reader printed",
    "hosts": "every host of a job run with --hosts (its ranks), or a group",
}


@task(positional=["job"], help=LOGS_HELP, short={"follow": "f"})
@reports_errors
def logs(c: Context, job: str, follow: bool = False, all_: bool = False,
         hosts: str | None = None) -> None:
    """Print a job's log from where the last reader stopped; -f follows it to the job's end.

    A re-run after an SSH drop, Ctrl-C or a killed terminal resumes without repeating or losing
    lines. Example: gpu-provision -H my-4090 logs train -f
    """
    from . import jobs_commands as commands
    commands.logs(c, job, follow=follow, all_=all_, hosts=hosts)


@task(help={"json": "print the jobs as JSON", "all": f"every job, not only the running ones "
                                                     f"and the {SHOWN} newest others",
            "hosts": "several hosts (or a group) in one table"})
@reports_errors
def jobs(c: Context, json_: bool = False, all_: bool = False, hosts: str | None = None) -> None:
    """Each job on the host: state (running / exited N / killed by OOM / lost in a reboot),
    start, duration, GPUs, the GPU memory its processes hold, log size and last line.

    Example: gpu-provision -H my-4090 jobs --json
    """
    from . import jobs_commands as commands
    commands.jobs(c, json_=json_, all_=all_, hosts=hosts)


@task(positional=["job"], help={"job": LOGS_HELP["job"],
                                "grace": "seconds between SIGINT, SIGTERM and SIGKILL (default 10)",
                                "hosts": LOGS_HELP["hosts"], "json": "print the report as JSON"})
@reports_errors
def kill(c: Context, job: str, grace: int = 10, hosts: str | None = None,
         json_: bool = False) -> None:
    """Stop a job: SIGINT (as Ctrl-C would), then SIGTERM, then SIGKILL, each after the grace
    period while it still runs; says which one ended it.

    Example: gpu-provision -H my-4090 kill train
    """
    from . import jobs_commands as commands
    commands.kill(c, job, grace=grace, hosts=hosts, json_=json_)


WATCH_HELP = {
    "once": "one sample, then exit",
    "json": "print the view as JSON (with --once: for scripts)",
    "interval": "seconds between samples (default 2)",
    "samples": "stop after this many samples (default: until Ctrl-C)",
    "idle_minutes": "alert when a running job's GPUs sit at 0% this long (default 10)",
    "hosts": "several hosts (or a group) in one table",
}


@task(help=WATCH_HELP)
@reports_errors
def watch(c: Context, once: bool = False, json_: bool = False, interval: int = 2,
          samples: int = 0, idle_minutes: float = 10.0, hosts: str | None = None) -> None:
    """A live view of the GPUs (utilisation, memory, temperature, power, SM clock, throttling),
    the jobs (state, log growth) and disk and memory, with alerts; -H a,b,c in one table.

    ONE long-lived sampler per host streams a JSON line every --interval seconds: one remote
    execution for the whole watch. Example: gpu-provision -H my-4090 watch;
    gpu-provision -H my-4090 watch --once --json
    """
    from . import jobs_commands as commands
    commands.watch(c, once=once, json_=json_, interval=interval, samples=samples,
                   idle_minutes=idle_minutes, hosts=hosts)


QUEUE_HELP = {
    "move": "a queued job (its id, name or the start of its id) to move; with --to",
    "to": "the position --move puts it at (1: next to start)",
    "drop": "a queued job to take out of the queue (its folder stays)",
    "parallel": "at most this many jobs of the queue at once (0: as many as the GPUs allow)",
    "json": "print the queue as JSON",
}


@task(help=QUEUE_HELP)
@reports_errors
def queue(c: Context, move: str | None = None, to: int = 0, drop: str | None = None,
          parallel: int = -1, json_: bool = False) -> None:
    """The host's job queue (`run --queue`): its jobs in order; move or drop one; the parallel
    limit. The queue lives on the host and starts each job once its GPUs are free.

    Example: gpu-provision -H my-4090 queue --move sweep-3 --to 1
    """
    from . import queue_commands as commands
    commands.queue(c, move=move, to=to, drop=drop, parallel=parallel, json_=json_)


# shown together: one view of every -H host (not one run per host)
for _t in (jobs, logs, kill, watch):
    _t.whole_fleet = True
