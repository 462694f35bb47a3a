"""The program's surface: `fab -l` in the checkout and the installed `gpu-provision`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_fab_lists_tasks_in_the_checkout() -> None:
    r = subprocess.run([str(BIN / "fab"), "-l"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    names = {line.split()[0] for line in r.stdout.splitlines()[1:] if line.startswith("  ")}
    assert {"facts", "plan", "pick", "refresh-compat", "repin", "forget-host-key", "doctor"} <= names


def test_console_script_carries_the_same_tasks(tmp_path: Path) -> None:
    r = subprocess.run([str(BIN / "gpu-provision"), "-l"], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert "facts" in r.stdout and "pick" in r.stdout and "plan" in r.stdout
    assert subprocess.run([str(BIN / "gpu-provision"), "-V"], capture_output=True,
                          text=True).stdout.startswith("gpu-provision")


def test_host_task_without_host_says_so(tmp_path: Path) -> None:
    r = subprocess.run([str(BIN / "gpu-provision"), "facts"], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 2  # a usage error
    assert r.stderr == "error: this task needs a host: -H <inventory name | user@host:port>\n"


def test_bad_inventory_on_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "box.yaml").write_text("host: 1.2.3.4\nprot: 22\n")
    r = subprocess.run([str(BIN / "gpu-provision"), "-H", "box", "facts"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"error: {tmp_path}/inventories/box.yaml:2: prot: unknown key "
                                "(allowed: cuda_compat, currency, data_dir, domain_libraries, "
                                "env_name, gpu, host, key, miniconda_sha256, miniconda_version, "
                                "mirrors, notes, packages, password_env, platform, port, "
                                "price_per_hour, push_env, python, recipe, torch, user)")


def test_doctor_offline_on_an_error_text(tmp_path: Path) -> None:
    fixture = ROOT / "tests/fixtures/torch/err-not-compiled-cuda-detectron2-linux.txt"
    r = subprocess.run([str(BIN / "gpu-provision"), "doctor", "--log", str(fixture), "--json"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    [finding] = json.loads(r.stdout)
    assert finding["id"] == "torch-cpu-build" and "--index-url" in finding["fix"]
    clean = tmp_path / "ok.txt"
    clean.write_text("Epoch 3: loss 0.21\n")
    r = subprocess.run([str(BIN / "gpu-provision"), "doctor", "--log", str(clean)], cwd=tmp_path,
                       capture_output=True, text=True)
    assert (r.returncode, r.stdout.strip()) == (0, "doctor: <host>: no known problem found")
    r = subprocess.run([str(BIN / "gpu-provision"), "doctor", "--log", "missing.txt"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 1 and "--log missing.txt: cannot read it (No such file or directory)" in r.stderr
