"""The host side of jobs: render the scripts (templates/job_*.sh.j2, jobs_list.sh.j2,
watch_sampler.sh.j2) and run each as ONE remote execution through the step runtime and the
executor. No decisions here: the spec, the state rules and the alerts are pure modules."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ProvisionError, RemoteError
from ..remote.command import bash_script
from ..remote.executor import Executor
from ..remote.runtime import MARKER, StepRun, run_follow, run_foreground
from ..remote.templating import render
from . import health
from .spec import JobSpec
from .state import HostJobs, parse_records

NOT_FOUND = 3  # the job scripts' exit code when no job has the name asked for
JOB_HEADER = "GPU_PROVISION_JOB "  # the first line of a followed log: the job's id


@dataclass(frozen=True)
class Launched:
    host: str
    id: str
    wrapper: int  # the supervisor's pid
    launcher: str  # tmux | setsid
    session: str  # the tmux session (tmux attach -t ...)
    log: str
    gpus: str  # "0,1"; "" on a host without GPUs
    workdir: str
    prefix: str  # the env it runs in

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host, "id": self.id, "pid": self.wrapper, "launcher": self.launcher,
                "tmux_session": self.session if self.launcher == "tmux" else None,
                "log": self.log, "gpus": [int(g) for g in self.gpus.split(",") if g],
                "workdir": self.workdir, "env": self.prefix}


def wrapper_script(spec: JobSpec) -> str:
    return render("jobs/job_wrapper.sh.j2", id=spec.id, argv=spec.argv, env=dict(spec.env))


def launch_script(spec: JobSpec, queue: bool = False, gpu_count: int | None = None,
                  parallel: int | None = None) -> str:
    """The start of a job; ``queue``: into the host's queue instead (it starts when the GPUs it
    asks for are free: ``gpu_count`` of them, else ``spec.gpus``, else all), with at most
    ``parallel`` jobs of the queue at once from now on (None: as it was)."""
    if gpu_count is not None:
        queued = f"count {gpu_count}"
    elif spec.gpus is not None:
        queued = "ids " + ",".join(map(str, spec.gpus))
    else:
        queued = "all"
    return render("jobs/job_launch.sh.j2", id=spec.id, name=spec.name, argv=spec.argv, gpus=spec.gpus,
                  workdir=spec.workdir, share=spec.share, spec_json=spec.spec_json(),
                  data_dirs=spec.data_dirs, wrapper=wrapper_script(spec), launcher=spec.launcher,
                  files=spec.files, sent=spec.sent, notify_script=spec.notify_script,
                  queue=queue, gpu_count=gpu_count, queued=queued, parallel=parallel,
                  queue_runner=render("jobs/queue_runner.sh.j2") if queue else "")


@dataclass(frozen=True)
class Queued:
    host: str
    id: str
    position: int
    workdir: str
    log: str


def submit(ex: Executor, script: str) -> Queued:
    """Put a job in the host's queue (the rendered ``launch_script(spec, queue=True)``)."""
    r = run_foreground(ex, "run", script, again="run --queue")
    got: Mapping[str, Any] = r.result if isinstance(r.result, Mapping) else {}
    if got.get("error") or not got.get("id"):
        raise ProvisionError(f"{ex.host}: {got.get('error') or f'the queue reported {r.result!r}'}")
    return Queued(ex.host, str(got["id"]), int(got.get("queued") or 0),
                  str(got.get("workdir") or ""), str(got.get("log") or ""))


def queue_ctl(ex: Executor, mode: str, job: str = "", to: int = 0, parallel: int = 0
              ) -> Mapping[str, Any]:
    """The host's queue: list, move JOB TO, drop JOB, parallel N (templates/jobs/queue_ctl)."""
    body = render("jobs/queue_ctl.sh.j2", mode=mode, job=job, to=str(to), parallel=str(parallel))
    r = run_foreground(ex, "queue", body, again="queue")
    got: Mapping[str, Any] = r.result if isinstance(r.result, Mapping) else {}
    if got.get("error") or "queued" not in got:
        raise ProvisionError(f"{ex.host}: queue: {got.get('error') or r.result!r}")
    return got


def _not_found(exc: RemoteError) -> ProvisionError:
    """The job scripts' "no such job" (exit 3) as one line naming the jobs there are."""
    text = next((ln.removeprefix("gpu-provision: ") for ln in exc.output.splitlines()
                 if ln.startswith("gpu-provision: no job")), exc.output.strip())
    return ProvisionError(f"{exc.host}: {text}")


