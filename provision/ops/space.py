"""Will the plan fit on the host's disks: what each step fetches and unpacks, where it lands,
and the free bytes, inodes and disk quota of the file system there (facts/space.py, the
``disk`` probe where a capture has no mounts). Pure.

Where an env of ours, its Miniconda, conda's packages, the pip and uv caches and the download's
temporary files go is one folder, ``env_dir`` (the inventory's, else the home's defaults:
``~/miniconda3``, ``~/.cache``, ``/tmp``). When the home's file system cannot hold the plan,
``elsewhere`` names a folder that can: the platform's data dir (AutoDL's /root/autodl-tmp,
RunPod's and vast.ai's /workspace), the inventory's ``data_dir``, else any writable mount with
room; the plan then puts the env there and says the inventory line that keeps it there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Any

import yaml

from ..config.inventory import Settings
from ..facts.host import HostFacts
from ..facts.space import Mount, mount_of
from ..units import size
from ..wheels.rule import TorchChoice
from .layout import Layout, expand_home
from .step import Step

MARGIN = 1.1  # what a file system must have free: the need and a tenth more
NO_ROOM = 28  # a step's exit code when its disk cannot hold what it would fetch (ENOSPC's number)
SIZES = "provision/tables/sizes.yaml"
CACHE = ".cache/gpu-provision"  # under env_dir: pip's and uv's caches, the downloads' tmp
# never a place for an env: wiped at boot or in memory, or the system's own
NOT_FOR_ENVS = ("/", "/tmp", "/var/tmp", "/dev/shm", "/var", "/home")


@cache
def sizes() -> dict[str, Any]:
    """provision/tables/sizes.yaml, read once."""
    data: dict[str, Any] = yaml.safe_load(
        resources.files("provision.tables").joinpath("sizes.yaml").read_text())
    return data


def _mb(n: float) -> int:
    return int(n * 1_000_000)


@dataclass(frozen=True)
class Need:
    what: str  # "Miniconda", "the env", "torch 2.13.0+cpu", "3 packages"
    path: str  # the folder it lands in
    bytes: int
    files: int = 0
    download: int = 0  # bytes of it fetched over the network (counted once, where it lands)
    source: str = ""


@dataclass(frozen=True)
class Share:
    """One file system's part of the plan."""

    mount: Mount
    needs: tuple[Need, ...]
    quota_left: int | None = None  # bytes the login's quota leaves there (None: no quota)

    @property
    def need(self) -> int:
        return sum(n.bytes for n in self.needs)

    @property
    def files(self) -> int:
        return sum(n.files for n in self.needs)

    @property
    def free(self) -> int:
        free = self.mount.free_bytes
        return free if self.quota_left is None else min(free, self.quota_left)

    @property
    def ok(self) -> bool:
        inodes = self.mount.free_inodes is None or self.mount.free_inodes >= self.files * MARGIN
        return self.free >= self.need * MARGIN and inodes

    def text(self) -> str:
        """``/root (2.0 GiB free) needs 6.7 GiB: Miniconda 0.6 GiB, ...``"""
        quota = " under your quota" if self.quota_left is not None and \
            self.quota_left < self.mount.free_bytes else ""
        inodes = ""
        if self.mount.free_inodes is not None and self.mount.free_inodes < self.files * MARGIN:
            inodes = f"; {self.files} files, {self.mount.free_inodes} inodes free"
        parts = ", ".join(f"{n.what} {size(n.bytes)}" for n in self.needs)
        return (f"{self.mount.path} ({size(self.free)} free{quota}) needs {size(self.need)}: "
                f"{parts}{inodes}")


@dataclass(frozen=True)
class Fit:
    needs: tuple[Need, ...]
    shares: tuple[Share, ...]
    known: bool = True  # the facts say how much is free (False: nothing to judge by)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.shares)

    @property
    def download(self) -> int:
        return sum(n.download for n in self.needs)

    def summary(self) -> str:
        """One line: what is fetched, what it takes where, and whether it fits."""
        if not self.needs:
            return "nothing to download"
        where = "; ".join(s.text() for s in self.shares) if self.known else \
            "the free space on the host is not known"
        return (f"downloads about {size(self.download)}; {where} (the usual size of each, "
                f"{SIZES}, which names where each figure comes from; the torch step reads the "
                "wheel's own size from the index before it downloads)")

    def short(self) -> str:
        return "; ".join(s.text() for s in self.shares if not s.ok)

    def as_json(self) -> dict[str, Any]:
        return {"download_bytes": self.download, "fits": self.ok, "known": self.known,
                "needs": [{"what": n.what, "path": n.path, "bytes": n.bytes, "files": n.files,
                           "download_bytes": n.download, "source": n.source}
                          for n in self.needs],
                "disks": [{"mount": s.mount.path, "free_bytes": s.free, "need_bytes": s.need,
                           "free_inodes": s.mount.free_inodes, "files": s.files, "fits": s.ok}
                          for s in self.shares]}


