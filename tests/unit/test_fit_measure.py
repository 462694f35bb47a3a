"""fit --measure: the line through recorded peaks and its prediction, and the startup hook
that records torch's peak in a real Python process."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from provision.errors import ProvisionError, UsageError
from provision.fit.measure import (
    Point,
    Run,
    batch_sizes,
    check_command,
    fit_line,
    measure_step,
    needs_gpu,
    predict,
    read_runs,
)

ROOT = Path(__file__).resolve().parent.parent.parent


def test_recorded_peaks_predict_the_third_within_a_gigabyte() -> None:
    # Recorded by a user of TensorRT-LLM (NVIDIA/TensorRT-LLM#247): GPU memory 27, 49 and 72 GB
    # at max_batch_size 1, 64 and 128. A line through the first two predicts the third.
    line = fit_line([Point(1, 27.0), Point(64, 49.0)])
    assert line.b == pytest.approx(22 / 63)
    assert line.at(128) == pytest.approx(71.35, abs=0.01)
    assert abs(line.at(128) - 72.0) < 1.0
    assert line.error(128) is None  # two points: no error can be known


def test_three_points_give_an_error_that_covers_the_spread() -> None:
    line = fit_line([Point(1, 27.0), Point(64, 49.0), Point(128, 72.0)])
    err = line.error(256)
    assert err is not None and 0.5 < err < 5
    exact = fit_line([Point(1, 10.0), Point(2, 12.0), Point(4, 16.0)])  # 8 + 2 x batch
    assert (exact.a, exact.b, exact.at(32)) == pytest.approx((8.0, 2.0, 72.0))
    assert exact.error(32) == pytest.approx(0.0, abs=1e-9)


def test_prediction_prefers_nvidia_smi_and_skips_failed_runs() -> None:
    gib = 2**30
    ok, runs = read_runs({"gpu": True, "runs": [
        {"batch": 1, "rc": 0, "allocated_bytes": 10 * gib, "reserved_bytes": 11 * gib,
         "smi_peak_mib": 12 * 1024},
        {"batch": 2, "rc": 124, "allocated_bytes": 12 * gib, "reserved_bytes": 13 * gib,
         "smi_peak_mib": 14 * 1024},
        {"batch": 4, "rc": 1, "allocated_bytes": None, "reserved_bytes": None,
         "smi_peak_mib": 500, "tail": "torch.OutOfMemoryError: CUDA out of memory."}]})
    assert ok
    smi, torch = predict(runs, 16)
    assert (smi.source, smi.gb) == ("nvidia-smi", pytest.approx(10 + 2 * 16))
    assert (torch.source, torch.gb) == ("torch", pytest.approx(8 + 2 * 16))


def test_nothing_to_fit_names_the_failure() -> None:
    runs = [Run(1, 1, None, None, None, "RuntimeError: CUDA error: no kernel image\n"),
            Run(2, 1, None, None, None, "")]
    with pytest.raises(ProvisionError, match="batch 1 exited 1: RuntimeError: CUDA error"):
        predict(runs, 8)


@pytest.mark.parametrize("text", ["1", "0,1", "1,1,2", "a,b", "1,2,4,8"])
def test_bad_batch_sizes(text: str) -> None:
    with pytest.raises(UsageError, match=f"--measure-batches {text}"):
        batch_sizes(text)


def test_the_hook_reports_torchs_peak_at_exit_even_when_terminated(tmp_path: Path) -> None:
    """A real Python process with the hook as its sitecustomize; torch here is a stand-in for
    the CUDA calls this machine cannot make (it reports fixed peaks, computes nothing)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        (ROOT / "templates" / "fit" / "measure_hook.py").read_text())
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("from . import cuda\n")
    (fake / "torch" / "cuda.py").write_text(
        "def is_initialized(): return True\n"
        "def device_count(): return 2\n"
        "def max_memory_allocated(i): return [5 << 30, 7 << 30][i]\n"
        "def max_memory_reserved(i): return [6 << 30, 8 << 30][i]\n")
    out = tmp_path / "peak"
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{fake}",
           "GPU_PROVISION_MEASURE_OUT": str(out)}
    script = "import torch, os, signal, time; os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)"
    r = subprocess.run([sys.executable, "-c", script], env=env, timeout=30)
    assert r.returncode == 128 + 15
    [report] = list(tmp_path.glob("peak.*"))
    assert json.loads(report.read_text()) == {"allocated": [5 << 30, 7 << 30],
                                              "reserved": [6 << 30, 8 << 30]}
    # a process that never imported torch writes nothing
    for p in tmp_path.glob("peak.*"):
        p.unlink()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, timeout=30)
    assert not list(tmp_path.glob("peak.*"))


SMI_CAPTURE = ROOT / "tests" / "fixtures" / "nvidia-smi" / "query-gpu-full-h200-590.48.01.csv"


