"""``sync up`` / ``sync down``: data to the host and checkpoints back, over our pinned connection.

One remote execution lists the host's side (and what decides the data dir); the quick check
(size, whole-second mtime) decides what moves (``sync_plan``); then one of two transports:

- rsync over our SSH settings (``provision/rsync.py``), when both ends have it and the login
  needs no password: a cut file waits in rsync's partial dir and the next run sends only what
  is missing of it (rsync's delta against the partial file); rsync checks every file it sends
  with a whole-file checksum (rsync(1): "rsync always verifies that each transferred file was
  correctly reconstructed on the receiving side by checking a whole-file checksum").
- SFTP through ``Executor.put_part/get_part`` (always there, and the laptop needs no ssh or
  rsync): each file lands as ``.NAME.part`` beside its target, resumed from the bytes already
  there; at the end ONE remote execution checks every part's sha256 against this side's and
  renames it into place, so a reader never sees half a file.

``watch`` follows a detached watcher on the host (the step runtime, its own lock) that names
each file matching a pattern once its size and mtime have held still for ``settle`` seconds and
no process has it open for writing; each is pulled once.
"""

from __future__ import annotations

import base64
import os
import posixpath
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..config.inventory import Target, settings_for
from ..config.recipes import Platform, all_platforms, load_platform
from ..errors import ProvisionError, RemoteError, SSHError
from ..facts.gather import markers_of
from ..facts.platform import detect_platform
from ..ops.layout import expand_home
from ..ops.step import inputs_hash
from ..remote.command import bash_script
from ..remote.contract import shown
from ..remote.executor import Executor, file_sha256, local_part, remote_part
from ..remote.runtime import run_detached
from ..remote.templating import render
from . import rsync
from .plan import (
    Changes,
    Entry,
    Excludes,
    Listing,
    Side,
    changes,
    filtered,
    human,
    landing,
    parse_listing,
    remote_abspath,
    walk_local,
)

Progress = Callable[[int, int], None]  # (bytes done, bytes in all) of the whole transfer
TRANSPORTS = ("auto", "rsync", "sftp")
LINK_MIN_BYTES = 1 << 20  # smaller transfers say more about round trips than about the link


@dataclass(frozen=True)
class Options:
    excludes: tuple[str, ...] = ()
    delete: bool = False
    dry_run: bool = False
    transport: str = "auto"  # auto | rsync | sftp


