"""Match a host's state and error texts against the knowledge base of known failures.

The knowledge base (``provision/doctor/knowledge/<phase>.yaml``) is data: signatures, diagnoses,
fixes. This module reads it once, normalises the texts (log prefixes, quotes, wrapped lines),
finds each entry's signature and fills the diagnosis and fix with this host's words: the named
fact checks live in ``checks``, the host-specific parts of fixes in ``fixes`` (and
``fixes_env``, ``fixes_run``), what the host is in ``context``. Pure: no I/O but reading the
shipped YAML through ``files``.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from ..config.shipped import Traversable
from ..errors import ConfigError, ProvisionError, RemoteError
from ..facts.host import HostFacts
from .checks import CHECKS
from .context import HostView, Plan, common_values
from .files import KNOWLEDGE, read_yaml
from .fixes import SPECIFICS

__all__ = ["Entry", "Finding", "Plan", "diagnose", "explain", "load_knowledge", "normalise",
           "texts_for"]

LEVELS = ("error", "warning", "info")
_FIELDS = {"id", "level", "diagnosis", "fix", "match", "when", "group", "unless"}


@dataclass(frozen=True)
class Entry:
    id: str
    level: str
    diagnosis: str
    fix: str
    match: tuple[re.Pattern[str], ...] = ()
    when: tuple[str, ...] = ()
    group: str | None = None
    unless: tuple[re.Pattern[str], ...] = ()  # a match on a line holding one of these is skipped
    needs: tuple[tuple[str, ...] | None, ...] = ()  # per pattern: words one of which it needs


@dataclass(frozen=True)
class Finding:
    id: str
    level: str
    diagnosis: str
    fix: str
    evidence: str  # the matched line (and where), or the fact that holds

    def as_json(self) -> dict[str, str]:
        return {"id": self.id, "level": self.level, "diagnosis": self.diagnosis, "fix": self.fix,
                "evidence": self.evidence}


def _patterns(values: Any, path: Traversable, where: str) -> tuple[re.Pattern[str], ...]:
    try:
        return tuple(re.compile(m, re.IGNORECASE) for m in values or [])
    except re.error as exc:
        raise ConfigError(str(path), f"bad regular expression: {exc}", key=where) from None


def _entry(e: Any, path: Traversable, where: str) -> Entry:
    """One entry, checked: known fields, a level, a signature or a check, regexes that compile,
    checks that exist."""
    if not isinstance(e, dict) or not e.get("id"):
        raise ConfigError(str(path), "an entry is a mapping with an id", key=where)
    where = f"{where} ({e['id']})"
    extra = sorted(set(e) - _FIELDS)
    if extra:
        raise ConfigError(str(path), f"unknown field {extra[0]!r}", key=where)
    unknown = [w for w in e.get("when") or [] if w not in CHECKS]
    if unknown:
        raise ConfigError(str(path), f"unknown check {unknown[0]!r} (known: "
                          f"{', '.join(sorted(CHECKS))})", key=f"{where}.when")
    if e.get("level") not in LEVELS or not (e.get("match") or e.get("when")):
        raise ConfigError(str(path), f"level must be one of {', '.join(LEVELS)} and an "
                          "entry needs match or when", key=where)
    if not (isinstance(e.get("diagnosis"), str) and isinstance(e.get("fix"), str)):
        raise ConfigError(str(path), "diagnosis and fix are texts", key=where)
    match = _patterns(e.get("match"), path, f"{where}.match")
    return Entry(id=e["id"], level=e["level"], diagnosis=e["diagnosis"], fix=e["fix"],
                 match=match, when=tuple(e.get("when") or ()), group=e.get("group"),
                 unless=_patterns(e.get("unless"), path, f"{where}.unless"),
                 needs=tuple(required_words(p.pattern) for p in match))


def _branches(pattern: str) -> list[str]:
    """The top-level alternatives of a regular expression."""
    out, depth, start, i = [], 0, 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = _class_end(pattern, i)
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
        i += 1
    return [*out, pattern[start:]]


def _class_end(pattern: str, i: int) -> int:
    """The index of the ``]`` closing the character class that opens at ``i``."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j


def _longest_literal(branch: str) -> str:
    """The longest run of literal characters outside groups and classes, not quantified."""
    runs, run, depth, i = [], "", 0, 0
    while i < len(branch):
        c = branch[i]
        literal = None
        if c == "\\" and i + 1 < len(branch):
            nxt = branch[i + 1]
            literal = None if nxt.isalnum() else nxt
            i += 2
        elif c == "[":
            i = _class_end(branch, i) + 1
        elif c in "(":
            depth += 1
            i += 1
        elif c == ")":
            depth -= 1
            i += 1
        elif c in "?*+{":
            run = run[:-1]
            if c == "{":
                i = branch.find("}", i) + 1 or len(branch)
            else:
                i += 1
        elif c in ".^$|":
            i += 1
        else:
            literal = c
            i += 1
        if literal is not None and depth == 0:
            run += literal
        else:
            runs.append(run)
            run = ""
    runs.append(run)
    return max(runs, key=len)