def env_dir(facts: HostFacts, settings: Settings) -> str | None:
    """The folder an env of ours and its caches go in, where one is set or chosen."""
    return expand_home(settings.env_dir, facts.home).rstrip("/") if settings.env_dir else None


def cache_dir(facts: HostFacts, settings: Settings) -> str:
    """Where the steps keep pip's and uv's caches and their downloads' temporary files: under
    env_dir, else "" (the home's ~/.cache and /tmp, the installers' own defaults)."""
    d = env_dir(facts, settings)
    return f"{d}/{CACHE}" if d else ""


def mounts(facts: HostFacts) -> tuple[Mount, ...]:
    """The file systems the facts know: the mounts probe, else (a capture without it) df of the
    home and the data dirs."""
    if facts.mounts:
        return facts.mounts
    seen: dict[str, Mount] = {}
    for d in facts.disks:
        seen.setdefault(d.mount, Mount(path=d.mount, fstype="", device=d.device,
                                       free_bytes=int(d.free_gb * 2**30),
                                       total_bytes=int(d.total_gb * 2**30)))
    return tuple(seen.values())


def needs(facts: HostFacts, settings: Settings, lay: Layout, steps: Sequence[Step],
          torch: TorchChoice | None) -> tuple[Need, ...]:
    """What the steps with work fetch and unpack, and where each lands."""
    t = sizes()
    changing = {s.name for s in steps if s.changes}
    cache = cache_dir(facts, settings)
    downloads = cache or f"{facts.home.rstrip('/')}/.cache"  # pip's and uv's caches
    tmp = f"{cache}/tmp" if cache else "/tmp"
    out = []
    if "conda" in changing:
        m = t["miniconda"]
        out.append(Need("Miniconda", lay.conda_root, _mb(m["installed_mb"]), m["files"],
                        source=_source(m)))
        out.append(Need("its installer", tmp, _mb(m["download_mb"]),
                        download=_mb(m["download_mb"])))
    if "env" in changing and lay.conda:
        e = t["env"]
        out.append(Need("the env", lay.env_prefix, _mb(e["installed_mb"]), e["files"],
                        download=_mb(e["download_mb"]), source=_source(e)))
    if "torch" in changing and torch is not None:
        kind = "cpu" if torch.cuda == "cpu" else "cuda"
        w = t["torch"][kind]
        out.append(Need(f"torch {torch.label.removeprefix('torch ')}", lay.env_prefix,
                        _mb(w["installed_mb"]), w["files"], source=_source(w)))
        out.append(Need("its download", downloads, _mb(w["download_mb"]),
                        download=_mb(w["download_mb"])))
    if "packages" in changing and settings.packages:
        p, n = t["packages"], len(settings.packages)
        out.append(Need(f"{n} package(s)", lay.env_prefix, n * _mb(p["installed_mb"]),
                        n * p["files"], download=n * _mb(p["download_mb"]), source=_source(p)))
    return tuple(out)


def figures(*path: str) -> tuple[int, int, int]:
    """(installed bytes, download bytes, files) of ``sizes.yaml``'s entry at ``path``
    (``"torch", "cuda"``)."""
    entry: Any = sizes()
    for key in path:
        entry = entry[key]
    return _mb(entry["installed_mb"]), _mb(entry["download_mb"]), int(entry["files"])


def step_space(facts: HostFacts, settings: Settings, what: str, need: int, download: int = 0,
               ratio: float = 1.0) -> dict[str, Any]:
    """What a step's body gets to check its disk with on the host (templates/setup/_space.sh.j2):
    the cache folder, the bytes it will need, what it is; ``download`` and ``ratio`` (installed
    per downloaded byte) let the torch step count the wheel's own size from the index."""
    return {"cache": cache_dir(facts, settings), "bytes": need, "download": download,
            "ratio": round(ratio, 2), "what": what, "code": NO_ROOM}


