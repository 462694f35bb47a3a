"""``report`` over SSH on a sandbox host with a stand-in H200 (its nvidia-smi replays captures,
tests/sandbox/profiles/h200.yaml): one file with the facts, nvidia-smi -q, the kernel log's
part, the journal's timings and the jobs, and the pushed token masked wherever it appears."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision.remote.command import MASK
from tests.conftest import Hosts, gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox
TOKEN = "hf_sandboxTOKENabcdefghijklmnop0123"


def test_report_writes_the_evidence_with_the_token_masked(hosts: Hosts, gp_home: Path,
                                                          tmp_path: Path) -> None:
    info = hosts.fresh("h200")
    try:
        state = info.path("/root/.gpu-provision")
        (state / "steps").mkdir(parents=True, exist_ok=True)
        (state / "steps" / "torch.json").write_text(json.dumps(
            {"step": "torch", "inputs": "x", "result": "ok", "exit": 0, "seconds": 93, "at": 1764680000,
             "run": "r"}) + "\n")
        jd = state / "jobs" / "train-1"
        jd.mkdir(parents=True)
        for name, text in (("name", "train"), ("started", "1764680100"), ("gpus", "0"),
                           ("spec.json", json.dumps({"id": "train-1", "name": "train", "argv": ["python"]})),
                           ("exit.json", '{"rc": 0, "ended": 1764680200}'), ("log", f"login with {TOKEN}")):
            (jd / name).write_text(text + "\n")
        inv = info.inventory_with(tmp_path / "box.yaml", push_env=["HF_TOKEN"])
        r = gpu_provision("-H", inv, "report", "--json", home=gp_home, cwd=tmp_path,
                          env={"HF_TOKEN": TOKEN}, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        said = json.loads(r.stdout)
        assert said["parts"] == ["clock", "health", "jobs", "journal", "kernel-log", "nvidia-smi-q"]
        text = Path(said["path"]).read_text()
        assert Path(said["path"]).parent.parent == tmp_path / "reports"
        assert "    Product Name                                       : NVIDIA H200" in text
        assert "- torch: ok in 93 s (exit 0, 2025-12-02 12:53:20 UTC)" in text
        assert "job train-1" in text and "- GPUs: NVIDIA H200; driver 590.48.01" in text
        assert TOKEN not in text and f"login with {MASK}" in text
    finally:
        harness.stop(info.id)
