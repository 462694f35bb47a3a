"""Which mirror each download of a plan will use: every listed mirror asked once from the host.

`plan` asks each mirror the plan's downloads will ask (the same request the step makes first:
the index page, or a HEAD of a tool's archive), all at once in one more remote execution after
the facts (the mirrors are known only once the facts named the platform), bounded by
``mirrors.timeout``. What each answered is said in the mirror's own words (``refused``,
``HTTP 404``, ``not an index: text/html "Please sign in..."``), with the one each download will
use: the first that answered as asked, as the steps themselves choose (templates/setup/
_first_mirror.sh.j2). A dead mirror shows here, not ten minutes into a bootstrap.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..config.recipes import TOOLS
from ..ops.conda import configured_pypi
from ..ops.tools import load_tools
from ..remote.templating import render
from .plan import Decision, Plan

if TYPE_CHECKING:
    from ..remote.executor import Executor


@dataclass(frozen=True)
class Probe:
    url: str  # the mirror as listed (for torch: its index of the variant)
    path: str  # what is asked of it: an index page ("pip/", "cpu/torch/", "") or a file
    want: str  # the index must list files named <want>-*
    file: bool = False  # a HEAD of a file, not an index page


@dataclass(frozen=True)
class Download:
    what: str  # what the step fetches: "Miniconda", "torch", "the recipe's packages", "ollama"
    kind: str  # mirrors.<kind>
    probes: tuple[Probe, ...]  # one per listed mirror, in order
    answers: tuple[str, ...] = ()  # "ok" or what each did, in the same order

    @property
    def pairs(self) -> list[tuple[Probe, str]]:
        """Each probe with what its mirror answered (once answered)."""
        return list(zip(self.probes, self.answers, strict=True))

    @property
    def used(self) -> str | None:
        """The mirror the download will use: the first that answered as asked."""
        return next((p.url for p, a in self.pairs if a == "ok"), None)

    @property
    def said(self) -> str:
        return "; ".join(f"{p.url} {a}" for p, a in self.pairs)

    def line(self) -> str:
        used = self.used
        return f"{self.said}: {self.what} from {used}" if used else \
            f"{self.said}: no listed mirror serves {self.what}"

    def as_json(self) -> dict[str, Any]:
        return {"download": self.what, "kind": self.kind, "used": self.used,
                "mirrors": [{"url": p.url, "answer": a} for p, a in self.pairs]}


def downloads(plan: Plan) -> list[Download]:
    """What the plan's changing steps will download, and from which listed mirrors."""
    m = plan.settings.mirrors
    changing = {s.name for s in plan.steps if s.changes}
    out: list[Download] = []

    def index(what: str, kind: str, urls: tuple[str, ...], path: str, want: str) -> None:
        out.append(Download(what, kind, tuple(Probe(u.rstrip("/"), path, want) for u in urls)))

    if "conda" in changing:
        index("Miniconda", "miniconda", m.miniconda, "", "Miniconda3")
    if "torch" in changing and plan.torch is not None:
        variant = plan.torch.cuda
        index(f"{plan.torch.label}", "pytorch",
              tuple(f"{b.rstrip('/')}/{variant}" for b in m.pytorch), "torch/", "torch")
    if "packages" in changing or ("conda" in changing and configured_pypi(plan.settings)):
        index("the recipe's packages" if "packages" in changing else "pip.conf's index", "pypi",
              m.pypi, "pip/", "pip")
    machine = (plan.facts.arch if plan.facts else None) or "x86_64"
    for name in TOOLS:
        archives = load_tools()[name].archives(machine)
        if name in changing and archives:
            out.append(Download(name, name, tuple(Probe(b.rstrip("/"), archives[0].name, "",
                                                        file=True)
                                                  for b in getattr(m, name))))
    return out


def parse_answers(text: str, count: int) -> list[str]:
    """``N<TAB>answer`` lines -> the answers by N; a probe that printed nothing did not end."""
    got: dict[int, str] = {}
    for line in text.splitlines():
        n, sep, answer = line.partition("\t")
        if sep and n.isdigit():
            got[int(n)] = answer
    return [got.get(i, "no answer (the probe did not end)") for i in range(count)]


def probe_script(probes: list[Probe], timeout: int) -> str:
    return render("setup/mirror_probe.sh.j2", probes=probes, mirror_timeout=timeout)


def probed(ex: Executor, plan: Plan) -> Plan:
    """``plan`` with a ``mirrors`` decision per download saying what each listed mirror
    answered and which one it will use, and a risk for a download no mirror serves. One remote
    execution; none where the plan downloads nothing (or is blocked: it runs nothing)."""
    wanted = downloads(plan) if plan.blocked is None else []
    if not wanted:
        return plan
    unique = list(dict.fromkeys(p for d in wanted for p in d.probes))
    answers = ex.query("mirrors", probe_script(unique, plan.settings.mirrors.timeout),
                       lambda out: parse_answers(out, len(unique)), what="the mirrors' probe",
                       reads_only=True)
    by = dict(zip(unique, answers, strict=True))
    done = [replace(d, answers=tuple(by[p] for p in d.probes)) for d in wanted]
    risks = tuple(f"no listed {d.kind} mirror serves {d.what} ({d.said}): "
                  f"set mirrors.{d.kind} to one that works" for d in done if d.used is None)
    return replace(plan, decisions=(*plan.decisions,
                                    *(Decision("mirrors", None, f"{d.kind}: {d.line()}")
                                      for d in done)),
                   risks=(*plan.risks, *risks), mirrors=tuple(d.as_json() for d in done))
