"""A sandbox host that IS limited the way a container is, by the kernel and not by a file we
wrote: a profile's ``limits: {memory: 2G, cpus: 1.5, shm: 64m, nofile: 1024}`` gives the host

- a real cgroup of its own, made here with that memory limit and CPU quota; the host's
  supervisor joins it before ``unshare --cgroup``, so every process of the host (sshd, each
  session, each job) is held by it, and the host sees it as its root at /sys/fs/cgroup (its
  cgroup namespace, the cgroup dir bound there), as Docker shows a container its own cgroup;
  v1 (a hierarchy per controller: ``memory.limit_in_bytes``, ``cpu.cfs_quota_us``) or v2
  (``memory.max``, ``cpu.max``), whichever holds the memory controller on this machine;
- a real tmpfs of that size on /dev/shm (Docker's default is 64 MB: docs.docker.com,
  ``docker run --shm-size``);
- that open-files limit, soft and hard, on sshd and so on every login (``docker run --ulimit
  nofile=1024:1024``; sshd without PAM passes its own limits on).

The kernel's formats: Documentation/admin-guide/cgroup-v1/memory.rst, scheduler/sched-bwc.rst,
cgroup-v2.rst.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

PERIOD_US = 100_000  # the CFS period the kernel defaults to (sched-bwc.rst)


def size_bytes(text: str) -> int:
    """"2G", "512M", "64m" -> bytes (1024-based, as Docker's --memory and --shm-size)."""
    m = re.fullmatch(r"(\d+)([kKmMgG]?)", str(text).strip())
    if not m:
        raise ValueError(f"limits: size {text!r}: a number with K, M or G")
    return int(m.group(1)) * 1024 ** " kmg".index(m.group(2).lower() or " ")


def _hierarchies() -> dict[str, str]:
    """Controller -> where its hierarchy is mounted here ("" names the v2 hierarchy)."""
    out: dict[str, str] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype, _, opts = (right.split() + ["", "", ""])[:3]
        point = left.split()[4]
        if fstype == "cgroup":
            for ctl in opts.split(","):
                if ctl in ("memory", "cpu"):
                    out.setdefault(ctl, point)
        elif fstype == "cgroup2":
            out.setdefault("", point)
    return out


def make(hid: str, limits: dict[str, Any]) -> list[list[str]]:
    """Create the host's cgroup(s) with ``limits``; [[its dir here, where the host sees it]]."""
    if not (limits.get("memory") or limits.get("cpus")):
        return []
    name = f"gpu-sandbox-{hid}-{uuid.uuid4().hex[:8]}"
    memory = size_bytes(limits["memory"]) if limits.get("memory") else None
    quota = int(float(limits["cpus"]) * PERIOD_US) if limits.get("cpus") else None
    mounts = _hierarchies()
    if "memory" in mounts:  # v1: one dir per controller, each bound where the host looks
        out = []
        for ctl, files in (("memory", {"memory.limit_in_bytes": memory}),
                           ("cpu", {"cpu.cfs_period_us": PERIOD_US, "cpu.cfs_quota_us": quota})):
            if files[f"{ctl}.{'limit_in_bytes' if ctl == 'memory' else 'cfs_quota_us'}"] is None:
                continue  # this limit is not asked for
            if ctl not in mounts:
                raise RuntimeError(f"limits: no cgroup v1 hierarchy holds the {ctl} controller")
            d = Path(mounts[ctl]) / name
            d.mkdir()
            for f, value in files.items():
                (d / f).write_text(f"{value}\n")
            out.append([str(d), mounts[ctl]])
        return out
    root = Path(mounts.get("", "/sys/fs/cgroup"))
    enabled = (root / "cgroup.subtree_control").read_text().split()
    wanted = [c for c in ("memory", "cpu") if c not in enabled]
    if wanted:
        (root / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
    d = root / name
    d.mkdir()
    if memory is not None:
        (d / "memory.max").write_text(f"{memory}\n")
    if quota is not None:
        (d / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
    return [[str(d), "/sys/fs/cgroup"]]


def join(dirs: list[str]) -> None:
    """Move the calling process into each cgroup (a preexec hook: before unshare --cgroup)."""
    for d in dirs:
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))


def remove(dirs: list[str]) -> None:
    """Remove the host's cgroups once its processes are gone (a dying one may linger a moment)."""
    for d in dirs:
        deadline = time.monotonic() + 5
        while Path(d).exists():
            try:
                Path(d).rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
