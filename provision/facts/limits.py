"""What the host lets a job use, beyond what /proc shows: the cgroup's memory limit and CPU
quota (a container sees the machine's RAM and cores in /proc/meminfo and nproc), /dev/shm's
size, the open-files limit and the free inodes of each data dir. Pure parsers, and the one
judgement of them (``judge``) that validate and doctor both show.

Formats (the kernel's Documentation/admin-guide/cgroup-v2.rst and cgroup-v1/memory.rst,
sched-bwc.rst): v2 ``memory.max`` is bytes or "max", ``cpu.max`` is "$MAX $PERIOD" (MAX "max":
no quota); v1 ``memory.limit_in_bytes`` is bytes (no limit: LONG_MAX rounded down to a page,
9223372036854771712), ``cpu.cfs_quota_us`` is microseconds per ``cpu.cfs_period_us`` (-1: none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

NO_LIMIT = 1 << 62  # v1's "unlimited" is LONG_MAX rounded to a page: anything this big is none


@dataclass(frozen=True)
class Limits:
    memory_limit_gb: float | None = None  # the cgroup's memory limit; None: none set
    cpu_quota: float | None = None  # cores the cgroup's CPU quota allows; None: none set
    shm_mb: float | None = None  # size of /dev/shm; None: not mounted
    open_files: int | None = None  # the soft open-files limit (ulimit -n)
    open_files_hard: int | None = None
    inodes: tuple[tuple[str, int, int], ...] = ()  # (path, free inodes, total inodes)
    # the login's disk quotas `quota -w` reports: (file system, KiB used, KiB allowed)
    quotas: tuple[tuple[str, int, int], ...] = ()


def parse_cgroup(text: str) -> tuple[float | None, float | None]:
    """Lines ``<file> <content>`` of the cgroup probe -> (memory limit GB, CPU quota cores);
    where several levels set one, the smallest holds."""
    mem: list[int] = []
    cpu: list[float] = []
    v1: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        path, _, value = line.strip().partition(" ")
        name, value = path.rsplit("/", 1)[-1], value.strip()
        if name in ("memory.max", "memory.limit_in_bytes") and value.isdigit():
            if int(value) < NO_LIMIT:
                mem.append(int(value))
        elif name == "cpu.max":
            quota, _, period = value.partition(" ")
            if quota.isdigit() and period.isdigit() and int(period):
                cpu.append(int(quota) / int(period))
        elif name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"):
            v1.setdefault(path.rsplit("/", 1)[0], {})[name] = value
    for pair in v1.values():
        quota, period = pair.get("cpu.cfs_quota_us", ""), pair.get("cpu.cfs_period_us", "")
        if quota.isdigit() and period.isdigit() and int(period):  # "-1" is not a digit: none
            cpu.append(int(quota) / int(period))
    return (round(min(mem) / 1024**3, 2) if mem else None,
            round(min(cpu), 2) if cpu else None)


def parse_shm(text: str) -> float | None:
    """``df -Pk /dev/shm`` -> its size in MB (1024-byte blocks, as df -k counts)."""
    for line in text.splitlines()[1:]:
        row = line.split()
        if len(row) >= 6 and row[1].isdigit():
            return round(int(row[1]) / 1024, 1)
    return None


def parse_nofile(text: str) -> tuple[int | None, int | None]:
    """``ulimit -Sn; ulimit -Hn`` -> (soft, hard); "unlimited" is None."""
    vals = [int(w) if w.isdigit() else None for w in text.split()[:2]]
    return (vals + [None, None])[0], (vals + [None, None])[1]


def parse_inodes(text: str) -> tuple[tuple[str, int, int], ...]:
    """Lines ``<path>\\t<df -Pi row>`` -> (path, free, total); a file system without inodes
    (btrfs, some overlays report 0) is left out."""
    out = []
    for line in text.splitlines():
        path, _, row_text = line.rpartition("\t")
        row = row_text.split()
        if len(row) >= 6 and row[1].isdigit() and row[3].isdigit() and int(row[1]) > 0:
            out.append((path, int(row[3]), int(row[1])))
    return tuple(out)


def parse_quota(text: str) -> tuple[tuple[str, int, int], ...]:
    """``quota -w`` (quota-tools; -w: a long file system name stays on its row) -> (file system,
    KiB used, KiB allowed) for each file system where a block limit is set: the smaller of the
    soft ("quota") and hard ("limit") limits that is not 0 (0: none). Its rows are
    ``FILESYSTEM BLOCKS[*] QUOTA LIMIT [GRACE] FILES ...`` in 1 KiB blocks ("*": over the soft
    limit); quota prints nothing where no quota is set, and is often not installed at all."""
    out = []
    for line in text.splitlines():
        row = line.split()
        if len(row) < 4 or not line[:1].isspace():
            continue
        used, soft, hard = row[1].rstrip("*"), row[2], row[3]
        if not (used.isdigit() and soft.isdigit() and hard.isdigit()):
            continue
        limits = [int(x) for x in (soft, hard) if int(x) > 0]
        if limits:
            out.append((row[0], int(used), min(limits)))
    return tuple(out)


def parse_limits(cgroup: str, shm: str, nofile: str, inodes: str, quota: str = "") -> Limits:
    mem, cpu = parse_cgroup(cgroup)
    soft, hard = parse_nofile(nofile)
    return Limits(memory_limit_gb=mem, cpu_quota=cpu, shm_mb=parse_shm(shm), open_files=soft,
                  open_files_hard=hard, inodes=parse_inodes(inodes), quotas=parse_quota(quota))


@dataclass(frozen=True)
class Finding:
    """One judged limit: ``severity`` "warn" (a job will fail or crawl) or "info" (what a job
    really gets), the finding in one line, and the fix for this kind of host."""

    severity: str
    text: str
    fix: str = ""

    @property
    def line(self) -> str:
        return f"{self.text}; fix: {self.fix}" if self.fix else self.text


SHM_MIN_MB = 1024  # Docker's default is 64 MB (docs.docker.com, `docker run --shm-size`)
OPEN_FILES_MIN = 4096
INODES_MIN = 200_000
QUOTA_LOW_GB = 5.0  # what is left under a disk quota below this: a pip install or checkpoint fails


def judge(lim: Limits, *, memory_gb: float, cpu_cores: int, container: bool,
          fixes: Mapping[str, str] | None = None,
          devices: Mapping[str, str] | None = None) -> list[Finding]:
    """The limits a job will meet, each with its fix (validate and doctor show the same).
    ``fixes``: a known platform's own words for raising one ("shm", "nofile": its
    ``limits_fix``), which replace the generic container or VM fix; ``devices``: each data
    path's file system (df's first column), to name the paths a quota holds."""
    fixes = fixes or {}
    out: list[Finding] = []
    if lim.memory_limit_gb is not None and memory_gb and lim.memory_limit_gb < 0.95 * memory_gb:
        out.append(Finding("info", f"a job can use {lim.memory_limit_gb} GB of memory (the "
                                   f"cgroup's limit), not the {memory_gb} GB /proc/meminfo shows"))
    if lim.cpu_quota is not None and cpu_cores and lim.cpu_quota < cpu_cores:
        out.append(Finding("info", f"a job gets {lim.cpu_quota:g} CPU cores (the cgroup's quota), "
                                   f"not the {cpu_cores} nproc shows: DataLoader workers beyond "
                                   f"{max(1, int(lim.cpu_quota))} only queue"))
    if lim.shm_mb is not None and lim.shm_mb < SHM_MIN_MB:
        # PyTorch's README (Docker image): the data loaders share memory through /dev/shm, and a
        # container's default segment is not enough: --ipc=host or --shm-size. NCCL falls back
        # from its shared-memory transport with NCCL_SHM_DISABLE=1 (NCCL's environment docs).
        fix = ("start the container with --shm-size=16g (or --ipc=host); where the provider "
               "starts it, pick an instance or template with a larger /dev/shm. Until then "
               "DataLoader(num_workers=0) and NCCL_SHM_DISABLE=1 avoid it") if container else \
              ("as root: mount -o remount,size=16G /dev/shm (and size=16G on its /etc/fstab "
               "line to keep it after a reboot)")
        if fixes.get("shm"):
            fix = (f"{fixes['shm']}. Until then DataLoader(num_workers=0) and "
                   "NCCL_SHM_DISABLE=1 avoid it")
        out.append(Finding("warn", f"/dev/shm is {lim.shm_mb:g} MB: DataLoader workers die with "
                                   "\"Bus error\" and NCCL's shared-memory transport fails", fix))
    if lim.open_files is not None and lim.open_files < OPEN_FILES_MIN:
        hard = lim.open_files_hard
        if hard is None or hard >= OPEN_FILES_MIN:  # None: the hard limit is "unlimited"
            fix = f"`ulimit -n {hard or 65536}` in the job's shell (the hard limit allows it)"
        elif fixes.get("nofile"):
            fix = fixes["nofile"]
        elif container:
            fix = "start the container with --ulimit nofile=65536:65536"
        else:
            fix = ("as root: a nofile line in /etc/security/limits.conf (e.g. `* - nofile "
                   "65536`), then log in again")
        out.append(Finding("warn", f"the open-files limit is {lim.open_files}: DataLoader "
                                   "workers and many-file datasets run out (\"Too many open "
                                   "files\")", fix))
    for fs, used, allowed in lim.quotas:
        left = max(0, allowed - used) / 1024**2
        if left < QUOTA_LOW_GB or used >= 0.95 * allowed:
            on = [p for p, dev in (devices or {}).items() if dev == fs]
            where = f" ({', '.join(on)})" if on else ""
            out.append(Finding("warn", f"your disk quota on {fs}{where} allows "
                                       f"{allowed / 1024**2:.1f} GB and {used / 1024**2:.1f} GB "
                                       f"are used: {left:.1f} GB left, whatever df shows free",
                               "remove what is not needed (`conda clean -a`, `pip cache purge`, "
                               "old checkpoints), ask the admin for a larger quota, or set "
                               "data_dir to a file system without one (`quota -s` shows it)"))
    for path, free, total in lim.inodes:
        if free < INODES_MIN or free < 0.05 * total:
            out.append(Finding("warn", f"the file system of {path} has {free} inodes free of "
                                       f"{total}: a conda env or a pip install is tens of "
                                       "thousands of small files",
                               "remove what is not needed (`conda clean -a`, `pip cache purge`, "
                               "old envs), or set data_dir to a file system with free inodes"))
    return out
