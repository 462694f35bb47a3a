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

import os
import posixpath
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..config.inventory import Target, settings_for
from ..config.recipes import Platform, all_platforms, load_platform
from ..errors import ProvisionError
from ..facts.gather import markers_of
from ..facts.platform import detect_platform
from ..ops.layout import expand_home
from ..remote.executor import Executor
from ..remote.templating import render
from . import rsync
from .plan import (
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
from .transport import (
    Progress,
    host_script,
    join,
    local_path,
    rsync_down,
    rsync_up,
    sftp_down,
    sftp_up,
)

TRANSPORTS = ("auto", "rsync", "sftp")
LINK_MIN_BYTES = 1 << 20  # smaller transfers say more about round trips than about the link


@dataclass(frozen=True)
class Options:
    excludes: tuple[str, ...] = ()
    delete: bool = False
    dry_run: bool = False
    transport: str = "auto"  # auto | rsync | sftp
    only: frozenset[str] | None = None  # up: send only these files below the folder (git's list)
    links_as_files: bool = False  # up: a link inside the folder sends the file it points at


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
    links: int = 0  # symbolic links made (they point inside the folder)
    skipped_links: tuple[str, ...] = ()  # "path -> target" of links pointing outside: left out

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
                    fix="the host needs bash, find and df (coreutils, findutils)",
                    reads_only=True)


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
    local = walk_local(src, excludes, opts.links_as_files)
    if local.kind == "-":
        raise ProvisionError(f"{src}: no such file or folder here")
    if opts.only is not None and local.kind == "d":
        local = replace(local, files={k: e for k, e in local.files.items() if k in opts.only},
                        links={k: t for k, t in local.links.items() if k in opts.only},
                        outside={k: t for k, t in local.outside.items() if k in opts.only})
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
                  planned=tuple(e.rel or name for e in plan.send), deletions=plan.delete,
                  links=len(plan.links), skipped_links=_named(plan.outside))
    if opts.dry_run:
        return base
    _check_space(plan.bytes, there.free, there.path, target.name)
    started = time.monotonic()
    if plan.send:
        if transport == "rsync":
            sent, resumed, verified = rsync_up(ex, target, local, there, plan, progress, link)
        else:
            sent, resumed, verified = sftp_up(ex, local, there, plan, progress)
    else:
        sent, resumed, verified = 0, 0, "nothing to send"
    seconds = time.monotonic() - started
    if plan.links:
        host_script(ex, "link", [there.path, *(x for pair in plan.links for x in pair)])
    if plan.delete:
        host_script(ex, "delete", [there.path, *(join(there.path, r) for r in plan.delete)])
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
                  planned=tuple(e.rel or name for e in plan.send), deletions=plan.delete,
                  links=len(plan.links), skipped_links=_named(plan.outside))
    if opts.dry_run:
        return base
    _check_space(plan.bytes, here.free, str(here_path), "this machine")
    started = time.monotonic()
    if plan.send:
        if transport == "rsync":
            sent, resumed, verified = rsync_down(ex, target, there, here_path, plan, progress,
                                                  link)
        else:
            sent, resumed, verified = sftp_down(ex, there, here_path, plan, progress)
    else:
        sent, resumed, verified = 0, 0, "nothing to fetch"
    seconds = time.monotonic() - started
    for rel, to in plan.links:
        _link_local(here_path, rel, to)
    for rel in plan.delete:
        _delete_local(here_path, rel)
    return _done(base, sent, resumed, seconds, verified)


def _named(outside: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    return tuple(f"{rel} -> {to}" for rel, to in outside)


def _link_local(root: Path, rel: str, target: str) -> None:
    """Make the link ``rel`` -> ``target`` below ``root`` (replacing a link or file there)."""
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.is_symlink() or p.is_file():
        p.unlink()
    os.symlink(target, p)


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


def _delete_local(root: Path, rel: str) -> None:
    p = local_path(root, rel)
    p.unlink(missing_ok=True)
    d = p.parent
    while d != root and root in d.parents:
        try:
            d.rmdir()
        except OSError:
            break
        d = d.parent
