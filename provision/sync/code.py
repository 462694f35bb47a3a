"""Code with the job: ``run`` sends the local working folder (or ``--code DIR``) to the host
before it starts, through ``sync up`` (only what changed; checked), into one folder per project
that becomes the job's working folder.

What is sent: in a git work tree, the files git would keep (``git ls-files --cached --others
--exclude-standard``: tracked and untracked ones, without what .gitignore, .git/info/exclude and
the global excludes leave out -- git's own rules, exactly); elsewhere every file but those the
folder's .gitignore names (its plain patterns, read as rsync's, which agree on the common
cases). Never the usual caches and envs (``ALWAYS_LEFT_OUT``), nor what ``--exclude`` names.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ..errors import ProvisionError, UsageError
from .plan import Excludes, human, walk_local

# a virtualenv or a cache is never code, and may be gigabytes
ALWAYS_LEFT_OUT = (".git/", "__pycache__/", "*.pyc", ".venv/", "venv/", ".mypy_cache/",
                   ".pytest_cache/", ".ipynb_checkpoints/", ".gpu-provision/", "node_modules/")
MAX_BYTES = 1 << 30  # more than this is data, not code: sync it once, --exclude it here
SCRIPT = re.compile(r"[^\s=]+\.(?:py|sh|ipynb)")


def code_folder(code: str | None) -> Path:
    """The folder ``--code`` names (default: the current one), checked before connecting."""
    folder = Path(code or ".").expanduser()
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "no such folder here"
        raise UsageError(f"--code {code}: {what}; give the project's folder (default: the "
                         "current one), or --no-code")
    folder = folder.resolve()
    if folder in (Path.home().resolve(), Path("/")):
        raise UsageError(f"run sends the current folder as the job's code, and {folder} is "
                         f"{'your home' if folder != Path('/') else 'the root'}: run it from "
                         "the project's folder, or give --code DIR, or --no-code")
    return folder


def git_files(folder: Path) -> frozenset[str] | None:
    """The files git keeps in ``folder`` (relative paths), None when it is no git work tree or
    git is not here."""
    git = shutil.which("git")
    if git is None or not (folder / ".git").exists():
        return None
    r = subprocess.run([git, "-C", str(folder), "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True, timeout=60)
    if r.returncode != 0:
        return None
    return frozenset(p for p in r.stdout.decode("utf-8", "surrogateescape").split("\0") if p)


def gitignore_patterns(folder: Path) -> tuple[str, ...]:
    """The plain patterns of the folder's own .gitignore (comments, blanks and ``!`` re-includes
    left out: a re-include cannot be honoured by excludes alone)."""
    path = folder / ".gitignore"
    if not path.is_file():
        return ()
    out = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            out.append(line)
    return tuple(out)


PULLED = "pulled"  # in the store: what `sync down` brought here, one absolute path a line
LAST_JOB_ID = "last-job-id"  # in the store: the id `run` gave the last job it named itself


def record_pulled(store: Path, path: Path) -> None:
    """Remember that ``sync down`` brought ``path`` here: a checkpoint pulled into the project
    folder is not the job's code, and the next ``run`` must not send it back up."""
    ledger = store / PULLED
    known = set(ledger.read_text().splitlines()) if ledger.exists() else set()
    full = str(path.resolve())
    if full not in known:
        store.mkdir(parents=True, exist_ok=True)
        with ledger.open("a", encoding="utf-8") as f:
            f.write(full + "\n")


def pulled_patterns(folder: Path, store: Path | None) -> tuple[str, ...]:
    """Exclude patterns (anchored at ``folder``) for what ``sync down`` pulled into it."""
    ledger = store / PULLED if store is not None else None
    if ledger is None or not ledger.exists():
        return ()
    out = []
    for line in ledger.read_text(encoding="utf-8").splitlines():
        p = Path(line)
        try:
            rel = p.relative_to(folder.resolve()).as_posix()
        except ValueError:
            continue
        if rel != "." and p.exists():
            out.append(f"/{rel}/" if p.is_dir() else f"/{rel}")
    return tuple(sorted(out))


def selection(folder: Path, excludes: Sequence[str], store: Path | None = None
              ) -> tuple[frozenset[str] | None, tuple[str, ...], str]:
    """(only these files or None, exclude patterns, how the files were chosen). ``store``: the
    folder this tool keeps its logs and reports in; left out when it lies in ``folder``, as is
    what ``sync down`` pulled into ``folder`` (``record_pulled``)."""
    pulled = pulled_patterns(folder, store)
    patterns: tuple[str, ...] = (*ALWAYS_LEFT_OUT, *excludes, *pulled)
    if store is not None:
        try:
            rel = store.resolve().relative_to(folder).as_posix()
        except ValueError:
            rel = None
        if rel is not None:  # its logs/, reports/ and ledger are ours, not the project's
            top = "" if rel == "." else f"/{rel}"
            patterns += (f"{top}/logs/", f"{top}/reports/", f"{top}/{PULLED}",
                         f"{top}/{LAST_JOB_ID}")
    left = (f"; not what sync down pulled here: {', '.join(p.lstrip('/') for p in pulled)}"
            if pulled else "")
    listed = git_files(folder)
    if listed is not None:
        return listed, patterns, "git's list (.gitignore honoured)" + left
    ignored = gitignore_patterns(folder)
    how = "every file but .gitignore's patterns" if ignored else "every file"
    return None, (*patterns, *ignored), how + left


def check_size(folder: Path, only: frozenset[str] | None, patterns: Sequence[str]) -> None:
    """Refuse before sending when what would go is more than code is."""
    files = walk_local(folder, Excludes(patterns)).files
    size = sum(e.size for k, e in files.items() if only is None or k in only)
    if size > MAX_BYTES:
        big = sorted((e for k, e in files.items() if only is None or k in only),
                     key=lambda e: -e.size)[:3]
        raise ProvisionError(f"{folder}: {human(size)} to send as the job's code (the largest: "
                             f"{', '.join(f'{e.rel} {human(e.size)}' for e in big)}); send data "
                             "once with sync up and leave it out here (--exclude 'data/', or "
                             ".gitignore), or --no-code")


def named_files(argv: Sequence[str]) -> tuple[str, ...]:
    """The script files a command names (``train.py``, ``run.sh``, ``nb.ipynb``): what must
    exist where it runs. The word after ``-c`` is code, not a file name."""
    out = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word == "-c":
            skip = True
            continue
        if not word.startswith("-") and SCRIPT.fullmatch(word):
            out.append(word)
    return tuple(dict.fromkeys(out))
