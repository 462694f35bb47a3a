"""What the user reads, rendered to a buffer and compared with a snapshot (tests/snapshots/).

The inputs are captured facts, plan case files, constructed validation measurements judged by
the real judge, real doctor findings and the published bench reports. After a deliberate change
of the output, regenerate with GPU_PROVISION_UPDATE_SNAPSHOTS=1 and review the diff.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from provision.config.minimums import KEYS as MINIMUM_KEYS
from provision.config.shipped import templates_dir
from provision.doctor.match import diagnose
from provision.money.compare import resolve_sort, rows, sort_title
from provision.ops.validate import read_validation
from provision.setup import show
from provision.setup.engine import Applied, StepRecord
from provision.ui import console as output
from provision.wheels.rule import choose_torch
from tests.cases import CASES, captured, case_plan

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "tests" / "snapshots"
FIXTURES = ROOT / "tests" / "fixtures"


def rendered(draw: Callable[[Console], None], width: int = 100) -> str:
    buf = io.StringIO()
    draw(Console(file=buf, width=width, color_system=None, force_terminal=False,
                 highlight=False, soft_wrap=True))
    return buf.getvalue()


def check(name: str, text: str) -> None:
    path = SNAPSHOTS / f"{name}.txt"
    if os.environ.get("GPU_PROVISION_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no snapshot {path}: run with GPU_PROVISION_UPDATE_SNAPSHOTS=1"
    assert text == path.read_text()


def judged(fixture: str) -> dict[str, object]:
    """A validation report: the fixture's measurements through validate_gpu.py's own judge,
    then the recipe's minimums judged on them as the provisioner does (read_validation)."""
    spec = importlib.util.spec_from_file_location("validate_gpu", str(templates_dir() / "gpu/validate_gpu.py"))
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    case = json.loads((FIXTURES / "validation" / fixture).read_text())
    need = {k: v for k, v in case["config"]["thresholds"].items() if k in MINIMUM_KEYS}
    outcome = read_validation(mod.report(case["measurements"], case["config"], 41.2), need)
    assert outcome.report is not None
    return dict(outcome.report)


@pytest.mark.parametrize("capture", ["h200", "autodl-bootstrapped", "ubuntu-20.04-nodriver"])
def test_facts_table(capture: str) -> None:
    check(f"facts-{capture}", rendered(lambda c: output.facts_table(capture, captured(capture), out=c)))


@pytest.mark.parametrize("case", ["cpu-fresh", "rtx4090-550-torch-2.8-minor-compat",
                                  "kepler-nodriver-refused", "cpu-bootstrapped-noop"])
def test_plan_table(case: str) -> None:
    plan = case_plan(CASES / "plan" / f"{case}.yaml")[1]
    check(f"plan-{case}", rendered(lambda c: show.plan_table(plan, out=c)))


def test_choice_text() -> None:
    choice = choose_torch(driver="550.54.14", compute_caps=["8.9"], python="3.10")
    check("pick-550-sm89-py310", rendered(lambda c: output.choice_text(choice, out=c)))


@pytest.mark.parametrize("fixture", ["rtx4090-healthy.json", "rtx4090-throttled.json",
                                     "a100-advertised-as-h100.json"])
def test_verdict_table(fixture: str) -> None:
    report = judged(fixture)
    check(f"verdict-{fixture.removesuffix('.json')}", rendered(
        lambda c: output.verdict_table("box", report, "reports/box/validate-20261201-120000.json",
                                       out=c)))


def test_every_verdict_ends_with_the_next_command() -> None:
    passed = rendered(lambda c: output.next_steps("box", judged("rtx4090-healthy.json"), out=c))
    assert passed.strip() == ("next: gpu-provision -H box run -- python train.py; gpu-provision "
                              "-H box shell; or gpu-provision -H box ssh-config, then plain ssh")
    failed = {"verdict": "FAIL", "checks": [
        {"name": "torch", "status": "pass", "reason": ""},
        {"name": "cuda available", "status": "fail", "reason": "no libcuda.so.1 on this host"}]}
    said = rendered(lambda c: output.next_steps("box", failed, out=c))
    assert said.strip() == ("next: gpu-provision -H box doctor (it starts from the failing "
                            "check: cuda available)")


def test_steps_table() -> None:
    applied = Applied(host="box", steps=[StepRecord("driver", "ok", 61.2),
                                         StepRecord("reboot", "ok", 48.0),
                                         StepRecord("conda", "skipped", 0.0),
                                         StepRecord("torch", "ok", 171.9)], executions=6)
    check("steps", rendered(lambda c: show.steps_table(applied, out=c)))


def test_findings_table() -> None:
    text = (FIXTURES / "nvidia-smi" / "fail-nvml-mismatch-550.144.txt").read_text()
    findings = diagnose({"traceback.txt": text}, host="box")
    check("doctor-nvml-mismatch", rendered(lambda c: output.findings_table("box", findings, out=c)))
    check("doctor-nothing", rendered(lambda c: output.findings_table("box", [], out=c)))


def test_compare_table() -> None:
    reports = [(str(p), json.loads(p.read_text()))
               for p in sorted((ROOT / "bench" / "published").glob("*.json"))]
    table = rows(reports, lambda r: (r.get("price_per_hour"), r.get("currency")))
    notes = sorted({str(r["published"]) for _, r in reports if r.get("published")})
    # published figures have no training throughput: the sort says it used the TFLOP-hour
    title = f"compare: value for money, {sort_title(resolve_sort(table, 'auto'))}"
    assert title == "compare: value for money, sorted by per TFLOP-hour, cheapest first"
    check("compare-published", rendered(lambda c: output.compare_table(table, notes, out=c,
                                                                       title=title), 160))
