"""The measuring half of the GPU payload (templates/gpu/validate_gpu.py, bench_gpu.py,
nccl_check.py) run as the step runs it, on a stand-in CUDA layer (tests/fakecuda: the torch
calls it makes, and nvidia-smi replaying captures, see tests/fixtures/SOURCES.md) that behaves
as CUDA does where the answers depend on it: events time the stream of the device current when
they are recorded, devices are numbered fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from provision.ops.validate import gpu_reference
from tests.unit.gpu_payload import HOSTS, payload, run_payload

H100 = "NVIDIA H100 80GB HBM3"


def _config(n: int, names: tuple[str, ...] = (H100,)) -> dict[str, Any]:
    return {"expected_gpus": n, "advertised": None, "data_dir": None,
            "thresholds": {"min_tflops_ratio": 0.5, "min_bandwidth_ratio": 0.5},
            "reference": {name: gpu_reference(name) for name in names}}


@pytest.fixture(scope="module")
def eight(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_payload("validate_gpu.py", "8xh100-one-throttled", tmp_path_factory.mktemp("v8"), _config(8))


def test_each_gpu_is_timed_on_itself_and_the_throttled_one_is_named(eight: dict[str, Any]) -> None:
    checks = {c["name"]: c for c in eight["checks"]}
    gpus = eight["measurements"]["gpus"]
    # torch numbers the GPUs as nvidia-smi does (CUDA_DEVICE_ORDER=PCI_BUS_ID), UUID by UUID
    assert [g["uuid"] for g in gpus] == [f"GPU-0000000{i}-0000-0000-0000-00000000000{i}" for i in range(8)]
    # the stream's rate (442.25 on GPU 5) summed over however many calls nvidia-smi's reading took
    assert [g["tflops"]["fp16"] for g in gpus] == pytest.approx([758.1] * 5 + [442.25] + [758.1] * 2,
                                                                abs=0.06)
    assert [n for n, c in checks.items() if c["name"].endswith("speed") and c["status"] == "warn"] == \
        ["gpu 5 speed"]
    assert checks["gpu 5 speed"]["reason"].endswith(
        "under load: SM clock 1155/1980 MHz, power 402.77/700.00 W, 88 C, clocks held by "
        "hw_thermal_slowdown, sw_thermal_slowdown")
    fig = gpus[5]["figures"]["fp16"]
    assert fig["seconds"] >= 1.0 and fig["n"] == 8192  # sustained, not a burst


def test_without_pci_order_the_clocks_still_follow_the_uuid(tmp_path: Path) -> None:
    """CUDA numbers the throttled (slowest) GPU last when nothing asks for bus order: its clocks
    must still be its own, found by UUID, not nvidia-smi's row 7's."""
    out = run_payload("validate_gpu.py", "8xh100-one-throttled", tmp_path, _config(8),
                      CUDA_DEVICE_ORDER="FASTEST_FIRST")
    gpus = out["measurements"]["gpus"]
    assert gpus[7]["uuid"] == "GPU-00000005-0000-0000-0000-000000000005"
    assert gpus[7]["under_load"]["clocks.sm"] == "1155"
    assert [c["name"] for c in out["checks"] if c["name"].endswith("speed") and c["status"] == "warn"] == \
        ["gpu 7 speed"]


def test_cuda_visible_devices_is_counted_not_failed(tmp_path: Path) -> None:
    out = run_payload("validate_gpu.py", "8xh100-one-throttled", tmp_path, _config(8),
                      CUDA_VISIBLE_DEVICES="4,5")
    checks = {c["name"]: c for c in out["checks"]}
    assert checks["gpu count"]["status"] == "pass", checks["gpu count"]
    assert checks["gpu count"]["reason"] == ("torch sees 2 GPU(s), nvidia-smi 8; "
                                             "CUDA_VISIBLE_DEVICES=4,5 shows this process 2")
    assert [g["uuid"][-1] for g in out["measurements"]["gpus"]] == ["4", "5"]
    assert checks["gpu 1 speed"]["status"] == "warn" and checks["gpu 0 speed"]["status"] == "pass"


def test_a_mig_host_replayed_from_its_capture(tmp_path: Path) -> None:
    out = run_payload("validate_gpu.py", "h100-mig", tmp_path, _config(1))
    checks = {c["name"]: c for c in out["checks"]}
    m = out["measurements"]
    assert [x["profile"] for x in m["smi"]["mig"]] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert m["gpus"][0]["uuid"] == "MIG-00000000-0000-0000-0000-000000000000"
    assert checks["gpu count"]["status"] == "pass"
    assert "a MIG instance with 0.45 of the GPU" in checks["gpu 0 speed"]["reason"]
    assert checks["gpu 0 speed"]["status"] == "pass", checks["gpu 0 speed"]
    # this capture's remapped rows are [N/A]: unknown, not zero, and no failure
    assert m["health"]["remapped"][0]["remapped_rows.pending"] == "[N/A]"
    assert checks["gpu health"]["status"] == "pass"


def test_the_legacy_tf32_switch_is_restored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CUDA_HOST", str(HOSTS / "8xh100-one-throttled" / "host.json"))
    monkeypatch.setenv("FAKE_SMI_DIR", str(HOSTS / "8xh100-one-throttled"))
    torch = _fake_torch(monkeypatch)
    vg = payload("validate_gpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    got = vg.gpu_figures(torch, 0, 9, None)
    assert got["tflops"]["tf32"] > 2 * got["tflops"]["fp32"]  # tf32 did run on tensor cores
    assert torch.backends.cuda.matmul.allow_tf32 is False


def test_a_figure_the_gpu_cannot_run_is_a_note_and_bench_still_answers(tmp_path: Path) -> None:
    out = run_payload("bench_gpu.py", "no-fp32-kernels", tmp_path, {"data_dir": str(tmp_path),
                                                                     "mirrors": []})
    assert out["mode"] == "gpu" and out["tflops"]["fp16"] == 758.1 and "fp32" not in out["tflops"]
    assert any(n.startswith("gpu 0 fp32: RuntimeError: CUDA error: no kernel image") for n in out["notes"])
    assert out["mem_gbs"] == 2900.0 and out["disk_write_mbs"] is not None
    assert any(n.startswith("train: ") for n in out["notes"])  # the stand-in has no torch.nn


def test_the_nccl_ladder_stops_at_the_one_setting_that_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL cannot run here: its answers are scripted, the order of the ladder is the payload's."""
    nc = payload("nccl_check")
    tried: list[tuple[dict[str, str], float]] = []

    def answer(n: int, env: dict[str, str], backend: str = "nccl", mib: int = 64, iters: int = 20,
               timeout: float = 90) -> dict[str, Any]:
        tried.append((env, timeout))
        ok = env == {"NCCL_SHM_DISABLE": "1"}
        return {"env": env, "ok": ok, "busbw_gbs": 9.1 if ok else None, "timeout": False,
                "error": None if ok else "exit 1: NCCL error", "stage": None if ok else "init",
                "nccl_warn": None if ok else "transport/shm.cc:590 NCCL WARN Error while creating "
                "shared memory segment /dev/shm/nccl-x (size 9637888)"}

    monkeypatch.setattr(nc, "allreduce", answer)
    runs = nc.ladder(4)
    assert [e for e, _ in tried] == [{}, {}, {"NCCL_SHM_DISABLE": "1"}]
    assert [t for _, t in tried] == [nc.FIRST_TIMEOUT, nc.LATER_TIMEOUT, nc.LATER_TIMEOUT]
    assert runs[-1]["ok"]


