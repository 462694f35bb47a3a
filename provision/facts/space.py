"""The file systems a login could put an env on: each mount point with its free bytes and
inodes and whether the login can write there (the ``mounts`` probe of the facts script), and
which of them holds a path. Pure parsers; the plan's judgement of them is ops/space.py.

The probe reads /proc/self/mounts (proc(5): "device mountpoint fstype options ...", a space in
a field written as \\040, which the probe's ``printf %b`` turns back) and gives each mount that
is not a pseudo file system or read-only one line ``MOUNT\\tTYPE\\tw|r\\t<df -Pk row>\\t<df -Pi
row>`` (POSIX df -P: ``Filesystem 1024-blocks Used Available Capacity Mounted-on``; -i: inodes
in the same columns).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mount:
    path: str  # the mount point
    fstype: str
    device: str  # df's first column: what `quota` names a file system by
    free_bytes: int
    total_bytes: int
    free_inodes: int | None = None  # None: the file system does not count them (btrfs, some overlays)
    writable: bool = True  # by this login, at the mount point itself

    @property
    def free_gb(self) -> float:
        return round(self.free_bytes / 1e9, 1)


def parse_mounts(text: str) -> tuple[Mount, ...]:
    """The ``mounts`` probe's lines -> one Mount each (a line df could not answer is left out)."""
    out = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 5:
            continue
        path, fstype, w, blocks, inodes = parts[:5]
        row, irow = blocks.split(), inodes.split()
        if len(row) < 6 or not (row[1].isdigit() and row[3].isdigit()):
            continue
        free_i = int(irow[3]) if len(irow) >= 6 and irow[1].isdigit() and irow[3].isdigit() \
            and int(irow[1]) > 0 else None
        out.append(Mount(path=path, fstype=fstype, device=row[0], free_bytes=int(row[3]) * 1024,
                         total_bytes=int(row[1]) * 1024, free_inodes=free_i, writable=w == "w"))
    return tuple(out)


def mount_of(path: str, mounts: tuple[Mount, ...]) -> Mount | None:
    """The mount that holds ``path`` (which may not exist yet): the longest mount point that is
    the path or one of its parents."""
    best: Mount | None = None
    for m in mounts:
        inside = path == m.path or m.path == "/" or path.startswith(m.path.rstrip("/") + "/")
        if inside and (best is None or len(m.path) > len(best.path)):
            best = m
    return best
