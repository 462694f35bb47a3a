"""``report``: one file a platform's support can act on (a refund request carries evidence):
the facts, the last validation report, `nvidia-smi -q`, the kernel log's NVIDIA and Xid lines
(ours classified by NVIDIA's catalog), each job's health from start to end, the journal's step
timings; every secret masked. The host's part is ONE read-only execution
(templates/gpu/report.sh.j2); here it is parsed and written as text. It sits with the jobs: most
of its evidence is theirs (records, health), the facts and the validation come in as values."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..remote.command import MASK, mask
from ..remote.templating import render
from .health import job_health, parse_snapshot, xid_rules
from .state import parse_records

MARKER = "==gpu-provision-report=="
# names whose values are secrets wherever they appear (JSON keys, KEY=value, "key: value")
SECRET_NAME = (r"[A-Za-z0-9_.-]*(?:token|secret|passw(?:or)?d|api[_-]?key|access[_-]?key|auth|credential|"
               r"cookie)[A-Za-z0-9_.-]*")
SECRET_PAIR = re.compile(rf"(?i)(\"?{SECRET_NAME}\"?\s*[:=]\s*)(\"[^\"]*\"|'[^']*'|[^\s,}}]+)")
# the shapes of well-known tokens: Hugging Face, GitHub, OpenAI-style, AWS access keys, Slack, JWTs
TOKEN = re.compile(r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|"
                   r"sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|xox[abpr]-[A-Za-z0-9-]{10,}|"
                   r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})\b")


def script() -> str:
    return render("gpu/report.sh.j2", marker=MARKER)


def parse(text: str) -> dict[str, str]:
    """The script's output -> {part: its text}."""
    parts: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(MARKER + " "):
            current = parts.setdefault(line[len(MARKER) + 1:].strip(), [])
        elif current is not None:
            current.append(line)
    return {k: "\n".join(v) for k, v in parts.items()}


def masked(text: str, secrets: Sequence[str]) -> str:
    """Every known secret value (the pushed tokens), every value named like a secret, and every
    string shaped like a well-known token, replaced with the mask."""
    text = mask(text, secrets)
    text = SECRET_PAIR.sub(lambda m: m.group(1) + (f'"{MASK}"' if m.group(2).startswith('"') else MASK), text)
    return TOKEN.sub(MASK, text)


def _timings(journal: str) -> list[str]:
    rows = []
    for line in journal.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict):
            at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(e.get("at") or 0)))
            rows.append(f"- {e.get('step')}: {e.get('result')} in {e.get('seconds')} s "
                        f"(exit {e.get('exit')}, {at} UTC)")
    return rows


def _xid_summary(parts: Mapping[str, str]) -> list[str]:
    snap = parse_snapshot(parts.get("health", "").strip())
    if snap is None:
        return ["- not read"]
    if not snap.dmesg:
        return ["- the kernel log is not readable on this host (the platform's own logs hold the Xid lines)"]
    rules = xid_rules()
    out = [f"- {rules.says(snap.xid)}"] if snap.xid else ["- no Xid line of these GPUs in the kernel log"]
    if snap.others:
        out.append(f"- {snap.others} Xid line(s) of GPUs that are not this host's (another tenant's)")
    return out


def bundle(host: str, facts: Mapping[str, Any] | None, validation: Mapping[str, Any] | None,
           parts: Mapping[str, str], secrets: Sequence[str] = (), now: float | None = None) -> str:
    """The report's text, secrets masked."""
    at = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now))
    listed = parse_records(parts.get("jobs", ""), host, host_boot="")
    gpus = ", ".join(str(g.get("name")) for g in (facts or {}).get("gpus") or []) or "none"
    lines = [f"# gpu-provision report: {host}", "", f"written {at}; the host's clock: "
             + "; ".join(parts.get("clock", "").splitlines()), "",
             "## Summary", "", f"- GPUs: {gpus}; driver {(facts or {}).get('driver')}",
             "- last validation: " + (f"{validation.get('verdict')} ({validation.get('seconds')} s); "
                                      + "; ".join(f"{c['name']}: {c['status']}: {c['reason']}"
                                                  for c in validation.get("checks", [])
                                                  if c.get("status") != "pass")
                                      if validation else "none saved on this machine"), "",
             "## Xid events", "", *_xid_summary(parts), "", "## Health through each job", ""]
    health = [f"- job {j.id} ({j.label}): {line}" for j in listed.jobs for line in job_health(j.health)]
    lines += health or ["- no job recorded a change"]
    lines += ["", "## Timings (the host's journal)", "", *(_timings(parts.get("journal", "")) or ["- none"]),
              "", "## Facts", "", "```json", json.dumps(facts, indent=1, default=str), "```", "",
              "## Last validation", "", "```json", json.dumps(validation, indent=1, default=str), "```", "",
              "## nvidia-smi -q", "", "```", parts.get("nvidia-smi-q", "(not read)"), "```", "",
              "## Kernel log (NVIDIA lines)", "", "```", parts.get("kernel-log", "(not read)"), "```", "",
              "## Jobs", "", "```", parts.get("jobs", ""), "```", ""]
    return masked("\n".join(lines), secrets)
