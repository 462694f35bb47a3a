"""Gather facts: render the facts script, run it once, parse the JSON.

The script is rendered (and the parsers imported) by ``Ahead`` in a thread while the connection
is set up: on a long link the SSH handshake leaves the laptop's CPU idle for several round trips.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING

from ..config.inventory import Target
from ..remote.contract import STATE
from .platform import PlatformMarkers

if TYPE_CHECKING:  # the facts script renders where Fabric is not installed (bench/device_check.sh)
    from ..config.recipes import Platform
    from ..remote.executor import Executor
    from .host import HostFacts

JOURNAL_DIR = STATE  # under the remote $HOME: steps/<step>.json, logs/, locks/
CONDA_PREFIXES = ("/root/miniconda3", "/root/anaconda3", "/opt/conda", "/opt/miniconda3",
                  "/opt/miniforge3")


def markers_of(platforms: tuple[Platform, ...]) -> tuple[PlatformMarkers, ...]:
    return tuple(PlatformMarkers(p.name, p.detect.files, p.detect.env, p.detect.hostname_prefix)
                 for p in platforms)


def data_dirs(platforms: tuple[Platform, ...], target: Target | None = None) -> tuple[str, ...]:
    """Every folder whose free disk the facts report: each platform's data dir (the platform is
    not known before the facts) and the inventory's data_dir and env_dir."""
    own = {str(d) for k in ("data_dir", "env_dir")
           if target is not None and (d := target.settings.get(k))}
    return tuple(sorted({p.data_dir for p in platforms if p.data_dir} | own))


def facts_script(platforms: tuple[Platform, ...], data_dirs: tuple[str, ...] = (),
                 step_logs: bool = False) -> str:
    """``step_logs``: also the tail of each step's log on the host (for doctor)."""
    from ..remote.templating import render
    from .images import USER_SITE_PTH, VENV_HOMES
    from .nvidia import QUERY_FIELDS
    return render(
        "facts/facts.sh.j2",
        probe_timeout=20,
        data_dirs=data_dirs,
        marker_files=sorted({f for p in platforms for f in p.detect.files}),
        query_fields=",".join(QUERY_FIELDS),
        query_fields_nocc=",".join(f for f in QUERY_FIELDS if f != "compute_cap"),
        journal_dir=JOURNAL_DIR,
        conda_prefixes=CONDA_PREFIXES,
        venv_homes=VENV_HOMES,
        view_pth=USER_SITE_PTH,
        step_logs=step_logs,
    )


def prepare(target: Target | None, step_logs: bool = False) -> tuple[tuple[Platform, ...], str]:
    """The platforms (their markers parse the facts) and the rendered script; the parsers are
    imported here too, so that a thread can do all of it ahead of time."""
    from ..config.recipes import all_platforms
    from . import host  # noqa: F401
    platforms = all_platforms()
    return platforms, facts_script(platforms, data_dirs(platforms, target), step_logs)


class Ahead:
    """The facts script for ``target``, rendered in a thread started now, with the parsers
    imported; ``get()`` waits for it (and raises what the rendering raised)."""

    def __init__(self, target: Target | None, step_logs: bool = False):
        self.target, self.step_logs = target, step_logs
        self._done = threading.Event()
        self._value: tuple[tuple[Platform, ...], str] | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._render, name="facts-ahead", daemon=True).start()

    def _render(self) -> None:
        try:
            self._value = prepare(self.target, self.step_logs)
        except BaseException as exc:  # handed to the caller of get()
            self._error = exc
        finally:
            self._done.set()

    def get(self) -> tuple[tuple[Platform, ...], str]:
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


def gather(ex: Executor, target: Target | None = None, step_logs: bool = False,
           ahead: Ahead | None = None) -> HostFacts:
    """ONE remote execution; the parse happens locally. ``ahead``: the script already under way
    (for the same target and ``step_logs``)."""
    from .host import parse_facts

    if ahead is not None and ahead.step_logs == step_logs:
        platforms, script = ahead.get()
    else:
        platforms, script = prepare(target, step_logs)
    doc = ex.query("facts", script, json.loads, what="the facts", any_exit=True, reads_only=True,
                   fix="the facts script printed no JSON: the host needs bash and coreutils; "
                       "see the output above")
    return parse_facts(doc, markers_of(platforms))