def required_words(pattern: str) -> tuple[str, ...] | None:
    """Words (lower case) one of which any text the pattern matches contains, or None when
    every alternative cannot be reduced to one of four or more characters. A cheap test that
    spares the regular expression engine most texts."""
    words = [_longest_literal(b).lower() for b in _branches(pattern)]
    return tuple(words) if all(len(w) >= 4 for w in words) else None


@cache
def load_knowledge(paths: tuple[Traversable, ...] = KNOWLEDGE) -> tuple[Entry, ...]:
    """The entries of every file in order, checked; ids are unique across the files."""
    entries: list[Entry] = []
    seen: set[str] = set()
    for path in paths:
        raw = read_yaml(path) or {}
        for i, e in enumerate(raw.get("entries") or []):
            entry = _entry(e, path, f"entries[{i}]")
            if entry.id in seen:
                raise ConfigError(str(path), f"id {entry.id!r} is used twice", key=f"entries[{i}]")
            seen.add(entry.id)
            entries.append(entry)
    return tuple(entries)


# What a log line starts with before the message itself: the kernel's timestamps (dmesg,
# dmesg -T), syslog and journalctl prefixes, NVRM's tag (each line of a wrapped kernel message
# repeats it), torchrun's rank tag, CI timestamps and e-mail/Markdown quote marks.
_PREFIXES = re.compile(r"""(?x)^(?:
    \[\s*\d+\.\d+\]\s*                                               # [  12.345678]
  | \[\s*T\d+\]\s*                                                      # [ T1946] (thread id)
  | \[[A-Z][a-z]{2}\x20[A-Z][a-z]{2}\x20[\x20\d]\d\x20[\d:]{8}\x20\d{4}\]\s*  # dmesg -T
  | [A-Z][a-z]{2}\x20[\x20\d]\d\x20[\d:]{8}\x20\S+\x20[\w.@/-]+(?:\[\d+\])?:\s  # syslog
  | \d{4}-\d\d-\d\dT[\d:]{8}(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\x20\S+\x20[\w.@/-]+(?:\[\d+\])?:\s
  | \[\d{4}-\d\d-\d\dT[\d:.]+Z?\]\s*                                   # [2025-07-15T19:41:39.043Z]
  | kernel:\s
  | NVRM:\s
  | \[rank\d+\]:\s?
  | >\s?
)""")
_TYPOGRAPHIC = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'",
                              "\u2032": "'", "`": "'", "\u201c": '"', "\u201d": '"',
                              "\u201e": '"', "\u2033": '"', "\u00a0": " ", "\u200b": None,
                              "\ufeff": None})


def normalise(text: str) -> str:
    """The text as signatures see it, one message line per line.

    Log prefixes go (timestamps, syslog/journal, the ``NVRM:`` every line of a wrapped kernel
    message repeats, rank tags, quote marks), rsyslog's ``#012`` becomes the line break it
    stands for, typographic quotes and backticks become ASCII quotes, HTML entities are decoded,
    runs of spaces become one and empty lines are dropped. A message wrapped over several lines
    is matched on the same text with the line breaks as spaces (see ``_search``), which keeps
    every offset: position i is the same character in both.
    """
    text = html.unescape(text.replace("#012", "\n")).translate(_TYPOGRAPHIC)
    lines = []
    for raw in text.splitlines():
        line = raw.strip()
        while (m := _PREFIXES.match(line)) and m.end():
            line = line[m.end():].lstrip()
        line = " ".join(line.split())
        if line:
            lines.append(line)
    return "\n".join(lines)


def _line_at(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start:end if end >= 0 else None]


def _search(entry: Entry, views: Mapping[str, tuple[str, str, str]]) -> tuple[str, re.Match[str], str] | None:
    """The first signature of ``entry`` in the texts: each normalised text line by line, then
    with its lines joined (a wrapped message); a pattern that spells out ``\\n`` is about
    lines and is tried on the lines only. A match on a line that holds one of the entry's
    ``unless`` patterns does not count. Returns the source, the match and the text."""
    for source, (lines, joined, lowered) in views.items():
        for pattern, needs in zip(entry.match, entry.needs, strict=True):
            if needs is not None and not any(w in lowered for w in needs):
                continue
            for text in (lines, joined) if "\\n" not in pattern.pattern else (lines,):
                for n, m in enumerate(pattern.finditer(text)):
                    if not entry.unless or not any(u.search(_line_at(lines, m.start()))
                                                   for u in entry.unless):
                        return source, m, lines
                    if n >= 50:
                        break
    return None


