"""What the host says of each job (templates/jobs/_jobs.sh.j2 ``job_record``), parsed once, and the
rules that name its state: running / exited N / killed by OOM / killed (by `kill`) / lost in a
reboot."""

from __future__ import annotations

import base64
import gzip
import json
import signal
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

State = Literal["running", "exited", "oom", "killed", "lost", "vanished", "queued", "dropped"]


@dataclass(frozen=True)
class GpuApp:
    """A process nvidia-smi sees on a GPU, with its session and ancestors (to find its job)."""

    pid: int
    mib: int
    session: int
    ancestors: tuple[int, ...]


@dataclass(frozen=True)
class JobState:
    host: str
    id: str
    name: str
    argv: tuple[str, ...]
    state: State
    gpus: tuple[int, ...] = ()
    exit_code: int | None = None
    signal: str | None = None  # the signal `kill` ended it with
    evidence: str = ""  # the kernel's line on an OOM kill
    started: float | None = None
    ended: float | None = None
    log_path: str = ""
    log_size: int | None = None  # None: the log is gone
    last_line: str = ""
    hit: str = ""  # the last log line with "out of memory" or NaN (watch)
    log_tail: str = ""  # the end of the log of a job that ended and did not exit 0 (`jobs`)
    gpu_memory_mib: int | None = None  # what its processes hold (None: none seen on a GPU)
    pid: int | None = None
    launcher: str = ""
    rank: int = 0
    nnodes: int = 1
    spec: dict[str, Any] = field(default_factory=dict)
    # the GPUs' health as it started and ended (templates/jobs/_health.sh.j2; jobs/health.py)
    health: tuple[str, str] = ("", "")
    queue_position: int | None = None  # its place in the host's queue (1: next to start)
    wants: str = ""  # what a queued job asks for: "count 2", "ids 0,1", "all"

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def label(self) -> str:
        """running / exited N / killed by OOM / killed (SIGTERM) / lost in a reboot."""
        if self.state == "exited":
            code = self.exit_code if self.exit_code is not None else "?"
            sig = signal_name(self.exit_code)
            return f"exited {code}" + (f" ({sig})" if sig else "")
        if self.state == "queued":
            return f"queued (#{self.queue_position or '?'})"
        return {"running": "running", "oom": "killed by OOM", "dropped": "dropped from the queue",
                "killed": f"killed ({self.signal or 'signal'})", "lost": "lost in a reboot",
                "vanished": "ended without an exit code (its supervisor was killed)"}[self.state]

    @property
    def failed(self) -> bool:
        return self.state in ("oom", "lost", "vanished") or \
            (self.state == "exited" and self.exit_code != 0)

    def duration(self, now: float) -> float | None:
        if self.started is None:
            return None
        if self.running:
            return max(0.0, now - self.started)
        return max(0.0, self.ended - self.started) if self.ended is not None else None

    def as_json(self, now: float) -> dict[str, Any]:
        return {"host": self.host, "id": self.id, "name": self.name, "state": self.label,
                "state_kind": self.state, "exit_code": self.exit_code, "command": list(self.argv),
                "started": self.started, "ended": self.ended, "duration_s": self.duration(now),
                "gpus": list(self.gpus), "gpu_memory_mib": self.gpu_memory_mib,
                "log": self.log_path, "log_size": self.log_size, "last_line": self.last_line,
                "evidence": self.evidence or None, "pid": self.pid, "launcher": self.launcher,
                "rank": self.rank, "nnodes": self.nnodes, "queue_position": self.queue_position,
                "wants": self.wants or None}


@dataclass(frozen=True)
class HostJobs:
    host: str
    now: float
    boot: str
    jobs: tuple[JobState, ...]
    health_now: str = ""  # the GPUs' health as listed: a running job's end so far


def signal_name(code: int | None) -> str | None:
    """128+N is how a shell reports a command ended by signal N."""
    if code is None or not 128 < code < 128 + 65:
        return None
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return None


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def parse_apps(lines: Iterable[str]) -> tuple[GpuApp, ...]:
    apps = []
    for line in lines:
        nums = [_int(x) for x in line.split()[1:]]
        if len(nums) >= 3 and all(n is not None for n in nums):
            pid, mib, sid, *chain = (n for n in nums if n is not None)
            apps.append(GpuApp(pid, mib, sid, tuple(chain)))
    return tuple(apps)


def memory_of(pid: int | None, apps: Iterable[GpuApp]) -> int | None:
    """GPU memory held by the processes of the job whose leader is ``pid`` (its session, or
    started by it)."""
    if pid is None:
        return None
    held = [a.mib for a in apps if a.session == pid or pid in a.ancestors or a.pid == pid]
    return sum(held) if held else None


