"""``report``'s evidence: its host script (templates/gpu/report.sh.j2) run here in bash on the
stand-in nvidia-smi and dmesg replaying a captured host, parsed, and written as the one file,
with every secret masked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from provision.jobs import report
from provision.jobs.spec import JobSpec
from provision.remote.command import MASK
from tests.unit.gpu_payload import FAKE, FIX, HOSTS

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123"


def _home(tmp: Path) -> Path:
    home = tmp / "home"
    state = home / ".gpu-provision"
    (state / "steps").mkdir(parents=True)
    (state / "steps" / "torch.json").write_text(json.dumps(
        {"step": "torch", "inputs": "ab12", "result": "ok", "exit": 0, "seconds": 61, "at": 1764680000,
         "run": "r1"}) + "\n")
    (state / "env").write_text(f"HF_TOKEN={TOKEN}\n")  # the pushed tokens: never read by the report
    jd = state / "jobs" / "t-1"
    jd.mkdir(parents=True)
    (jd / "spec.json").write_text(JobSpec("t-1", "t", ("python", "train.py", f"--token={TOKEN}")).spec_json())
    for name, text in (("name", "t"), ("started", "1000"), ("gpus", "0"), ("wrapper", "999999999"),
                       ("exit.json", '{"rc": 0, "ended": 1010}')):
        (jd / name).write_text(text + "\n")
    (jd / "log").write_text(f"export WANDB_API_KEY=0123456789abcdef0123\nusing {TOKEN}\n")
    return home


def _parts(tmp: Path, host: str) -> dict[str, str]:
    env = {"HOME": str(_home(tmp)), "PATH": f"{FAKE / 'bin'}:/usr/bin:/bin", "FAKE_SMI_DIR": str(HOSTS / host)}
    r = subprocess.run(["bash", "-c", report.script()], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return report.parse(r.stdout)


def test_the_report_holds_the_evidence_and_no_secret(tmp_path: Path) -> None:
    parts = _parts(tmp_path, "h100-xid79-ours")
    assert set(parts) == {"clock", "nvidia-smi-q", "kernel-log", "health", "journal", "jobs"}
    validation = json.loads((FIX / "8xh100-one-throttled.json").read_text())["measurements"]
    case = {"verdict": "WARN", "seconds": 84.2, "checks": [
        {"name": "gpu 5 speed", "status": "warn", "reason": "fp16 below the healthy floor"}],
        "measurements": {"env": {"HF_TOKEN": TOKEN}, "gpus": validation["gpus"][:1]}}
    facts = {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}], "driver": "590.48.01",
             "platform_env": {"RUNPOD_API_KEY": "rpa_0123456789ABCDEF"}}
    text = report.bundle("box", facts, case, parts, secrets=(TOKEN,), now=1764680400.0)
    assert text.startswith("# gpu-provision report: box\n")
    assert "- GPUs: NVIDIA H100 80GB HBM3; driver 590.48.01" in text
    assert "- last validation: WARN (84.2 s); gpu 5 speed: warn: fp16 below the healthy floor" in text
    assert "- GPU 0: 1 x Xid 79 (fell off the bus; hardware: the machine needs a reboot)" in text
    assert "- 4 Xid line(s) of GPUs that are not this host's (another tenant's)" in text
    assert "- torch: ok in 61 s (exit 0, 2025-12-02 12:53:20 UTC)" in text
    assert "NVRM: Xid (PCI:0000:a1:00): 79" in text  # the kernel log itself
    assert "    Product Name                                       : NVIDIA H100 80GB HBM3" in text
    # nothing secret: the pushed token, a key named like one, a value shaped like a token
    assert TOKEN not in text and "rpa_0123456789ABCDEF" not in text and "0123456789abcdef0123" not in text
    assert text.count(MASK) >= 3


def test_nvidia_smi_q_and_a_closed_kernel_log(tmp_path: Path) -> None:
    parts = _parts(tmp_path, "h100-sxm")  # no dmesg.txt: the kernel log is closed to this login
    assert parts["kernel-log"].startswith("not readable: dmesg: read kernel buffer failed")
    text = report.bundle("box", None, None, parts)
    assert "- the kernel log is not readable on this host (the platform's own logs hold the Xid lines)" in text
    assert "- last validation: none saved on this machine" in text


def test_masking_covers_the_usual_shapes() -> None:
    said = report.masked('{"api_key": "abc123xyz"} PASSWORD=hunter2 token: s3cr3t '
                         "ghp_0123456789abcdefghijABCDEFGHIJ AKIAABCDEFGHIJKLMNOP plain words", ())
    for secret in ("abc123xyz", "hunter2", "s3cr3t", "ghp_0123456789abcdefghijABCDEFGHIJ",
                   "AKIAABCDEFGHIJKLMNOP"):
        assert secret not in said
    assert said.endswith("plain words")