@dataclass(frozen=True)
class Report:
    """What one sync did (or, in a dry run, would do)."""

    host: str
    direction: str  # up | down
    source: str
    dest: str
    transport: str  # rsync | sftp
    transport_why: str  # why this transport
    files: int  # files sent
    same: int  # files already the same on both sides
    deleted: int
    bytes: int  # size of the files sent
    sent_bytes: int  # bytes that crossed the link as data this run
    resumed_bytes: int  # bytes of cut files that were already there and were not sent again
    seconds: float  # the transfer alone (not the listing)
    verified: str  # how each file was checked
    dry_run: bool = False
    planned: tuple[str, ...] = ()  # the files to send (dry run)
    deletions: tuple[str, ...] = ()

    @property
    def mbs(self) -> float | None:
        return round(self.sent_bytes / self.seconds / 1e6, 2) if self.seconds > 0 and \
            self.sent_bytes else None

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "planned": list(self.planned), "deletions": list(self.deletions),
                "mbs": self.mbs}

    def link(self) -> dict[str, Any] | None:
        """The link measurement this transfer makes (None when it moved too little to say)."""
        if self.dry_run or self.sent_bytes < LINK_MIN_BYTES or self.seconds <= 0:
            return None
        return {"host": self.host, "direction": self.direction, "transport": self.transport,
                "bytes": self.sent_bytes, "seconds": round(self.seconds, 3), "mbs": self.mbs,
                "source": "sync", "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


# --- where things are on the host -------------------------------------------------------------

def base_candidates(target: Target, platforms: Sequence[Platform]) -> list[str]:
    """The folders a relative host path may be relative to, before the platform is known: the
    inventory's data dir; else its platform's; else every platform's and the home."""
    own = target.settings.get("data_dir")
    if own:
        return [str(own)]
    named = target.settings.get("platform")
    if named:
        return [load_platform(str(named)).data_dir or "~"]
    return sorted({p.data_dir for p in platforms if p.data_dir}) + ["~"]


def host_paths(path: str | None, bases: Sequence[str], name: str) -> dict[str, str]:
    """base -> the host path ``path`` means under that base (``None``: ``base/name``)."""
    if path is not None and (path.startswith("/") or path == "~" or path.startswith("~/")):
        return {b: path for b in bases}
    rel = path if path is not None else name
    return {b: (b.rstrip("/") + "/" + rel) for b in bases}


def listing_script(paths: Sequence[str], platforms: Sequence[Platform] | None = None) -> str:
    markers = sorted({f for p in platforms or all_platforms() for f in p.detect.files})
    return render("sync/sync_list.sh.j2", paths=list(paths), markers=markers)


def list_host(ex: Executor, paths: Sequence[str],
              platforms: Sequence[Platform] | None = None) -> Listing:
    def parse(out: str) -> Listing:
        if "\0T " not in "\0" + out:
            raise ValueError("no listing")
        return parse_listing(out)
    return ex.query("sync-list", listing_script(paths, platforms), parse,
                    what="the listing of the host's side",
                    fix="the host needs bash, find and df (coreutils, findutils)")


@dataclass(frozen=True)
class HostView:
    """The host's side of one transfer, resolved: the path, its listing, the platform."""

    listing: Listing
    side: Side
    platform: str
    base: str  # the folder relative paths are under (the data dir, else the home)


def resolve(ex: Executor, target: Target, path: str | None, name: str) -> HostView:
    """List the host's side of ``path`` (one remote execution; a relative path is listed under
    every folder it may be relative to) and pick the base: the data dir of the platform
    detected from the same listing, else the home."""
    platforms = all_platforms()  # YAML, read once: it is most of the local work of a sync
    bases = base_candidates(target, platforms)
    wanted = host_paths(path, bases, name)
    order = list(dict.fromkeys(wanted.values()))
    listing = list_host(ex, order, platforms)
    home = listing.home
    detected, _ = detect_platform(markers_of(platforms), listing.markers,
                                  listing.env_names, listing.hostname)
    settings = settings_for(target, detected)
    base = expand_home(settings.data_dir, home) if settings.data_dir else home
    chosen = next((b for b in bases if expand_home(b, home) == base), bases[-1])
    side = listing.sides[order.index(wanted[chosen])]
    full = remote_abspath(wanted[chosen], home, base)
    return HostView(listing, replace(side, path=full), settings.platform, base)


def choose_transport(wanted: str, target: Target, listing: Listing) -> tuple[str, str]:
    """("rsync" | "sftp", why)."""
    if wanted not in TRANSPORTS:
        raise ProvisionError(f"--transport {wanted!r}: use one of {', '.join(TRANSPORTS)}")
    if wanted == "sftp":
        return "sftp", "asked for (--transport sftp)"
    problem = rsync.why_not(target, rsync.local_rsync(), listing.rsync)
    if problem is None:
        return "rsync", "both ends have rsync"
    if wanted == "rsync":
        raise ProvisionError(f"{target.name}: --transport rsync: {problem}; leave --transport "
                             "out to use SFTP")
    return "sftp", problem


@contextmanager
def early_link(target: Target, transport: str) -> Iterator[rsync.Link | None]:
    """The SSH connection rsync will use, opened now, in the background, while our own
    connection lists the host (None where rsync cannot be used from here, or the host key is
    not pinned yet: then rsync connects by itself)."""
    prog = rsync.local_rsync() if transport != "sftp" and not rsync.prompted_login(target) else None
    if prog is None or not rsync.pinned_lines(target):
        yield None
        return
    with rsync.link(target, prog[1]) as link:
        yield link


@contextmanager
def _ssh(target: Target, ssh: str, link: rsync.Link | None) -> Iterator[list[str]]:
    if link is not None:
        link.ready()
        yield link.argv
    else:
        with rsync.ssh_options(target, ssh) as argv:
            yield argv


def _check_space(needed: int, free: int, where: str, host: str) -> None:
    if free and needed > free:
        raise ProvisionError(f"{host}: {where} has {human(free)} free; this transfer needs "
                             f"{human(needed)}. Free some space, or --exclude what is not needed")


# --- sync up / down ---------------------------------------------------------------------------

def sync_up(ex: Executor, target: Target, src: Path, dest: str | None, opts: Options,
            progress: Progress | None = None, link: rsync.Link | None = None) -> Report:
    """Send ``src`` (a file or folder here) to ``dest`` on the host (default: the data dir's
    ``<name of src>``; a trailing "/" means into that folder)."""
    excludes = Excludes(opts.excludes)
    src = src.expanduser().absolute()
    local = walk_local(src, excludes)
    if local.kind == "-":
        raise ProvisionError(f"{src}: no such file or folder here")
    name = src.name
    host = resolve(ex, target, landing(dest, name) if dest is not None else None, name)
    there = host.side
    if local.kind == "f" and there.kind == "d":
        raise ProvisionError(f"{target.name}: {there.path} is a folder on the host; give the "
                             f"file's own path, or end it with '/' to put {name} in it")
    if local.kind == "d" and there.kind == "f":
        raise ProvisionError(f"{target.name}: {there.path} is a file on the host, and {src} is a "
                             "folder")
    plan = changes(local, filtered(there, excludes), opts.delete)
    transport, why = choose_transport(opts.transport, target, host.listing)
    base = Report(host=target.name, direction="up", source=str(src), dest=there.path,
                  transport=transport, transport_why=why, files=len(plan.send), same=plan.same,
                  deleted=len(plan.delete), bytes=plan.bytes, sent_bytes=0, resumed_bytes=0,
                  seconds=0.0, verified="", dry_run=opts.dry_run,
                  planned=tuple(e.rel or name for e in plan.send), deletions=plan.delete)
    if opts.dry_run:
        return base
    _check_space(plan.bytes, there.free, there.path, target.name)
    started = time.monotonic()
    if plan.send:
        if transport == "rsync":
            sent, resumed, verified = _rsync_up(ex, target, local, there, plan, progress, link)
        else:
            sent, resumed, verified = _sftp_up(ex, local, there, plan, progress)
    else:
        sent, resumed, verified = 0, 0, "nothing to send"
    seconds = time.monotonic() - started
    if plan.delete:
        _host_script(ex, "delete", [there.path, *(_join(there.path, r) for r in plan.delete)])
    return _done(base, sent, resumed, seconds, verified)


def sync_down(ex: Executor, target: Target, src: str, dest: str | None, opts: Options,
              progress: Progress | None = None, link: rsync.Link | None = None) -> Report:
    """Fetch ``src`` (a host path; relative: under the data dir) to ``dest`` here (default:
    ``./<name of src>``; a trailing "/" means into that folder)."""
    excludes = Excludes(opts.excludes)
    host = resolve(ex, target, src, posixpath.basename(src.rstrip("/")))
    there = host.side
    if there.kind == "-":
        raise ProvisionError(f"{target.name}: {there.path}: no such file or folder on the host")
    name = posixpath.basename(there.path.rstrip("/")) or "root"
    here_path = local_landing(dest, name)
    here = walk_local(here_path, excludes)
    if there.kind == "f" and here.kind == "d":
        raise ProvisionError(f"{here_path} is a folder here; give the file's own path, or end it "
                             f"with '/' to put {name} in it")
    if there.kind == "d" and here.kind == "f":
        raise ProvisionError(f"{here_path} is a file here, and {there.path} a folder on the host")
    plan = changes(filtered(there, excludes), here, opts.delete)
    transport, why = choose_transport(opts.transport, target, host.listing)
    base = Report(host=target.name, direction="down", source=there.path, dest=str(here_path),
                  transport=transport, transport_why=why, files=len(plan.send), same=plan.same,
                  deleted=len(plan.delete), bytes=plan.bytes, sent_bytes=0, resumed_bytes=0,
                  seconds=0.0, verified="", dry_run=opts.dry_run,
                  planned=tuple(e.rel or name for e in plan.send), deletions=plan.delete)
    if opts.dry_run:
        return base
    _check_space(plan.bytes, here.free, str(here_path), "this machine")
    started = time.monotonic()
    if plan.send:
        if transport == "rsync":
            sent, resumed, verified = _rsync_down(ex, target, there, here_path, plan, progress,
                                                  link)
        else:
            sent, resumed, verified = _sftp_down(ex, there, here_path, plan, progress)
    else:
        sent, resumed, verified = 0, 0, "nothing to fetch"
    seconds = time.monotonic() - started
    for rel in plan.delete:
        _delete_local(here_path, rel)
    return _done(base, sent, resumed, seconds, verified)


def local_landing(dest: str | None, name: str) -> Path:
    """What a host file or folder named ``name`` becomes here: ``./name`` by default; a
    trailing "/" means into that folder; otherwise ``dest`` is the new path itself."""
    if dest is None:
        path = Path(name)
    elif dest.endswith(("/", os.sep)):
        path = Path(dest) / name
    else:
        path = Path(dest)
    return path.expanduser().absolute()


def _done(base: Report, sent: int, resumed: int, seconds: float, verified: str) -> Report:
    return replace(base, sent_bytes=sent, resumed_bytes=resumed, seconds=round(seconds, 3),
                   verified=verified, planned=())


def _join(root: str, rel: str) -> str:
    return f"{root.rstrip('/')}/{rel}" if rel else root


def _local(root: Path, rel: str) -> Path:
    return root / rel if rel else root


def _delete_local(root: Path, rel: str) -> None:
    p = _local(root, rel)
    p.unlink(missing_ok=True)
    d = p.parent
    while d != root and root in d.parents:
        try:
            d.rmdir()
        except OSError:
            break
        d = d.parent


# --- the host-side helper (templates/sync/sync_host.sh.j2) -----------------------------------------

def _host_script(ex: Executor, mode: str, records: Sequence[str]) -> list[str]:
    return ex.query(f"sync-{mode}", render("sync/sync_host.sh.j2", mode=mode),
                    lambda out: [x for x in out.split("\0") if x], what=f"the sync's {mode} step",
                    stdin="".join(f"{x}\0" for x in records),
                    fix="check that the folder is writable and the disk not full")


class _Meter:
    """Whole-transfer progress from per-file callbacks."""

    def __init__(self, total: int, progress: Progress | None):
        self.total, self.progress, self.base = total, progress, 0

    def file(self, done: int, size: int) -> None:
        if self.progress:
            self.progress(min(self.base + done, self.total), self.total)

    def finished(self, size: int) -> None:
        self.base += size
        self.file(0, 0)


# --- SFTP -------------------------------------------------------------------------------------

def _sftp_up(ex: Executor, local: Side, there: Side, plan: Changes,
             progress: Progress | None) -> tuple[int, int, str]:
    root = Path(local.path)
    there_already = {_join(there.path, d) for d in there.dirs}
    if there.kind == "d":
        there_already.add(there.path)
    if there.parent_exists:
        there_already.add(posixpath.dirname(there.path.rstrip("/")))
    folders = sorted({posixpath.dirname(_join(there.path, e.rel)) for e in plan.send}
                     - there_already)
    if folders:
        _host_script(ex, "mkdir", folders)
    with ThreadPoolExecutor(1) as pool:  # this side's hashes while the files go up
        digests: dict[str, Future[str]] = {
            e.rel: pool.submit(file_sha256, _local(root, e.rel)) for e in plan.send}
        meter = _Meter(plan.bytes, progress)
        had: dict[str, int] = {}  # bytes of each file that were already there
        for e in plan.send:
            had[e.rel] = ex.put_part(_local(root, e.rel), _join(there.path, e.rel), meter.file,
                                     step="sync")
            meter.finished(e.size)
        sums = {k: f.result() for k, f in digests.items()}
    bad = _finish_up(ex, there.path, plan.send, sums)
    if bad:  # a part whose first bytes came from another version of the file: send it whole
        again = [e for e in plan.send if _join(there.path, e.rel) in bad]
        for e in again:
            had[e.rel] = ex.put_part(_local(root, e.rel), _join(there.path, e.rel), step="sync",
                                     resume=False)
        still = _finish_up(ex, there.path, again, sums)
        if still:
            raise RemoteError(ex.host, "sync", 1, "sha256 differs after upload: " +
                              ", ".join(sorted(still)[:5]), fix="the file may have changed "
                              "here while it was sent, or the host's disk is failing; run it "
                              "again")
    resumed = sum(had.values())
    return plan.bytes - resumed, resumed, "sha256 of each file on both sides"


def _finish_up(ex: Executor, root: str, sent: Sequence[Entry], sums: dict[str, str]) -> set[str]:
    records: list[str] = []
    for e in sent:
        target = _join(root, e.rel)
        records += [remote_part(target), target, sums[e.rel], str(e.mtime), f"{e.mode:o}"]
    out = _host_script(ex, "finish", records)
    return {x[2:] for x in out if x.startswith("B ")}


def _sftp_down(ex: Executor, there: Side, here: Path, plan: Changes,
               progress: Progress | None) -> tuple[int, int, str]:
    paths = [_join(there.path, e.rel) for e in plan.send]
    for e in plan.send:
        _local(here, e.rel).parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(1) as pool:  # the host hashes while the files come down
        remote = pool.submit(_host_script, ex, "hash", paths)
        meter = _Meter(plan.bytes, progress)
        had: dict[str, int] = {}
        for e, src in zip(plan.send, paths, strict=True):
            had[src] = ex.get_part(src, _local(here, e.rel), e.size, meter.file, step="sync")
            meter.finished(e.size)
        sums = dict(zip(paths, remote.result(), strict=False))
    bad = _place_down(plan.send, paths, here, sums)
    if bad:
        again = [e for e, p in zip(plan.send, paths, strict=True) if p in bad]
        again_paths = [_join(there.path, e.rel) for e in again]
        sums.update(zip(again_paths, _host_script(ex, "hash", again_paths), strict=False))
        for e, p in zip(again, again_paths, strict=True):
            had[p] = ex.get_part(p, _local(here, e.rel), e.size, step="sync", resume=False)
        still = _place_down(again, again_paths, here, sums)
        if still:
            raise RemoteError(ex.host, "sync", 1, "sha256 here differs from the host's: " +
                              ", ".join(sorted(still)[:5]), fix="the file may be changing on "
                              "the host while it is read (a job still writing it); run it again")
    resumed = sum(had.values())
    return plan.bytes - resumed, resumed, "sha256 of each file on both sides"


def _place_down(entries: Sequence[Entry], paths: Sequence[str], here: Path,
                sums: dict[str, str]) -> set[str]:
    bad: set[str] = set()
    for e, src in zip(entries, paths, strict=True):
        final = _local(here, e.rel)
        part = local_part(final)
        if sums.get(src) != file_sha256(part):
            bad.add(src)
            continue
        os.utime(part, (e.mtime, e.mtime))
        part.chmod(e.mode & 0o777)
        part.replace(final)
    return bad


# --- rsync ------------------------------------------------------------------------------------

def _rsync_fail(ex: Executor, what: str, run: rsync.RsyncRun, total: int) -> Exception:
    if run.link_lost:
        return SSHError(ex.host, "connection lost", f"the link dropped during the {what} of "
                        f"{human(total)}; run the same command again: it continues from what "
                        "arrived (rsync keeps the cut file aside)")
    return RemoteError(ex.host, "sync", run.exit_code, run.stderr,
                       fix="see rsync's message above; `--transport sftp` avoids rsync")


def _tracked(progress: Progress | None, total: int) -> Callable[[int], None]:
    def update(done: int) -> None:
        if progress:
            progress(min(done, total), total)
    return update


def _rsync_up(ex: Executor, target: Target, local: Side, there: Side, plan: Changes,
              progress: Progress | None, link: rsync.Link | None = None) -> tuple[int, int, str]:
    prog = rsync.local_rsync()
    assert prog is not None
    parent = posixpath.dirname(there.path.rstrip("/"))
    if there.kind == "-" and not there.parent_exists:  # rsync makes only the last folder
        _host_script(ex, "mkdir", [there.path if local.kind == "d" else parent])
    with _ssh(target, prog[1], link) as ssh:
        listed = local.kind == "d"
        cmd = rsync.argv(prog[0], ssh, local.path, there.path, listed=listed, up=True)
        run = rsync.run(cmd, [e.rel for e in plan.send] if listed else None,
                        _tracked(progress, plan.bytes))
    if run.exit_code != 0:
        raise _rsync_fail(ex, "upload", run, plan.bytes)
    return run.literal, run.matched, "rsync's whole-file checksum of each file sent"


def _rsync_down(ex: Executor, target: Target, there: Side, here: Path, plan: Changes,
                progress: Progress | None, link: rsync.Link | None = None
                ) -> tuple[int, int, str]:
    prog = rsync.local_rsync()
    assert prog is not None
    listed = there.kind == "d"
    (here if listed else here.parent).mkdir(parents=True, exist_ok=True)
    with _ssh(target, prog[1], link) as ssh:
        cmd = rsync.argv(prog[0], ssh, there.path, str(here), listed=listed, up=False)
        run = rsync.run(cmd, [e.rel for e in plan.send] if listed else None,
                        _tracked(progress, plan.bytes))
    if run.exit_code != 0:
        raise _rsync_fail(ex, "download", run, plan.bytes)
    return run.literal, run.matched, "rsync's whole-file checksum of each file sent"


# --- the link's speed (bench) -----------------------------------------------------------------

LINK_PROBE_BYTES = 16 << 20
LINK_PROBE = shown("link-probe")


def measure_link(ex: Executor, size: int = LINK_PROBE_BYTES) -> dict[str, Any]:
    """Up and down MB/s between this machine and the host: ``size`` random bytes each way over
    SFTP (the transport every laptop has), timed without the checks around them."""
    with tempfile.TemporaryDirectory(prefix="gpu-provision-link-") as tmp:
        here = Path(tmp) / "probe"
        here.write_bytes(os.urandom(size))
        there = ex.remote_path(LINK_PROBE)
        started = time.monotonic()
        ex.put_part(here, there, step="link", resume=False)
        up = time.monotonic() - started
        back = Path(tmp) / "back"
        started = time.monotonic()
        ex.get_part(remote_part(there), back, size, step="link", resume=False)
        down = time.monotonic() - started
        ex.run(bash_script(render("sync/sync_host.sh.j2", mode="delete")), step="link", check=False,
               stdin=f"{posixpath.dirname(there)}\0{remote_part(there)}\0")
    return {"up_mbs": round(size / up / 1e6, 2), "down_mbs": round(size / down / 1e6, 2),
            "bytes": size, "transport": "sftp", "source": "bench"}


def bench_link(ex: Executor) -> dict[str, Any]:
    """``measure_link`` for the bench report: a failure is recorded, not raised (the GPU
    figures stand without it)."""
    try:
        return measure_link(ex)
    except ProvisionError as exc:
        return {"up_mbs": None, "down_mbs": None, "error": str(exc).splitlines()[0]}


# --- watch ------------------------------------------------------------------------------------

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
    src = _join(root, ev.rel)
    entry = Entry(ev.rel, ev.size, ev.mtime)
    plan = Changes((entry,), 0)
    try:
        if transport == "rsync":
            _rsync_down(ex, target, Side(src, "f", 0, {"": Entry("", ev.size, ev.mtime)}), final,
                        Changes((Entry("", ev.size, ev.mtime),), 0), None, link)
            digest = file_sha256(final)
        else:
            _sftp_down(ex, Side(root, "d"), here, plan, None)
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
