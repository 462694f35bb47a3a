"""What a job is before it starts: its id, name, command (argv, never re-split), GPUs, working
folder and the environment the laptop adds (fixes from validation, the rendezvous)."""

from __future__ import annotations

import json
import posixpath
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import validators as v
from ..errors import UsageError

JOB_REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
LAUNCHERS = ("auto", "tmux", "setsid")


@dataclass(frozen=True)
class JobSpec:
    """One job on one host (a multi-host job is one JobSpec per host, same id, its own rank)."""

    id: str
    name: str
    argv: tuple[str, ...]
    gpus: tuple[int, ...] | None = None  # None: every GPU the host has
    workdir: str = "~"
    share: bool = False  # run even when another job uses these GPUs
    env: Mapping[str, str] = field(default_factory=dict)  # added to the job's environment
    data_dirs: tuple[str, ...] = ()  # the log goes to the first that exists on the host
    launcher: str = "auto"  # tmux when the host has it, else setsid + nohup
    rank: int = 0  # node rank of a multi-host job
    nnodes: int = 1
    hosts: tuple[str, ...] = ()  # every host of a multi-host job, rank order
    files: tuple[str, ...] = ()  # script files the command names: must exist in the workdir
    sent: str = ""  # the local folder sent as the job's code ("" when none was)
    notify_script: str = ""  # ~/.gpu-provision/notify.sh for the inventory's notify: ("" none)

    def __post_init__(self) -> None:
        if not self.argv:
            raise UsageError("a job needs a command: gpu-provision -H HOST run -- CMD ...")
        if any("\x00" in a for a in self.argv):
            raise UsageError("a command argument cannot contain a NUL byte")
        for key in self.env:
            if v.env_var(key):
                raise UsageError(f"{key!r} is not an environment variable name")
        if self.launcher not in LAUNCHERS:
            raise UsageError(f"--launcher: {self.launcher!r} must be one of: "
                                 f"{', '.join(LAUNCHERS)}")

    def as_json(self) -> dict[str, Any]:
        """What the host keeps as the job's spec.json (what `jobs` shows of it)."""
        return {"id": self.id, "name": self.name, "argv": list(self.argv),
                "gpus": list(self.gpus) if self.gpus is not None else None,
                "workdir": self.workdir, "share": self.share, "env": sorted(self.env),
                "rank": self.rank, "nnodes": self.nnodes, "hosts": list(self.hosts)}

    def spec_json(self) -> str:
        return json.dumps(self.as_json(), sort_keys=True)


def parse_gpus(text: str | None) -> tuple[int, ...] | None:
    """``--gpus 0,1`` -> (0, 1); none or ``all`` -> None (every GPU the host has)."""
    if text is None or text.strip() in ("", "all"):
        return None
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise UsageError(f"--gpus: {text!r} is not a list of GPU indexes, e.g. 0,1 (or all)")
    gpus = tuple(int(p) for p in parts)
    if len(set(gpus)) != len(gpus):
        raise UsageError(f"--gpus: {text!r} names a GPU twice")
    return gpus


def default_name(argv: Sequence[str]) -> str:
    """The script's name (``train`` for ``python train.py``), else the program's; ``job`` when
    neither makes a valid name."""
    script = next((a for a in argv if a.endswith((".py", ".sh")) and not a.startswith("-")), None)
    base = posixpath.basename(script or argv[0]) if argv else ""
    base = re.sub(r"\.(py|sh)$", "", base)
    base = re.sub(r"[^A-Za-z0-9._-]", "-", base).strip("-._")[:40]
    return base if base and not v.name(base) else "job"


def new_id(name: str, at: float | None = None) -> str:
    """``<name>-<MMDD-HHMMSS>``: readable, sorted by start, the same on every host of a job."""
    return f"{name}-{time.strftime('%m%d-%H%M%S', time.localtime(at))}"


def check_name(name: str) -> str:
    problem = v.name(name)
    if problem:
        raise UsageError(f"--name: {problem}")
    return name


def check_ref(job: str) -> str:
    """A JOB argument: an id, a name (its newest job) or the start of an id."""
    if not JOB_REF_RE.match(job):
        raise UsageError(f"JOB: {job!r} is not a job id or name (letters, digits, '.', '_', "
                             "'-'); `gpu-provision -H HOST jobs` lists them")
    return job


def command_after_dashes(argv: Sequence[str] | None = None) -> tuple[str, ...]:
    """The words after the first ``--``, exactly as the shell split them (Invoke would join
    them with spaces, and Fabric run them through a shell)."""
    argv = list(sys.argv if argv is None else argv)
    return tuple(argv[argv.index("--") + 1:]) if "--" in argv else ()


def command_of(argv: Sequence[str] | None, recipe_job: Sequence[str], recipe: str) -> tuple[str, ...]:
    """The command after ``--``, else the recipe's ``job:``."""
    if argv:
        return tuple(argv)
    if recipe_job:
        return tuple(recipe_job)
    raise UsageError(f"no command: give one after -- (gpu-provision -H HOST run -- python "
                         f"train.py), or set job: [python, train.py] in recipe {recipe!r}")


def validation_env(report: Mapping[str, Any] | None) -> tuple[dict[str, str], list[str]]:
    """The environment fixes the host's last validation named (``NCCL_P2P_DISABLE=1`` on GPUs
    without working peer-to-peer), and why, for ``run`` to apply."""
    env: dict[str, str] = {}
    why: list[str] = []
    for check in (report or {}).get("checks") or []:
        fix = check.get("env") or {}
        if isinstance(fix, Mapping) and fix:
            env.update({str(k): str(x) for k, x in fix.items()})
            why.append(f"{' '.join(f'{k}={x}' for k, x in fix.items())} ({check.get('name')}: "
                       f"{check.get('reason')})")
    return env, why