def launch(ex: Executor, spec: JobSpec, script: str | None = None) -> Launched:
    """Start the job on the host and return at once (one remote execution). ``script``: the
    rendered launch_script(spec), when it was made beforehand."""
    r = run_foreground(ex, "run", script or launch_script(spec), again="run")
    got: Mapping[str, Any] = r.result if isinstance(r.result, Mapping) else {}
    if got.get("error") or not got.get("id"):
        raise ProvisionError(f"{ex.host}: {got.get('error') or f'the start reported {r.result!r}'}")
    return Launched(host=ex.host, id=str(got["id"]), wrapper=int(got["wrapper"]),
                    launcher=str(got["launcher"]), session=str(got.get("session") or ""),
                    log=str(got["log"]), gpus=str(got.get("gpus") or ""),
                    workdir=str(got.get("workdir") or ""), prefix=str(got.get("prefix") or ""))


def list_script() -> str:
    return render("jobs/jobs_list.sh.j2")


def list_jobs(ex: Executor) -> HostJobs:
    """Every job on the host with its state (one remote execution)."""
    return ex.query("jobs", list_script(), lambda out: parse_records(out, ex.host),
                    what="the job list", reads_only=True)


def health_script(job: str) -> str:
    return render("jobs/job_health.sh.j2", job=job)


def job_health(ex: Executor, job: str) -> list[str]:
    """What changed in the GPUs' health while the job ran (or so far): one remote execution."""
    def parse(out: str) -> list[str]:
        got = dict(line.partition(" ")[::2] for line in out.splitlines() if line.startswith("health-"))
        return health.job_health((got.get("health-start", ""), got.get("health-end", "")),
                                 got.get("health-now", ""))
    return ex.query("job-health", health_script(job), parse, what="the job's GPU health",
                    reads_only=True)


def kill_script(job: str, grace: int) -> str:
    return render("jobs/job_kill.sh.j2", job=job, grace=grace)


def kill(ex: Executor, job: str, grace: int) -> Mapping[str, Any]:
    """SIGINT, then SIGTERM, then SIGKILL, each after ``grace`` seconds while the job runs."""
    try:
        r = run_foreground(ex, "kill", kill_script(job, grace), again="kill")
    except RemoteError as exc:
        raise _not_found(exc) if exc.remote_exit == NOT_FOUND else exc from None
    if not isinstance(r.result, Mapping):
        raise ProvisionError(f"{ex.host}: kill reported {r.result!r}")
    return r.result


def where_script(job: str, expect: str, follow: bool) -> str:
    return render("jobs/job_where.sh.j2", job=job, expect=expect, follow=follow, header=JOB_HEADER)


def follow_log(ex: Executor, job: str, *, expect: str = "", offset: int = 0, lines: int = 0,
               follow: bool = False, on_line: Callable[[str], None],
               on_err: Callable[[str], None]) -> StepRun:
    """Stream the job's log from the reader's position (one remote execution): while it runs
    when ``follow``, else what is there. The result is how it ended (exit.json) or None."""
    try:
        return run_follow(ex, "logs", where_script(job, expect, follow), offset=offset,
                          lines=lines, on_line=on_line, on_err=on_err, again="logs")
    except RemoteError as exc:
        raise _not_found(exc) if exc.remote_exit == NOT_FOUND else exc from None


def sampler_script(interval: int, samples: int, data_dirs: Sequence[str]) -> str:
    return render("jobs/watch_sampler.sh.j2", interval=interval, samples=samples,
                  data_dirs=tuple(data_dirs))


def sample(ex: Executor, on_line: Callable[[str], None], *, interval: int = 2, samples: int = 0,
           data_dirs: Sequence[str] = ()) -> int:
    """Run the sampler (ONE remote execution for its whole life): each JSON line to ``on_line``.
    Returns its exit code; ends when ``samples`` are out, or when the connection closes."""
    r = ex.run(bash_script(sampler_script(interval, samples, data_dirs)), step="watch",
               check=False, on_out=on_line, on_err=lambda _: None, reads_only=True)
    return r.exit_code


def is_result_line(line: str) -> bool:
    """The runtime's result line that ends a followed log (not part of the log)."""
    return line.startswith(f"{MARKER} {{")
