"""How the bytes move, once ``transfer`` has decided what: the host-side helper (hashes and
renames in one execution each), SFTP through the executor, or the laptop's rsync over
ssh with only the pinned key."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from ..config.inventory import Target
from ..errors import RemoteError, SSHError
from ..remote.executor import Executor, file_sha256, local_part, remote_part
from ..remote.templating import render
from . import rsync
from .plan import (
    Changes,
    Entry,
    Side,
    human,
)

Progress = Callable[[int, int], None]  # (bytes done, bytes in all) of the whole transfer



@contextmanager
def ssh_argv(target: Target, ssh: str, link: rsync.Link | None) -> Iterator[list[str]]:
    if link is not None:
        link.ready()
        yield link.argv
    else:
        with rsync.ssh_options(target, ssh) as argv:
            yield argv


def join(root: str, rel: str) -> str:
    return f"{root.rstrip('/')}/{rel}" if rel else root


def local_path(root: Path, rel: str) -> Path:
    return root / rel if rel else root


# --- the host-side helper (templates/sync/sync_host.sh.j2) -----------------------------------------

def host_script(ex: Executor, mode: str, records: Sequence[str]) -> list[str]:
    return ex.query(f"sync-{mode}", render("sync/sync_host.sh.j2", mode=mode),
                    lambda out: [x for x in out.split("\0") if x], what=f"the sync's {mode} step",
                    stdin="".join(f"{x}\0" for x in records),
                    fix="check that the folder is writable and the disk not full",
                    reads_only=mode == "hash")


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

def sftp_up(ex: Executor, local: Side, there: Side, plan: Changes,
             progress: Progress | None) -> tuple[int, int, str]:
    root = Path(local.path)
    there_already = {join(there.path, d) for d in there.dirs}
    if there.kind == "d":
        there_already.add(there.path)
    if there.parent_exists:
        there_already.add(posixpath.dirname(there.path.rstrip("/")))
    folders = sorted({posixpath.dirname(join(there.path, e.rel)) for e in plan.send}
                     - there_already)
    if folders:
        host_script(ex, "mkdir", folders)
    with ThreadPoolExecutor(1) as pool:  # this side's hashes while the files go up
        digests: dict[str, Future[str]] = {
            e.rel: pool.submit(file_sha256, local_path(root, e.rel)) for e in plan.send}
        meter = _Meter(plan.bytes, progress)
        had: dict[str, int] = {}  # bytes of each file that were already there
        for e in plan.send:
            had[e.rel] = ex.put_part(local_path(root, e.rel), join(there.path, e.rel), meter.file,
                                     step="sync")
            meter.finished(e.size)
        sums = {k: f.result() for k, f in digests.items()}
    bad = _finish_up(ex, there.path, plan.send, sums)
    if bad:  # a part whose first bytes came from another version of the file: send it whole
        again = [e for e in plan.send if join(there.path, e.rel) in bad]
        for e in again:
            had[e.rel] = ex.put_part(local_path(root, e.rel), join(there.path, e.rel), step="sync",
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
        target = join(root, e.rel)
        records += [remote_part(target), target, sums[e.rel], str(e.mtime), f"{e.mode:o}"]
    out = host_script(ex, "finish", records)
    return {x[2:] for x in out if x.startswith("B ")}


def sftp_down(ex: Executor, there: Side, here: Path, plan: Changes,
               progress: Progress | None) -> tuple[int, int, str]:
    paths = [join(there.path, e.rel) for e in plan.send]
    for e in plan.send:
        local_path(here, e.rel).parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(1) as pool:  # the host hashes while the files come down
        remote = pool.submit(host_script, ex, "hash", paths)
        meter = _Meter(plan.bytes, progress)
        had: dict[str, int] = {}
        for e, src in zip(plan.send, paths, strict=True):
            had[src] = ex.get_part(src, local_path(here, e.rel), e.size, meter.file, step="sync")
            meter.finished(e.size)
        sums = dict(zip(paths, remote.result(), strict=False))
    bad = _place_down(plan.send, paths, here, sums)
    if bad:
        again = [e for e, p in zip(plan.send, paths, strict=True) if p in bad]
        again_paths = [join(there.path, e.rel) for e in again]
        sums.update(zip(again_paths, host_script(ex, "hash", again_paths), strict=False))
        for e, p in zip(again, again_paths, strict=True):
            had[p] = ex.get_part(p, local_path(here, e.rel), e.size, step="sync", resume=False)
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
        final = local_path(here, e.rel)
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


def rsync_up(ex: Executor, target: Target, local: Side, there: Side, plan: Changes,
              progress: Progress | None, link: rsync.Link | None = None) -> tuple[int, int, str]:
    prog = rsync.local_rsync()
    assert prog is not None
    parent = posixpath.dirname(there.path.rstrip("/"))
    if there.kind == "-" and not there.parent_exists:  # rsync makes only the last folder
        host_script(ex, "mkdir", [there.path if local.kind == "d" else parent])
    with ssh_argv(target, prog[1], link) as ssh:
        listed = local.kind == "d"
        cmd = rsync.argv(prog[0], ssh, local.path, there.path, listed=listed, up=True)
        run = rsync.run(cmd, [e.rel for e in plan.send] if listed else None,
                        _tracked(progress, plan.bytes))
    if run.exit_code != 0:
        raise _rsync_fail(ex, "upload", run, plan.bytes)
    return run.literal, run.matched, "rsync's whole-file checksum of each file sent"


def rsync_down(ex: Executor, target: Target, there: Side, here: Path, plan: Changes,
                progress: Progress | None, link: rsync.Link | None = None
                ) -> tuple[int, int, str]:
    prog = rsync.local_rsync()
    assert prog is not None
    listed = there.kind == "d"
    (here if listed else here.parent).mkdir(parents=True, exist_ok=True)
    with ssh_argv(target, prog[1], link) as ssh:
        cmd = rsync.argv(prog[0], ssh, there.path, str(here), listed=listed, up=False)
        run = rsync.run(cmd, [e.rel for e in plan.send] if listed else None,
                        _tracked(progress, plan.bytes))
    if run.exit_code != 0:
        raise _rsync_fail(ex, "download", run, plan.bytes)
    return run.literal, run.matched, "rsync's whole-file checksum of each file sent"
