"""What the tool itself recorded about a host, read before the knowledge base: the steps whose
last run failed (the host's journal, with the decisive line of their log) and the last
validation verdict that was not PASS (with its failing checks from the report kept here). A
FAIL the tool recorded is always an error finding: `doctor` never says "nothing found" over it.
Pure: facts and the saved report in, findings out."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..facts.host import HostFacts
from .match import Finding

# the line of a step's log that says what went wrong: apt's and dnf's E:/Error:, a refusal, a
# Python exception, a failed command's own words
_DECISIVE = re.compile(r"^(E:|Error|ERROR|error:|fatal:|FATAL|Traceback|[A-Za-z_.]+(Error|Exception):)"
                       r"|refus|cannot|could not|not found|No such|failed|denied|exit code",
                       re.IGNORECASE)


def decisive_line(log: str) -> str:
    """The last line of ``log`` that says what went wrong, else its last line (at most 240
    characters)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    said = [ln for ln in lines if _DECISIVE.search(ln)]
    line = (said or lines or [""])[-1]
    return line if len(line) <= 240 else line[:237] + "..."


def _at(entry: Mapping[str, Any]) -> float:
    try:
        return float(entry.get("at") or 0)
    except (TypeError, ValueError):
        return 0.0


def failed_steps(facts: HostFacts, host: str) -> list[Finding]:
    """Each step whose last run on the host failed, newest first."""
    failed = sorted((e for name, e in facts.journal.items()
                     if name != "verdict" and e.get("result") == "failed"), key=_at, reverse=True)
    out = []
    for e in failed:
        step = str(e.get("step"))
        line = decisive_line(facts.step_logs.get(step, ""))
        out.append(Finding(
            "recorded-step-failed", "error",
            f"The last {step} step on this host failed (exit {e.get('exit')}, run "
            f"{e.get('run', '?')})" + (f": {line}" if line else "") + ".",
            f"The findings below name the cause where it is known; the step's whole log: "
            f"`gpu-provision -H {host} shell -- tail -n 50 ~/.gpu-provision/logs/{step}.log`. "
            f"Then `gpu-provision -H {host} bootstrap` runs it again (the steps done before it "
            f"are not redone)",
            f"host journal: {step} failed"))
    return out


def last_verdict(facts: HostFacts, report: Mapping[str, Any] | None, host: str) -> list[Finding]:
    """The last validation's verdict where it was not PASS, with its failing checks."""
    entry = facts.journal.get("verdict") or {}
    verdict = str(entry.get("result") or "")
    if verdict not in ("FAIL", "WARN"):
        return []
    checks = []
    if report and str(report.get("verdict")).upper() == verdict:
        checks = [f"{c.get('name')}: {c.get('reason')}" for c in report.get("checks", [])
                  if isinstance(c, Mapping) and str(c.get("status")).upper() == verdict]
        checks += [str(e) for e in report.get("errors", []) if verdict == "FAIL"]
    what = "; ".join(checks[:4]) if checks else "its failing checks are in the report"
    level = "error" if verdict == "FAIL" else "warning"
    return [Finding(
        "recorded-verdict", level,
        f"The last validation on this host says {verdict}: {what}.",
        f"The findings below name the cause where it is known; once it is fixed, "
        f"`gpu-provision -H {host} validate` measures again (the full report: "
        f"`gpu-provision -H {host} report`)",
        "host journal: verdict " + verdict)]


def recorded(facts: HostFacts | None, report: Mapping[str, Any] | None,
             host: str) -> list[Finding]:
    """The tool's own records of this host, failures first."""
    if facts is None:
        return []
    return failed_steps(facts, host) + last_verdict(facts, report, host)
