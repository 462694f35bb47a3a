"""Gather facts: render the facts script, run it once, parse the JSON."""

from __future__ import annotations

import json

from .command import bash_script
from .errors import RemoteError
from .executor import Executor
from .facts.host import HostFacts, parse_facts
from .facts.nvidia import QUERY_FIELDS
from .facts.platform import PlatformMarkers
from .recipes import Platform
from .templating import render

JOURNAL_DIR = ".gpu-provision"  # under the remote $HOME: steps/<step>.json, logs/, lock
CONDA_PREFIXES = ("/root/miniconda3", "/root/anaconda3", "/opt/conda", "/opt/miniconda3")


def markers_of(platforms: tuple[Platform, ...]) -> tuple[PlatformMarkers, ...]:
    return tuple(PlatformMarkers(p.name, p.detect.files, p.detect.env, p.detect.hostname_prefix)
                 for p in platforms)


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


def gather(ex: Executor, platforms: tuple[Platform, ...], data_dirs: tuple[str, ...] = (),
           step_logs: bool = False) -> HostFacts:
    """ONE remote execution; the parse happens locally."""
    result = ex.run(bash_script(facts_script(platforms, data_dirs, step_logs)), step="facts",
                    check=False)
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        raise RemoteError(ex.host, "facts", result.exit_code, result.stdout + result.stderr,
                          fix="the host needs bash and coreutils; see the output above") from None
    return parse_facts(doc, markers_of(platforms))