def _line_of(text: str, m: re.Match[str]) -> str:
    """The normalised line(s) holding the match, shortened to 200 characters."""
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", max(m.end() - 1, m.start()))
    found = text[start:end if end >= 0 else None].replace("\n", " ").strip()
    return found if len(found) <= 200 else found[:97] + " ... " + found[-98:]


def explain(exc: ProvisionError) -> ProvisionError:
    """A failed step's error with the known failure its output shows in front of its fix;
    any other error as it is. Called where an error is reported, never by the engine."""
    if not isinstance(exc, RemoteError) or not exc.diagnosable:
        return exc
    known = diagnose({f"step {exc.step}": exc.output}, host=exc.host)
    if not known:
        return exc
    first = known[0]
    return exc.explained(f"{first.diagnosis} (seen: {first.evidence.split(': ', 1)[-1]}) "
                         f"{first.fix}")


def diagnose(texts: Mapping[str, str], facts: HostFacts | None = None, plan: Plan | None = None,
             host: str = "<host>") -> list[Finding]:
    """Every entry whose signature is in ``texts`` (source -> text) and whose checks hold on
    ``facts``; entries with checks need facts. Ordered errors first."""
    findings: list[Finding] = []
    taken: set[str] = set()
    views = {}
    for source, text in texts.items():
        lines = normalise(text)
        joined = lines.replace("\n", " ")
        views[source] = (lines, joined, joined.lower())
    where = HostView(host, facts, plan)
    common = common_values(where)
    for entry in load_knowledge():
        if entry.group and entry.group in taken:
            continue
        values: dict[str, str] = dict(common)
        evidence = matched = ""
        if entry.match:
            hit = _search(entry, views)
            if hit is None:
                continue
            source, m, matched = hit
            values.update({k: v for k, v in m.groupdict().items() if v is not None})
            evidence = f"{source}: {_line_of(matched, m)}"
        if entry.when:
            if facts is None:
                continue
            provided = [CHECKS[w](facts) for w in entry.when]
            if any(p is None for p in provided):
                continue
            for p in provided:
                values.update(p or {})
            evidence = evidence or "facts: " + ", ".join(entry.when)
        more = SPECIFICS.get(entry.id)
        if more is not None:
            values.update(more(values, where, matched))
        # a host-specific reading may replace the entry's words (a cross-check with the facts
        # that clears the component the entry blames)
        diagnosis = values.pop("__diagnosis__", None) or entry.diagnosis
        findings.append(Finding(entry.id, entry.level, _fill(diagnosis, values),
                                _fill(entry.fix, values), evidence))
        if entry.group:
            taken.add(entry.group)
    return sorted(findings, key=lambda f: LEVELS.index(f.level))


def _fill(text: str, values: Mapping[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), text)


def texts_for(facts: HostFacts | None, report: Mapping[str, Any] | None = None,
              local_logs: Mapping[str, str] | None = None,
              files: Mapping[str, str] | None = None) -> dict[str, str]:
    """Everything doctor reads, keyed by where it came from (named in the evidence)."""
    texts: dict[str, str] = {}
    if facts is not None:
        if facts.nvidia_output:
            texts["nvidia-smi"] = facts.nvidia_output
        texts.update({f"host log {k}": v for k, v in facts.step_logs.items()})
    if report:
        texts["last validation"] = "\n".join(
            f"{c.get('name')}: {c.get('status')}: {c.get('reason')}"
            for c in report.get("checks", []) if isinstance(c, Mapping)) + "\n" + "\n".join(
            str(e) for e in report.get("errors", []))
    texts.update(local_logs or {})
    texts.update(files or {})
    return texts


def headline(findings: Sequence[Finding]) -> str | None:
    """One line for a list of findings (a failed job's): the first error's diagnosis, up to
    the end of its first sentence and at most 160 characters; None when nothing was found."""
    first = next((f for f in findings if f.level == "error"), findings[0] if findings else None)
    if first is None:
        return None
    text = re.split(r"(?<=[.!?])\s+(?=[A-Z(])", first.diagnosis, maxsplit=1)[0].rstrip(".")
    if len(text) > 160:
        text = text[:157].rsplit(" ", 1)[0] + "..."
    return f"{text} ({first.id})"
