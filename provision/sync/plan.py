"""What a sync moves, decided before anything moves (pure; the dry run prints it).

Both sides are listed as regular files with size, whole-second mtime and mode; a file is sent
when the other side lacks it or differs in size or mtime (rsync's quick check), so a re-run sends
nothing and a cut run sends only what had not arrived. ``--exclude`` patterns follow rsync's
rules for the common cases (``*.tmp``, ``cache/``, ``/top``, ``a/*/b``, ``**``) and are applied
here, once, for every transport; ``--delete`` removes only files the source lacks and no pattern
excludes (an excluded file on the receiving side is protected, as in rsync).
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ProvisionError
from ..units import size


@dataclass(frozen=True)
class Entry:
    rel: str  # path below the synced folder, "/"-separated; "" when the root is one file
    size: int
    mtime: int  # whole seconds
    mode: int = 0o644  # permission bits


@dataclass(frozen=True)
class Side:
    """One side of a transfer: the path, what it is (d: folder, f: file, -: missing), the free
    bytes where it is (or would be made), and its files and folders."""

    path: str
    kind: str
    free: int = 0
    files: Mapping[str, Entry] = field(default_factory=dict)
    dirs: frozenset[str] = frozenset()
    parent_exists: bool = True  # the folder the path is in
    # symbolic links below the folder: rel -> target, made relative (they point inside it)
    links: Mapping[str, str] = field(default_factory=dict)
    # links that point outside the folder: rel -> target as written (never followed, not sent)
    outside: Mapping[str, str] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.files.values())


@dataclass(frozen=True)
class Listing:
    """What the host's listing script reported (templates/sync/sync_list.sh.j2)."""

    home: str
    rsync: str  # the host's ``rsync --version`` first line ("" without rsync)
    hostname: str
    markers: tuple[str, ...]  # platform marker files present
    env_names: tuple[str, ...]  # names in pid 1's environment
    sides: tuple[Side, ...]  # one per path asked about, in order


def parse_listing(text: str) -> Listing:
    home = rsync = hostname = ""
    markers: list[str] = []
    envs: list[str] = []
    heads: list[tuple[str, str, int, bool]] = []
    files: list[dict[str, Entry]] = []
    dirs: list[set[str]] = []
    links: list[dict[str, str]] = []
    outside: list[dict[str, str]] = []
    link_of: str | None = None  # an "L" record's path: its target is the next record
    for rec in text.split("\0"):
        if link_of is not None:
            inside = link_inside(heads[-1][0], link_of, rec)
            (links[-1] if inside is not None else outside[-1])[link_of] = \
                inside if inside is not None else rec
            link_of = None
            continue
        tag, _, rest = rec.partition(" ")
        if tag == "H":
            home = rest
        elif tag == "R":
            rsync = rest
        elif tag == "N":
            hostname = rest.strip()
        elif tag == "M":
            markers.append(rest)
        elif tag == "E":
            envs.append(rest)
        elif tag == "T":
            _, kind, free, parent, path = rest.split(" ", 4)
            heads.append((path, kind, int(free or 0), parent == "1"))
            files.append({})
            dirs.append(set())
            links.append({})
            outside.append({})
        elif tag == "F" and heads:
            _, size, mtime, mode, rel = rest.split(" ", 4)
            files[-1][rel] = Entry(rel, int(size), int(float(mtime)), int(mode, 8))
        elif tag == "D" and heads:
            dirs[-1].add(rest.split(" ", 1)[1])
        elif tag == "L" and heads:
            link_of = rest.split(" ", 1)[1]
    sides = tuple(Side(p, k, f, fs, frozenset(ds), up, ln, out)
                  for (p, k, f, up), fs, ds, ln, out in zip(heads, files, dirs, links, outside,
                                                           strict=True))
    return Listing(home, rsync, hostname, tuple(markers), tuple(envs), sides)


def link_inside(root: str, rel: str, target: str) -> str | None:
    """The target of the link ``rel`` below the folder ``root``, as a path relative to the
    link's own folder, when it points inside the folder (without following any other link);
    None when it points outside it (``..`` past the top, or an absolute path elsewhere)."""
    top = posixpath.normpath(root)
    here = posixpath.dirname(posixpath.join(top, rel))
    full = posixpath.normpath(posixpath.join(here, target))  # an absolute target stays itself
    if full == top or not full.startswith(top.rstrip("/") + "/"):
        return None
    return posixpath.relpath(full, here)


