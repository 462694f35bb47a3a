"""doctor on real error texts: each case (tests/fixtures/errors/cases/<phase>.yaml) is machine
output copied from a public issue or Q&A thread, with the entry it must give and the action that
thread's resolution confirmed; the fix doctor prints has to name that action. Clean output from
working runs gives no finding."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from provision.doctor.match import diagnose, load_knowledge

FIX = Path(__file__).resolve().parent.parent / "fixtures"
CASES = FIX / "errors" / "cases"
PHASES = ("gpu", "installing", "importing", "building", "training", "data")


def _load(name: str) -> list[dict[str, Any]]:
    cases = yaml.safe_load((CASES / f"{name}.yaml").read_text(encoding="utf-8"))
    assert isinstance(cases, list)
    return cases


ALL = [(phase, i, c) for phase in PHASES for i, c in enumerate(_load(phase))]


@pytest.mark.parametrize("case", [pytest.param(c, id=f"{p}-{i}-{c['entry']}") for p, i, c in ALL])
def test_a_real_text_gives_its_entry_and_the_confirmed_fix(case: dict[str, Any]) -> None:
    findings = diagnose({"log": case["text"]})
    mine = [f for f in findings if f.id == case["entry"]]
    assert mine, f"{case['source']}: got {[f.id for f in findings]}"
    assert re.search(str(case["confirmed"]), mine[0].fix, re.IGNORECASE), \
        f"{case['source']}: the fix does not name /{case['confirmed']}/: {mine[0].fix}"


def test_every_case_cites_a_public_thread() -> None:
    for _, _, c in ALL:
        assert re.match(r"https://(github\.com|stackoverflow\.com|discuss\.|forums\.)", c["source"])
        assert c["text"].strip() and len(c["text"]) < 6000


def _ids_in_fixture_files() -> set[str]:
    """Entries the single-text fixtures (nvidia-smi/, torch/, errors/<kind>/) give."""
    found: set[str] = set()
    for path in [*FIX.glob("nvidia-smi/*.txt"), *FIX.glob("torch/*.txt"),
                 *FIX.glob("errors/*/*.txt")]:
        found.update(f.id for f in diagnose({"f": path.read_text(encoding="utf-8")}))
    return found


# gpu-provision's own messages (tested where they are raised), not texts from elsewhere
OWN = {"torch-mirror-lacks", "mirror-unreachable", "host-locked"}


def test_every_signature_entry_has_a_real_text() -> None:
    """Each entry with a signature is exercised by at least one real text: a case or a fixture
    file. Entries that also need fact checks are tested with facts in test_doctor.py."""
    covered = {c["entry"] for _, _, c in ALL} | _ids_in_fixture_files() | OWN
    lacking = [e.id for e in load_knowledge() if e.match and not e.when and e.id not in covered]
    assert lacking == []


def test_the_knowledge_covers_every_phase_with_many_entries() -> None:
    entries = load_knowledge()
    assert len(entries) >= 200
    assert len({e.id for e in entries}) == len(entries)


SILENT = _load("silent")


@pytest.mark.parametrize("case", [pytest.param(c, id=f"silent-{i}") for i, c in enumerate(SILENT)])
def test_clean_output_gives_no_finding(case: dict[str, Any]) -> None:
    assert diagnose({"log": case["text"]}) == [], case["source"]


def test_all_clean_output_together_gives_no_finding() -> None:
    assert diagnose({"log": "\n".join(c["text"] for c in SILENT)}) == []
