"""Gather facts: render the facts script, run it once, parse the JSON."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .command import bash_script
from .errors import RemoteError
from .facts.host import HostFacts, parse_facts
from .facts.nvidia import QUERY_FIELDS
from .facts.platform import PlatformMarkers
from .inventory import Target
from .recipes import Platform, all_platforms
from .templating import render

if TYPE_CHECKING:  # the facts script renders where Fabric is not installed (bench/device_check.sh)
    from .executor import Executor

JOURNAL_DIR = ".gpu-provision"  # under the remote $HOME: steps/<step>.json, logs/, locks/
CONDA_PREFIXES = ("/root/miniconda3", "/root/anaconda3", "/opt/conda", "/opt/miniconda3")


def markers_of(platforms: tuple[Platform, ...]) -> tuple[PlatformMarkers, ...]:
    return tuple(PlatformMarkers(p.name, p.detect.files, p.detect.env, p.detect.hostname_prefix)
                 for p in platforms)


def data_dirs(platforms: tuple[Platform, ...], target: Target | None = None) -> tuple[str, ...]:
    """Every folder whose free disk the facts report: each platform's data dir (the platform is
    not known before the facts) and the inventory's."""
    own = target.settings.get("data_dir") if target is not None else None
    return tuple(sorted({p.data_dir for p in platforms if p.data_dir} | ({own} if own else set())))


def facts_script(platforms: tuple[Platform, ...], data_dirs: tuple[str, ...] = (),
                 step_logs: bool = False) -> str:
    """``step_logs``: also the tail of each step's log on the host (for doctor)."""
    return render(
        "facts.sh.j2",
        probe_timeout=20,
        data_dirs=data_dirs,
        marker_files=sorted({f for p in platforms for f in p.detect.files}),
        query_fields=",".join(QUERY_FIELDS),
        query_fields_nocc=",".join(f for f in QUERY_FIELDS if f != "compute_cap"),
        journal_dir=JOURNAL_DIR,
        conda_prefixes=CONDA_PREFIXES,
        step_logs=step_logs,
    )


def gather(ex: Executor, target: Target | None = None, step_logs: bool = False) -> HostFacts:
    """ONE remote execution; the parse happens locally."""
    from .executor import NO_EXIT_STATUS

    platforms = all_platforms()
    result = ex.run(bash_script(facts_script(platforms, data_dirs(platforms, target), step_logs)),
                    step="facts", check=False)
    if result.exit_code == NO_EXIT_STATUS:
        raise ex.lost("the facts")
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        raise RemoteError(ex.host, "facts", result.exit_code, result.stdout + result.stderr,
                          fix="the facts script printed no JSON: the host needs bash and "
                              "coreutils; see the output above") from None
    return parse_facts(doc, markers_of(platforms))
