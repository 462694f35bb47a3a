"""bench/device_check.sh on this CPU machine: the facts part runs for real without Fabric, and
validate/bench, run with a python that has no torch, fail cleanly into JSON that says so."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from provision.config.recipes import all_platforms
from provision.facts.gather import markers_of
from provision.facts.host import parse_facts

REPO = Path(__file__).resolve().parent.parent.parent
SCRIPT = REPO / "bench" / "device_check.sh"
FILES = {"facts-stdout.json", "facts.json", "validate-stdout.txt", "validate.json",
         "bench-stdout.txt", "bench.json", "summary.json", "fit-measure.json"}


def _run(out: Path, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The script with this venv's python (no torch) and Fabric, paramiko and invoke made
    unimportable, as on the device, whose python3 has none of them."""
    blocked = tmp / "no-fabric"
    blocked.mkdir(exist_ok=True)
    for name in ("fabric", "paramiko", "invoke"):
        (blocked / f"{name}.py").write_text(f'raise ImportError("no {name} on this machine")\n')
    return subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "PYTHON": sys.executable,
                                            "PYTHONPATH": str(blocked), "TMPDIR": str(tmp), **env})


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    tmp = tmp_path_factory.mktemp("device-check")
    return _run(tmp / "out", tmp), tmp / "out"


def test_it_writes_the_files_the_device_tool_brings_back(
        checked: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    result, out = checked
    assert result.returncode == 0, result.stdout + result.stderr
    files = list(out.iterdir())
    assert {f.name for f in files} == FILES and len(files) <= 8
    assert all(f.is_file() and re.fullmatch(r"[A-Za-z0-9._-]+", f.name)
               and f.stat().st_size < 16 << 20 for f in files)
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["facts", "nccl", "validate", "sustained", "bench",
                                                      "fit-measure"]
    assert all(" done (rc 0, " in line for line in lines[:5])
    assert "verdict FAIL; no GPU was loaded; torch import: import torch failed" in lines[3]
    # fit --measure's hook needs a GPU: on this machine its block says so and fails nothing
    assert lines[5].startswith("fit-measure: skipped (rc 0, ") and "needs one" in lines[5]
    assert json.loads((out / "fit-measure.json").read_text())["small"] == {"gpu": False,
                                                                        "runs": []}


def test_facts_are_our_facts_script_and_parser(
        checked: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = checked
    raw = json.loads((out / "facts-stdout.json").read_text())
    assert raw["v"] == 1 and "smi_query" in raw["probes"]
    parsed = json.loads(json.dumps(parse_facts(raw, markers_of(all_platforms())).as_json(),
                                   default=str))
    assert json.loads((out / "facts.json").read_text()) == parsed
    assert parsed["kernel"] == os.uname().release


def test_without_torch_validate_and_bench_fail_cleanly(
        checked: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = checked
    validate = json.loads((out / "validate.json").read_text())
    assert validate["verdict"] == "FAIL" and validate["torch"] is None
    assert validate["checks"][0]["name"] == "torch import"
    assert validate["checks"][0]["status"] == "fail"
    # the step prints its result into its log too, as on a host
    assert json.loads((out / "validate-stdout.txt").read_text().splitlines()[-1]) == validate
    bench = json.loads((out / "bench.json").read_text())
    assert bench["torch"] is None and bench["downloads"] == []
    assert any("import torch failed" in n for n in bench["notes"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] is True
    assert {k: v["rc"] for k, v in summary["parts"].items()} == {
        "facts-render": 0, "facts": 0, "facts-parse": 0, "render-steps": 0, "nccl": 0,
        "validate": 0, "sustained": 0, "bench": 0}
    assert summary["sustained"]["verdict"] == "FAIL" and summary["sustained"]["measured"] == {}
    # no GPU in the facts: NCCL's start-up check is skipped, and says so
    assert summary["parts"]["nccl"]["result"] == {"skipped": "no GPU in the facts"}


def test_a_part_past_its_limit_is_recorded_and_the_others_still_run(tmp_path: Path) -> None:
    result = _run(tmp_path / "out", tmp_path, BENCH_TIMEOUT="0.01")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("facts: done") and lines[2].startswith("validate: done")
    assert lines[4].startswith("bench: FAILED (rc 124, ")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ok"] is False and summary["parts"]["bench"]["rc"] == 124
    assert not (tmp_path / "out" / "bench.json").exists()
    assert (tmp_path / "out" / "validate.json").exists()


def test_it_needs_an_output_folder(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env,
                            timeout=30)
    assert result.returncode == 2 and "usage:" in result.stderr


def test_every_limit_together_fits_one_device_call() -> None:
    """The parts' limits and each one's kill grace, at their defaults, stay inside the device
    tool's 600 s for one call, so even a run where every part hangs returns its summary."""
    text = SCRIPT.read_text()
    grace = int(re.search(r"timeout -k (\d+) ", text).group(1))  # type: ignore[union-attr]
    limits = [int(n) for n in re.findall(r"^\s*run [a-z-]+ (?:\"\$\{[A-Z_]+:-)?(\d+)", text, re.M)]
    assert len(limits) == 9
    assert sum(limits) + grace * len(limits) < 600, (limits, grace)