def unpack_tail(packed: str) -> str:
    """The record's ``tail`` (gzip, then base64) as text; "" when absent or damaged."""
    if not packed:
        return ""
    try:
        return gzip.decompress(base64.b64decode(packed)).decode("utf-8", errors="replace")
    except (ValueError, OSError, EOFError, zlib.error):
        return ""


def job_state(raw: dict[str, str], host: str, host_boot: str,
              apps: tuple[GpuApp, ...] = ()) -> JobState:
    """One job record (``key -> rest of the line``) -> its typed state, by these rules: a live
    supervisor is running; an exit code is exited N, or killed by OOM when SIGKILL ended it and
    the kernel logged an OOM kill during its life, or killed when `kill` ended it; no exit code
    on another boot is lost in a reboot; none on this boot is an OOM kill when the kernel logged
    one of its processes, else a supervisor that was killed itself."""
    try:
        spec: dict[str, Any] = json.loads(raw.get("spec") or "{}")
    except ValueError:
        spec = {}
    wrapper = raw.get("wrapper", "").split()
    alive = len(wrapper) == 2 and wrapper[1] == "alive"
    exit_info: dict[str, Any] = {}
    if raw.get("exit"):
        try:
            exit_info = json.loads(raw["exit"])
        except ValueError:
            exit_info = {}
    rc = exit_info.get("rc") if isinstance(exit_info.get("rc"), int) else None
    killed = raw.get("killed", "").split()
    evidence = raw.get("oom", "").strip()
    boot = raw.get("boot", "").strip()
    state: State
    queued = raw.get("queued", "").split(" ", 1)
    if alive:
        state = "running"
    elif "queued" in raw and rc is None:
        state = "queued"
    elif "dropped" in raw and rc is None:
        state = "dropped"
    elif rc is not None:
        if killed and rc != 0:  # `kill` ended it (a job that caught the signal and exited 0 did not)
            state = "killed"
        elif rc == 137 and evidence:
            state = "oom"
        else:
            state = "exited"
    elif boot and host_boot and boot != host_boot:
        state = "lost"
    elif evidence:
        state = "oom"
    elif killed:
        state = "killed"
    else:
        state = "vanished"
    log = raw.get("log", "").split(" ", 1)
    size = _int(log[0]) if log and log[0] else None
    pid = _int(raw.get("pid", ""))
    gpus = tuple(int(g) for g in raw.get("gpus", "").split(",") if g.strip().isdigit())
    started = _int(raw.get("started", "").strip())
    ended = exit_info.get("ended") if isinstance(exit_info.get("ended"), int) else None
    return JobState(
        host=host, id=raw.get("job", "").strip(), name=str(spec.get("name") or raw.get("job", "")),
        argv=tuple(str(a) for a in spec.get("argv") or ()), state=state, gpus=gpus,
        exit_code=rc, signal=killed[0] if killed and state == "killed" else None,
        evidence=evidence, started=float(started) if started is not None else None,
        ended=float(ended) if ended is not None else None,
        log_path=log[1] if len(log) == 2 else "", log_size=size if size is None or size >= 0 else None,
        last_line=raw.get("last", ""), hit=raw.get("hit", "").strip(),
        log_tail=unpack_tail(raw.get("tail", "").strip()),
        gpu_memory_mib=memory_of(pid, apps), pid=pid, launcher=raw.get("launcher", "").strip(),
        rank=int(spec.get("rank") or 0), nnodes=int(spec.get("nnodes") or 1), spec=spec,
        health=(raw.get("health-start", ""), raw.get("health-end", "")),
        queue_position=_int(queued[0]) if state == "queued" and queued[0] else None,
        wants=queued[1].strip() if state == "queued" and len(queued) == 2 else "")


def parse_records(text: str, host: str, now: float | None = None,
                  host_boot: str | None = None) -> HostJobs:
    """The lister's (or a watch sample's) ``key value`` lines -> every job on the host, newest
    first."""
    head: dict[str, str] = {}
    apps: list[str] = []
    records: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        if key == "job":
            current = {"job": rest}
        elif key == "end":
            if current is not None:
                records.append(current)
            current = None
        elif current is not None:
            current[key] = rest
        elif key == "app":
            apps.append(line)
        elif key in ("now", "host-boot", "health-now"):
            head[key] = rest.strip()
    gpu_apps = parse_apps(apps)
    boot = host_boot if host_boot is not None else head.get("host-boot", "")
    jobs = [job_state(r, host, boot, gpu_apps) for r in records]
    jobs.sort(key=lambda j: (j.started or 0, j.id), reverse=True)
    # then the queue, in its order (a queued job has not started)
    jobs = [j for j in jobs if j.state != "queued"] + sorted(
        (j for j in jobs if j.state == "queued"), key=lambda j: j.queue_position or 0)
    clock = now if now is not None else float(_int(head.get("now", "")) or 0)
    return HostJobs(host=host, now=clock, boot=boot, jobs=tuple(jobs), health_now=head.get("health-now", ""))
