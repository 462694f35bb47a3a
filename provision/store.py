"""What this tool keeps on the laptop: ``logs/`` and ``reports/`` under one folder of ours.

The folder is the same wherever the tool runs from, because what it holds is per host, not per
project: ``run`` applies the fixes of the host's newest validation, ``doctor`` reads its newest
logs and ``compare`` every host's newest bench, from whatever folder they are started in; and
nothing lands beside a training repo's own ``logs/`` (nor in the code ``run`` sends). Where
(``root_and_why``): ``--workdir DIR`` / ``$GPU_PROVISION_WORKDIR``; else ``$GPU_PROVISION_HOME``
(one folder for everything of ours, known_hosts included); else the XDG state folder,
``$XDG_STATE_HOME/gpu-provision`` (``~/.local/state/gpu-provision``), which the XDG Base
Directory spec names for exactly this ("actions history (logs, history, ...)"). Runs are named
by one function (``run_id``), and a host's folder name by another (``host_dir``), so every
reader and writer agrees on the layout::

    <root>/logs/<host>/<run>/<step>.log     what each remote execution printed
    <root>/reports/<host>/<kind>-<run>.json validation and bench reports (verify: .xml)

Before, the root was the current folder: ``logs/`` and ``reports/`` of ours found there (named
as ours are) are still read, beside the root's (``Store.legacy``), and ``moved_note`` says in
one line where new ones go.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUN_ID_FORMAT = "%Y%m%d-%H%M%S"
RUN_RE = re.compile(r"\d{8}-\d{6}")


def run_id(at: float | None = None) -> str:
    """The name of one run (local time, sortable): ``20261201-143055``."""
    return time.strftime(RUN_ID_FORMAT, time.localtime(at))


def host_dir(host: str) -> str:
    """The host's folder name under logs/ and reports/."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", host)


def root_and_why() -> tuple[Path, str]:
    """The folder of logs/ and reports/, and what chose it (for messages)."""
    work = os.environ.get("GPU_PROVISION_WORKDIR")
    if work:
        return Path(work), "--workdir / $GPU_PROVISION_WORKDIR"
    home = os.environ.get("GPU_PROVISION_HOME")
    if home:
        return Path(home), "$GPU_PROVISION_HOME"
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "gpu-provision", "the XDG state folder"


def default_root() -> Path:
    return root_and_why()[0]


def _ours(folder: Path) -> bool:
    """Does ``folder`` (a ``logs/`` or ``reports/``) hold what this tool wrote there: a host's
    folder with a run folder, or a ``<kind>-<run>.json`` report?"""
    try:
        hosts = [d for d in folder.iterdir() if d.is_dir()]
    except OSError:
        return False
    for d in hosts[:50]:
        try:
            names = [p.name for p in d.iterdir()][:200]
        except OSError:
            continue
        if any(RUN_RE.fullmatch(n) or re.fullmatch(r"[a-z]+-\d{8}-\d{6}\.(json|xml)", n)
               for n in names):
            return True
    return False


def legacy_root(root: Path) -> Path | None:
    """The current folder, when it holds logs/ or reports/ of ours from before they moved to
    ``root`` (and is not ``root``)."""
    if os.environ.get("GPU_PROVISION_WORKDIR"):  # a folder asked for: that one alone
        return None
    here = Path.cwd()
    try:
        if here.resolve() == root.resolve():
            return None
    except OSError:
        return None
    return here if _ours(here / "reports") or _ours(here / "logs") else None