def _glob(pattern: str) -> str:
    """rsync's wildcards as a regex: ``*`` stops at "/", ``**`` does not, ``?`` one char."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                out.append("[" + pattern[i + 1:end].replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern[str]
    dir_only: bool


class Excludes:
    """rsync's exclude rules: a pattern without "/" matches a name at any depth; one with a "/"
    inside matches the end of the path (anchored at the top when it starts with "/"); a trailing
    "/" matches folders only. A file is excluded when it or any folder above it is."""

    def __init__(self, patterns: Sequence[str] = ()):
        self.patterns = tuple(patterns)
        self.rules: list[_Rule] = []
        for p in patterns:
            if not p or not p.strip("/"):
                raise ProvisionError(f"--exclude {p!r}: an empty pattern excludes nothing; "
                                     "give a name or glob, e.g. --exclude '*.tmp'")
            anchored, dir_only = p.startswith("/"), p.endswith("/")
            body = _glob(p.strip("/"))
            rx = f"^{body}$" if anchored else f"(^|/){body}$"
            self.rules.append(_Rule(re.compile(rx, re.DOTALL), dir_only))

    def _match(self, rel: str, is_dir: bool) -> bool:
        return any(r.regex.search(rel) and (is_dir or not r.dir_only) for r in self.rules)

    def skip(self, rel: str) -> bool:
        if not self.rules or not rel:
            return False
        parts = rel.split("/")
        return any(self._match("/".join(parts[:i]), True) for i in range(1, len(parts))) \
            or self._match(rel, False)

    def skip_dir(self, rel: str) -> bool:
        parts = rel.split("/")
        return any(self._match("/".join(parts[:i]), True) for i in range(1, len(parts) + 1))


def walk_local(path: Path, excludes: Excludes, links_as_files: bool = False) -> Side:
    """This machine's side: a folder's regular files and its symbolic links (special files are
    left out, as on the host), or one file. A link that points inside the folder is kept as a
    link (``links_as_files``: the file it points at is sent in its place); one that points
    outside is named in ``outside`` and never followed."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return Side(str(path), "-", _free(path))
    if stat.S_ISREG(st.st_mode):
        return Side(str(path), "f", _free(path),
                    {"": Entry("", st.st_size, int(st.st_mtime), stat.S_IMODE(st.st_mode))})
    if not stat.S_ISDIR(st.st_mode):
        raise ProvisionError(f"{path}: neither a file nor a folder")
    files: dict[str, Entry] = {}
    dirs: set[str] = set()
    links: dict[str, str] = {}
    outside: dict[str, str] = {}
    for top, subdirs, names in os.walk(path):
        base = Path(top).relative_to(path).as_posix()
        base = "" if base == "." else base
        keep = []
        for d in sorted(subdirs):
            rel = f"{base}/{d}" if base else d
            if (Path(top) / d).is_symlink():
                names.append(d)  # a link to a folder is a link, never walked into
            elif not excludes.skip_dir(rel):
                keep.append(d)
                dirs.add(rel)
        subdirs[:] = keep
        for n in names:
            rel = f"{base}/{n}" if base else n
            if excludes.skip(rel):
                continue
            s = (Path(top) / n).lstat()
            if stat.S_ISREG(s.st_mode):
                files[rel] = Entry(rel, s.st_size, int(s.st_mtime), stat.S_IMODE(s.st_mode))
            elif stat.S_ISLNK(s.st_mode):
                target = os.readlink(Path(top) / n)
                inside = link_inside(str(path), rel, target)
                if inside is None:
                    outside[rel] = target
                    continue
                t = (Path(top) / n).stat() if links_as_files and (Path(top) / n).is_file() \
                    else None
                if t is not None:
                    files[rel] = Entry(rel, t.st_size, int(t.st_mtime), stat.S_IMODE(t.st_mode))
                else:
                    links[rel] = inside
    return Side(str(path), "d", _free(path), files, frozenset(dirs), links=links, outside=outside)


def _free(path: Path) -> int:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return os.statvfs(p).f_bavail * os.statvfs(p).f_frsize
    except OSError:
        return 0


def filtered(side: Side, excludes: Excludes) -> Side:
    """The host's side with the excluded files and folders left out."""
    if not excludes.rules:
        return side
    return Side(side.path, side.kind, side.free,
                {k: e for k, e in side.files.items() if not excludes.skip(k)},
                frozenset(d for d in side.dirs if not excludes.skip_dir(d)), side.parent_exists,
                {k: t for k, t in side.links.items() if not excludes.skip(k)},
                {k: t for k, t in side.outside.items() if not excludes.skip(k)})


@dataclass(frozen=True)
class Changes:
    """What a sync will do: files to send (in order), files already the same, files to delete."""

    send: tuple[Entry, ...]
    same: int
    delete: tuple[str, ...] = ()
    links: tuple[tuple[str, str], ...] = ()  # (rel, target) to make on the receiving side
    outside: tuple[tuple[str, str], ...] = ()  # links left out: they point outside the folder

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.send)


def changes(source: Side, dest: Side, delete: bool = False) -> Changes:
    """Quick check by size and whole-second mtime; ``delete``: the destination's files the
    source lacks (both sides already filtered by the excludes)."""
    send = tuple(e for k, e in sorted(source.files.items())
                 if (d := dest.files.get(k)) is None or (d.size, d.mtime) != (e.size, e.mtime))
    gone = tuple(sorted(k for k in dest.files if k not in source.files)) if delete else ()
    links = tuple((k, t) for k, t in sorted(source.links.items()) if dest.links.get(k) != t)
    return Changes(send, len(source.files) - len(send), gone, links,
                   tuple(sorted(source.outside.items())))


def remote_abspath(path: str, home: str, base: str) -> str:
    """A host path as the user wrote it: ``~`` is the home, a relative path is under ``base``
    (the data dir), an absolute one stays. ``..`` is resolved; a trailing "/" is kept."""
    trail = path.endswith("/") and path.strip("/") != ""
    if path == "~" or path.startswith("~/"):
        full = home.rstrip("/") + "/" + path[2:]
    elif path.startswith("/"):
        full = path
    else:
        full = base.rstrip("/") + "/" + path
    full = posixpath.normpath(full)
    return full + "/" if trail else full


def landing(dest: str, name: str) -> str:
    """What a source named ``name`` becomes at ``dest``: a trailing "/" means "into this
    folder" (``dest/name``); otherwise ``dest`` is the new path itself."""
    return posixpath.join(dest, name) if dest.endswith("/") else dest


def human(n: float) -> str:
    return size(n)


def names(entries: Iterable[Entry]) -> list[str]:
    return [e.rel for e in entries]