def standins(tmp_path: Path) -> dict[str, str]:
    """nvidia-smi replaying the captured idle H200's memory.used (its --query-gpu CSV, the
    column picked by its header), and a torch whose CUDA peaks are what a training script at
    $BATCH_SIZE would report (6 GiB + 1.5 GiB per sample): this machine has no GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/bash\n"
                   f"awk -F', ' 'NR==1{{for(i=1;i<=NF;i++) if($i==\"memory.used [MiB]\") c=i; next}}"
                   f" {{sub(/ MiB/, \"\", $c); print $c}}' {SMI_CAPTURE}\n")
    smi.chmod(0o755)
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("from . import cuda\n")
    (fake / "torch" / "cuda.py").write_text(
        "import os\n"
        "_peak = (6 << 30) + int(os.environ['BATCH_SIZE']) * (3 << 29)\n"
        "def is_initialized(): return True\n"
        "def device_count(): return 1\n"
        "def max_memory_allocated(i): return _peak\n"
        "def max_memory_reserved(i): return _peak + (1 << 30)\n")
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(fake)}


def test_measure_runs_the_command_per_batch_and_the_line_comes_out(tmp_path: Path) -> None:
    """measure_run.py (what the step runs on the host) for real: a process per batch size,
    the hook as its sitecustomize, {batch} and --batch-env filled in, the peaks read back."""
    env = {**os.environ, **standins(tmp_path), "HOME": str(tmp_path)}
    hook = tmp_path / ".gpu-provision" / "measure-hook"
    hook.mkdir(parents=True)
    (hook / "sitecustomize.py").write_text(
        (ROOT / "templates" / "fit" / "measure_hook.py").read_text())
    script = "import sys, torch; assert sys.argv[1] == '--batch-size'; print('step', sys.argv[2])"
    cfg = {"argv": [sys.executable, "-c", script, "--batch-size", "{batch}"],
           "batches": [1, 2, 4], "env_var": "BATCH_SIZE", "seconds": 60,
           "hook_dir": "~/.gpu-provision/measure-hook", "path": None, "workdir": None}
    r = subprocess.run([sys.executable, str(ROOT / "templates" / "fit" / "measure_run.py"),
                        json.dumps(cfg)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    gpu, runs = read_runs(json.loads(r.stdout))
    assert gpu and [(x.batch, x.rc) for x in runs] == [(1, 0), (2, 0), (4, 0)]
    assert [x.smi_peak_gb for x in runs] == [None, None, None]  # the idle capture: no rise
    assert "step 4" in runs[2].tail
    [torch_line] = predict(runs, 16)  # nvidia-smi saw no rise: only torch's line
    assert (torch_line.source, torch_line.gb) == ("torch", pytest.approx(6 + 1.5 * 16))
    assert torch_line.error_gb == pytest.approx(0.0, abs=1e-9)


def test_a_host_without_nvidia_smi_reports_no_gpu(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    cfg = {"argv": ["true"], "batches": [1, 2], "env_var": None, "seconds": 5,
           "hook_dir": "~/h", "path": None, "workdir": None}
    r = subprocess.run([sys.executable, str(ROOT / "templates" / "fit" / "measure_run.py"),
                        json.dumps(cfg)], env=env, capture_output=True, text=True, timeout=60)
    gpu, runs = read_runs(json.loads(r.stdout))
    assert (gpu, runs) == (False, [])
    with pytest.raises(ProvisionError) as e:
        needs_gpu("cpu-box", 0)
    assert str(e.value) == ("cpu-box: fit --measure needs a GPU and nvidia-smi sees none on this "
                            "host; without one, `gpu-provision fit` (no -H) estimates the memory "
                            "offline")


def test_the_step_renders_to_bash_and_quotes_the_command() -> None:
    from provision.remote.runtime import detached_script
    hostile = ["python", "train.py", "--name", "x'; rm -rf / #", "--batch-size", "{batch}"]
    step = measure_step(hostile, (1, 2, 4), "/root/miniconda3/envs/llm/bin/python",
                        "/root/miniconda3/envs/llm/bin", None, 300, None)
    assert step.body is not None and step.action == "run the command at batch 1, 2, 4"
    script = detached_script(step.name, step.body, inputs=step.inputs, run="r")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    config = step.body.rsplit("measure_run.py\" ", 1)[1].split(" > ")[0]
    assert json.loads(shlex.split(config)[0])["argv"] == hostile


@pytest.mark.parametrize("argv, env, words", [
    ((), None, "give the command after --"),
    (("python", "train.py"), None, "the command must take the batch size"),
    (("python", "train.py"), "BATCH SIZE", "--batch-env BATCH SIZE: a variable name"),
])
def test_bad_commands(argv: tuple[str, ...], env: str | None, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        check_command(argv, env)