@dataclass(frozen=True)
class Store:
    """The local logs and reports of every host, under ``root``."""

    root: Path = field(default_factory=default_root)
    # the old place (the current folder's logs/ and reports/), still read; None: there is none
    legacy: Path | None = None

    @classmethod
    def here(cls) -> Store:
        """The store every task uses: the root of ``root_and_why``, and the current folder's
        old logs/ and reports/ when it has some."""
        root = default_root()
        return cls(root, legacy_root(root))

    @property
    def reports_dir(self) -> Path:
        return self.root / "reports"

    def moved_note(self) -> str | None:
        """One line for tasks that read reports or logs, while an old place is read too."""
        if self.legacy is None:
            return None
        why = root_and_why()[1]
        return (f"logs/ and reports/ in {self.legacy} are from before they moved to {self.root} "
                f"({why}): still read; new ones go there (move the old ones into it to keep "
                "one place)")

    def run_logs(self, host: str, run: str) -> Path:
        """The folder one run's step logs go to (made when the first log is written)."""
        return self.root / "logs" / host_dir(host) / run

    def report_path(self, host: str, kind: str, run: str | None = None, ext: str = "json") -> Path:
        return self.reports_dir / host_dir(host) / f"{kind}-{run or run_id()}.{ext}"

    def save_report(self, host: str, report: dict[str, Any], kind: str = "validate",
                    run: str | None = None) -> Path:
        """Write ``report`` as ``reports/<host>/<kind>-<run>.json`` (whole, or not at all)."""
        path = self.report_path(host, kind, run)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        tmp.replace(path)
        return path

    def reports(self, kind: str, host: str | None = None) -> list[Path]:
        """Saved reports of ``kind`` (of one host, or of all), oldest first."""
        bases = [self.reports_dir, *([self.legacy / "reports"] if self.legacy else [])]
        folders = [b / host_dir(host) for b in bases] if host else \
            sorted(p for b in bases for p in b.glob("*") if p.is_dir())
        return sorted((p for d in folders for p in d.glob(f"{kind}-*.json")),
                      key=lambda p: (p.name, str(p)))

    def last_report(self, host: str, kind: str = "validate") -> dict[str, Any] | None:
        """The newest saved report of ``kind`` for ``host`` (None when there is none)."""
        found = self.reports(kind, host)
        return json.loads(found[-1].read_text()) if found else None

    def last_logs(self, host: str) -> dict[str, str]:
        """The step logs of the host's newest run here, keyed ``log <host>/<run>/<step>.log``.

        facts.log is left out: it is raw probe data (a CPU host's "nvidia-smi: command not
        found" is no error), and doctor reads the facts themselves, parsed.
        """
        bases = [self.root / "logs", *([self.legacy / "logs"] if self.legacy else [])]
        runs = sorted(((p.name, p, b) for b in bases for p in (b / host_dir(host)).glob("*")
                       if p.is_dir()), key=lambda r: (r[0], str(r[1])))
        if not runs:
            return {}
        _, newest, base = runs[-1]
        return {f"log {p.relative_to(base)}": outputs(p.read_text(errors="replace"))[-20000:]
                for p in sorted(newest.glob("*.log")) if p.name != "facts.log"}


    def prune(self, older_than: float, now: float | None = None,
              dry_run: bool = False) -> list[Path]:
        """Remove run log folders and reports older than ``older_than`` seconds (by the time in
        their names), keeping each host's newest run and newest report of each kind: doctor
        reads the newest logs, `run` the newest validation, `compare` the newest bench.
        Returns what was (or, with ``dry_run``, would be) removed."""
        import shutil
        cutoff = (time.time() if now is None else now) - older_than
        gone: list[Path] = []
        for host in sorted(p for p in (self.root / "logs").glob("*") if p.is_dir()):
            runs = sorted(p for p in host.iterdir() if p.is_dir() and _when(p.name) is not None)
            gone += [p for p in runs[:-1] if (_when(p.name) or 0) < cutoff]
        for host in sorted(p for p in self.reports_dir.glob("*") if p.is_dir()):
            kinds: dict[str, list[Path]] = {}
            for p in host.iterdir():
                kind, _, stamp = p.stem.rpartition("-")
                kind, _, day = kind.rpartition("-")
                if p.is_file() and _when(f"{day}-{stamp}") is not None:
                    kinds.setdefault(kind, []).append(p)
            for found in kinds.values():
                found.sort(key=lambda p: p.name)
                gone += [p for p in found[:-1]
                         if (_when("-".join(p.stem.rsplit("-", 2)[1:])) or 0) < cutoff]
        if not dry_run:
            for p in gone:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        return gone


def _when(name: str) -> float | None:
    """The time a run id (``20261201-143055``) names, None for any other name."""
    try:
        return time.mktime(time.strptime(name, RUN_ID_FORMAT))
    except ValueError:
        return None


def outputs(log: str) -> str:
    """A step log without the commands it records (a script's own text is not its output)."""
    return re.sub(r"^\$ .*?^# exit -?\d+ in [\d.]+s$", "", log, flags=re.MULTILINE | re.DOTALL)

