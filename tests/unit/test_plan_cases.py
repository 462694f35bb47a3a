"""Plan decisions as data: each tests/cases/plan/*.yaml is captured facts + settings -> the
build chosen, the refusal, the risks and every decision with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cases import CASES, case_plan, expectation

FILES = sorted((CASES / "plan").glob("*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_plan_case(path: Path) -> None:
    case, plan = case_plan(path)
    got = expectation(plan)
    want = case["expect"]
    assert got["torch"] == want["torch"]
    assert got["blocked"] == want.get("blocked")
    assert got["risks"] == want.get("risks", [])
    assert got["decisions"] == want["decisions"]
    assert got.get("cannot", []) == want.get("cannot", [])
    if "disk" in want:  # the cases about the disk: what is fetched, where, and what is free
        assert got["disk"] == want["disk"]


def test_the_cases_cover_every_decision_kind() -> None:
    """Every step's no-op and every refusal appears in some case."""
    seen = {(d[0], d[1] == "none") for p in FILES for d in case_plan(p)[0]["expect"]["decisions"]}
    for step in ("driver", "secrets", "conda", "env", "torch", "packages", "validate"):
        assert (step, True) in seen and (step, False) in seen, step
    assert len(FILES) >= 40
    assert sum(bool(case_plan(p)[0]["expect"].get("blocked")) for p in FILES) >= 5
