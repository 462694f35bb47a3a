"""Decisions tested from case files: captured facts + settings -> the expected steps."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from provision.config.inventory import Target, settings_for
from provision.config.recipes import all_platforms, load_platform
from provision.facts.gather import markers_of
from provision.facts.host import HostFacts, parse_facts
from provision.setup.plan import Plan, make_plan

CASES = Path(__file__).resolve().parent
FACTS = CASES / "facts"


FIXTURES = CASES.parent / "fixtures"


def raw(name: str, probes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The captured facts document ``facts/<name>.json``, some probes replaced: each value an
    output text (exit code 0), or ``{"rc": N, "out": text}``, or ``{"rc": N, "fixture": path}``
    (a captured output under tests/fixtures/)."""
    doc: dict[str, Any] = json.loads((FACTS / f"{name}.json").read_text())
    for key, value in (probes or {}).items():
        if not isinstance(value, Mapping):
            value = {"rc": 0, "out": value}
        elif "fixture" in value:
            value = {"rc": value.get("rc", 0),
                     "out": (FIXTURES / value["fixture"]).read_text().rstrip("\n")}
        doc["probes"][key] = value
    return doc


def captured(name: str, probes: Mapping[str, Any] | None = None) -> HostFacts:
    return parse_facts(raw(name, probes), markers_of(all_platforms()))


@cache  # plans are frozen values: the tests that read a case share one
def case_plan(path: Path) -> tuple[dict[str, Any], Plan]:
    """A plan case file (tests/cases/plan/*.yaml) and the plan made from it.

    Keys: ``facts`` (a capture in facts/), ``probes`` (captured outputs replaced), ``inventory``
    (keys changed from the settings the capture was provisioned with; null removes one),
    ``cli`` (command-line overrides), ``push`` (tokens pushed: name -> value), ``revalidate``,
    ``later`` (the host's clock, seconds after the capture), ``done`` (steps the journal records
    as run with the inputs planned now), and ``expect`` (see test_plan_cases.py).
    """
    case: dict[str, Any] = yaml.safe_load(path.read_text())
    return case, plan_for(case, path.stem)


def plan_for(case: Mapping[str, Any], name: str) -> Plan:
    """The plan made from a case's inputs (see case_plan)."""
    probes = dict(case.get("probes") or {})
    if case.get("later"):  # the host's clock, some seconds after the capture
        now = float(raw(case["facts"])["probes"]["now"]["out"])
        probes["now"] = str(int(now + float(case["later"])))
    plan = _plan(case, name, probes)
    if case.get("done"):  # the journal records these steps as run, with the inputs planned now
        lines = [json.dumps({"step": s.name, "inputs": s.inputs, "result": "ok", "exit": 0,
                             "seconds": 1, "at": 0}) for s in plan.steps if s.name in case["done"]]
        journal = raw(case["facts"], probes)["probes"]["journal"]["out"]
        probes["journal"] = "\n".join([journal, *lines]).strip("\n")
        plan = _plan(case, name, probes)
    return plan


def _plan(case: Mapping[str, Any], name: str, probes: Mapping[str, Any]) -> Plan:
    facts = captured(case["facts"], probes)
    base = FACTS / f"{case['facts']}.inventory.yaml"
    inventory = yaml.safe_load(base.read_text()) if base.exists() else {}
    for key, value in (case.get("inventory") or {}).items():
        if value is None:
            inventory.pop(key, None)
        else:
            inventory[key] = value
    target = Target(name=name, host="198.51.100.7", settings=inventory)
    settings = settings_for(target, facts.platform, case.get("cli") or {})
    push = case.get("push") or {}
    return make_plan(target.name, facts, settings, load_platform(settings.platform), push,
                     "d1gest" if push else "", revalidate=bool(case.get("revalidate")))


def expectation(plan: Plan) -> dict[str, Any]:
    """What a case file's ``expect`` holds for ``plan``: the chosen build, the refusal, the
    risks, and every decision as [step, action, reason] ("none": nothing to do)."""
    out = {"torch": f"{plan.torch.torch}+{plan.torch.cuda}" if plan.torch else None,
           "blocked": plan.blocked, "risks": list(plan.risks),
           "decisions": [[d.step, d.action or "none", d.reason] for d in plan.decisions]}
    if plan.cannot:  # steps that need root the login cannot run (only where there are some)
        out["cannot"] = list(plan.cannot)
    if plan.fit is not None and plan.fit.needs:  # what it fetches, where, what is free there
        out["disk"] = plan.fit.summary()
    return out