def test_a_stage_marker_says_where_a_hang_was() -> None:
    nc = payload("nccl_check")
    err = "gp-stage 0 started\ngp-stage 1 started\ngp-stage 0 init\ngp-stage 1 init\ngp-stage 0 all-reduce\n"
    assert nc._stage_of(err) == "init"
    assert nc._stage_of("") == "start-up (spawning the workers)"


def _fake_torch(monkeypatch: pytest.MonkeyPatch) -> Any:
    import importlib.util
    import sys

    from tests.unit.gpu_payload import FAKE
    spec = importlib.util.spec_from_file_location("torch", FAKE / "torch" / "__init__.py",
                                                  submodule_search_locations=[str(FAKE / "torch")])
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "torch", mod)  # the package, for its own submodules
    monkeypatch.delitem(sys.modules, "torch._precision", raising=False)
    spec.loader.exec_module(mod)
    return mod


def test_fixture_hosts_are_json() -> None:
    for host in HOSTS.iterdir():
        json.loads((host / "host.json").read_text())


def test_events_of_another_device_time_nothing_and_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old mistake, timing GPU 1's matmuls with events of the current GPU 0: CUDA's events
    then time an empty stream; the figure says so instead of dividing by zero."""
    monkeypatch.setenv("FAKE_CUDA_HOST", str(HOSTS / "8xh100-one-throttled" / "host.json"))
    torch = _fake_torch(monkeypatch)
    vg = payload("validate_gpu")
    a = torch.randn(1024, 1024, device=torch.device("cuda", 1), dtype=torch.float16)
    got = vg.figure(torch, lambda: a @ a, 2 * 1024 ** 3)
    assert got["rate"] is None
    assert got["error"] == "the CUDA events timed no GPU time: the work did not run on this device"
    with torch.cuda.device(1):
        assert vg.figure(torch, lambda: a @ a, 2 * 1024 ** 3)["rate"] > 7e14


def test_the_validate_step_writes_its_payload_and_runs_it(tmp_path: Path) -> None:
    """The step's script as bootstrap runs it: every payload file written beside the others
    under ~/.gpu-provision, validate_gpu.py importing them, one JSON line in $RESULT."""
    import os
    import subprocess
    import sys

    from provision.ops.validate import VALIDATE_PAYLOAD, validate_body
    from tests.unit.gpu_payload import FAKE, libcuda
    body = validate_body(sys.executable, _config(1), {"gpus": [H100]}, "inputs-hash")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "NCCL_"))}
    env.update(HOME=str(tmp_path), RESULT=str(tmp_path / "result"), PYTHONPATH=str(FAKE),
               PATH=f"{FAKE / 'bin'}:{env['PATH']}", LD_LIBRARY_PATH=str(libcuda(tmp_path)),
               FAKE_CUDA_HOST=str(HOSTS / "h100-mig" / "host.json"), FAKE_SMI_DIR=str(HOSTS / "h100-mig"))
    r = subprocess.run(["bash", "-c", body], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert {p.name for p in (tmp_path / ".gpu-provision").iterdir()} >= set(VALIDATE_PAYLOAD)
    report = json.loads((tmp_path / "result").read_text())
    assert report["schema"] == 3 and report["verdict"] == "PASS", report["checks"]
    assert report["devices"][0]["uuid"] == "MIG-00000000-0000-0000-0000-000000000000"
    assert json.loads(r.stdout.splitlines()[-1]) == report  # the step's log shows it too
    journal = json.loads((tmp_path / ".gpu-provision" / "steps" / "verdict.json").read_text())
    assert journal["inputs"] == "inputs-hash" and journal["result"] == report["verdict"]


def test_the_validate_and_bench_steps_fit_one_bash_argument() -> None:
    """A step's script reaches the host as ONE argument of `bash -c`, which Linux caps at 128 KiB
    (MAX_ARG_STRLEN): the payload travels packed, and the whole script stays well under it."""
    import sys

    from provision.ops.validate import bench_body, validate_body
    from provision.remote.runtime import detached_script
    for name, body in (("validate", validate_body(sys.executable, _config(8), {"gpus": [H100] * 8}, "h")),
                       ("bench", bench_body(sys.executable, {"data_dir": None, "mirrors": []}))):
        script = detached_script(name, body, inputs="h", run="r")
        assert len(script.encode()) < 96 * 1024, (name, len(script.encode()))