def torch_kind(torch: TorchChoice) -> str:
    return "cpu" if torch.cuda == "cpu" else "cuda"


def _source(entry: dict[str, Any]) -> str:
    return " ".join(str(entry.get("source", "")).split())


def judge(facts: HostFacts, settings: Settings, lay: Layout, steps: Sequence[Step],
          torch: TorchChoice | None) -> Fit:
    """Each file system's part of what the steps fetch and unpack, against what it has free."""
    wanted = needs(facts, settings, lay, steps, torch)
    known = mounts(facts)
    if not known:
        return Fit(wanted, (), known=False)
    groups: dict[str, tuple[Mount, list[Need]]] = {}
    for n in wanted:
        m = mount_of(n.path, known)
        if m is None:
            continue
        groups.setdefault(m.path, (m, []))[1].append(n)
    quotas = {fs: max(0, allowed - used) * 1024 for fs, used, allowed in facts.limits.quotas}
    return Fit(wanted, tuple(Share(m, tuple(ns), quotas.get(m.device))
                             for m, ns in groups.values()))


def elsewhere(facts: HostFacts, settings: Settings, fit: Fit) -> list[str]:
    """Folders on other file systems than the ones short of room, best first, that an env of
    ours could go in: the data dir (the platform's or the inventory's), then the other data
    dirs the facts found, then any writable mount, the roomiest first. The caller checks each
    by planning with it."""
    known = mounts(facts)
    short = {s.mount.path for s in fit.shares if not s.ok}
    out: list[str] = []

    def add(path: str) -> None:
        m = mount_of(path, known)
        if m is None or m.path in short or not m.writable or path in out:
            return
        if path.rstrip("/") == facts.home.rstrip("/"):  # where the env goes anyway
            return
        if path in NOT_FOR_ENVS or m.path in ("/tmp", "/var/tmp", "/dev/shm"):
            return
        out.append(path)

    if settings.data_dir:
        add(expand_home(settings.data_dir, facts.home).rstrip("/"))
    for d in facts.disks:
        if d.path != facts.home:
            add(d.path)
    for m in sorted(known, key=lambda m: -m.free_bytes):
        add(m.path)
    return out


def settled(facts: HostFacts, settings: Settings) -> Settings:
    """Where no env_dir is set and our Miniconda already lies on a data disk (a bootstrap put it
    there: DIR/miniconda3), that folder is the env_dir: a re-run finds the env where it is."""
    if settings.env_dir:
        return settings
    home = facts.home.rstrip("/")
    places = {d.path.rstrip("/") for d in facts.disks} | {m.path.rstrip("/") for m in facts.mounts}
    for conda in facts.conda:
        root = conda.removesuffix("/bin/conda")
        d = root.removesuffix("/miniconda3")
        if root.endswith("/miniconda3") and d in places and d != home and d:
            return replace(settings, env_dir=d)
    return settings


def refusal(fit: Fit, settings: Settings) -> str:
    """Why the plan cannot go ahead here, with the figures and what to do."""
    where = f" in env_dir {settings.env_dir}" if settings.env_dir else ""
    other = "" if settings.env_dir else \
        "; no data disk or other writable mount has room for it either"
    return (f"not enough disk for this plan{where}: {fit.short()}{other}. Free space there "
            "(`conda clean -a`, `pip cache purge`, old envs and checkpoints), rent a larger "
            "disk, or set env_dir: DIR in the inventory to a folder on a disk with room")


def moved_text(before: Fit, after: Fit, settings: Settings) -> str:
    """The disk decision where the home cannot hold the plan and ``env_dir`` can."""
    there = next((s for s in after.shares if s.mount.path == (mount_of(
        settings.env_dir or "", tuple(x.mount for x in after.shares)) or s.mount).path), None)
    room = f" ({size(there.free)} free)" if there is not None else ""
    return (f"{before.short()}: the env, its Miniconda, conda's packages and the pip and uv "
            f"caches go in {settings.env_dir}{room} instead; `env_dir: {settings.env_dir}` in "
            "the inventory keeps them there, or names another folder")
