"""What validation measures and says in the images and on the hosts where its verdicts used to be
wrong (../shared/reviews/gpu.md): validate_gpu.py run as the step runs it on the stand-in CUDA
layer (tests/fakecuda), which honours the TF32 switches and the environment as torch does, fails
figures as CUDA does and answers nvidia-smi's readings under load only while work runs. The
hosts are tests/fixtures/validation/hosts (SOURCES.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from provision.ops.validate import gpu_reference
from tests.unit.gpu_payload import HOSTS, payload, run_payload

H100 = "NVIDIA H100 80GB HBM3"


def _config(n: int, **thresholds: float) -> dict[str, Any]:
    return {"expected_gpus": n, "advertised": None, "data_dir": None,
            "thresholds": {"min_tflops_ratio": 0.5, "min_bandwidth_ratio": 0.5, **thresholds},
            "reference": {H100: gpu_reference(H100)}}


def _host(tmp: Path, name: str, **change: Any) -> str:
    """A copy of fixture host ``name`` whose host.json has ``change`` (top-level keys, or
    "device": {...} merged into every device); returns the name run_payload takes."""
    folder = tmp / "hosts" / name
    shutil.copytree(HOSTS / name, folder)
    doc = json.loads((folder / "host.json").read_text())
    for d in doc["devices"]:
        d.update(change.pop("device", None) or {})
    doc.update(change)
    (folder / "host.json").write_text(json.dumps(doc))
    return str(folder)


def _run(tmp: Path, host: str, cfg: dict[str, Any], **env: str) -> tuple[dict[str, Any], dict[str, Any]]:
    state = tmp / "state"
    state.mkdir(exist_ok=True)
    out = run_payload("validate_gpu.py", host, tmp, cfg, FAKE_CUDA_STATE=str(state), **env)
    return out, {c["name"]: c for c in out["checks"]}


def test_ngc_images_tf32_override_on_torch_1_13_is_judged_as_tf32(tmp_path: Path) -> None:
    """NVIDIA's container sets TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1; torch 1.13 then runs every
    fp32 matmul in TF32 whatever the setting. The correctness check used to FAIL a healthy GPU."""
    host = _host(tmp_path, "h100-sxm", version="1.13.1+cu117")
    out, checks = _run(tmp_path, host, _config(1), TORCH_ALLOW_TF32_CUBLAS_OVERRIDE="1")
    g = out["measurements"]["gpus"][0]
    assert g["correctness"]["mode"] == "tf32" and g["correctness"]["ok"] is True
    assert checks["gpu 0 matmul"]["status"] == "pass"
    assert checks["gpu 0 matmul"]["reason"].startswith("matches the CPU result in TF32, which this "
                                                       "environment forces on fp32 matmuls")
    # fp32 cannot be measured as fp32 here, and the verdict says why instead of a false speed
    assert "fp32" not in g["tflops"]
    speed = checks["gpu 0 speed"]
    assert speed["status"] == "warn"
    assert "not measured: fp32 (not measured: TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 makes torch " \
           "1.13.1+cu117 run every fp32 matmul in TF32" in speed["reason"]
    assert out["measurements"]["env"]["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "1"


def test_from_torch_2_0_the_checks_own_switch_wins_over_the_override(tmp_path: Path) -> None:
    out, checks = _run(tmp_path, "h100-sxm", _config(1), TORCH_ALLOW_TF32_CUBLAS_OVERRIDE="1")
    g = out["measurements"]["gpus"][0]
    assert g["correctness"]["mode"] == "ieee" and g["correctness"]["worst"] < 1
    # each in its own precision (the stand-in's rates: fp32 52.11, tf32 402.15)
    assert g["tflops"]["fp32"] == pytest.approx(52.11, abs=0.06)
    assert g["tflops"]["tf32"] == pytest.approx(402.15, abs=0.06)
    assert out["verdict"] == "PASS", [c for c in out["checks"] if c["status"] != "pass"]


def test_torch_2_9s_new_precision_api_is_used_where_it_exists(tmp_path: Path) -> None:
    host = _host(tmp_path, "h100-sxm", version="2.9.1+cu128")
    out, checks = _run(tmp_path, host, _config(1), TORCH_ALLOW_TF32_CUBLAS_OVERRIDE="1")
    g = out["measurements"]["gpus"][0]
    assert g["correctness"]["mode"] == "ieee" and g["tflops"]["fp32"] == pytest.approx(52.11, abs=0.06)
    assert out["verdict"] == "PASS", [c for c in out["checks"] if c["status"] != "pass"]


def test_nvidia_tf32_override_0_is_named_not_blamed_on_the_card(tmp_path: Path) -> None:
    out, checks = _run(tmp_path, "h100-sxm", _config(1), NVIDIA_TF32_OVERRIDE="0")
    speed = checks["gpu 0 speed"]
    assert speed["status"] == "warn" and "tf32 (not measured: NVIDIA_TF32_OVERRIDE=0 keeps cuBLAS " \
        "from TF32 (this environment sets it))" in speed["reason"]
    assert "below the healthy floor" not in speed["reason"]


def test_the_old_tolerance_fails_a_tf32_product_and_the_bound_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the stand-in a TF32 matmul reads 10-bit mantissas, as tensor cores do: the old
    rtol=atol=1e-2 check fails a healthy GPU's product, the error bound of TF32 passes it, and
    the bound of IEEE fp32 catches that it was TF32."""
    monkeypatch.setenv("FAKE_CUDA_HOST", str(HOSTS / "h100-sxm" / "host.json"))
    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
    torch = _fake_torch(monkeypatch)
    torch.__version__ = "1.13.1+cu117"
    gf = payload("gpu_figures")
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    dev = torch.device("cuda", 0)
    assert not torch.allclose(a @ a, (a.to(dev) @ a.to(dev)).cpu(), rtol=1e-2, atol=1e-2)
    assert gf.correctness(torch, a, dev, "tf32")["ok"] is True
    assert gf.correctness(torch, a, dev, "ieee")["ok"] is False


def test_fp16_accumulation_a_process_turned_on_is_off_for_the_figures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.7's allow_fp16_accumulation (fp16 GEMMs accumulating in fp16, about twice the
    TFLOPS on consumer cards): whatever the process set, the figures run with it off, and the
    process gets its own setting back."""
    import importlib.util
    import sys
    monkeypatch.setenv("FAKE_CUDA_HOST", str(HOSTS / "h100-sxm" / "host.json"))
    torch = _fake_torch(monkeypatch)
    torch.__version__ = "2.7.1+cu128"
    gpu = Path(__file__).resolve().parents[2] / "templates" / "gpu"
    monkeypatch.syspath_prepend(str(gpu))
    monkeypatch.delitem(sys.modules, "precision", raising=False)
    spec = importlib.util.spec_from_file_location("precision", gpu / "precision.py")
    assert spec is not None and spec.loader is not None
    precision = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(precision)
    torch.backends.cuda.matmul.allow_fp16_accumulation = True  # as the renter's code had it
    saved = precision.save(torch)
    precision.set_reduced(torch, True)
    assert torch.backends.cuda.matmul.allow_fp16_accumulation is False
    precision.restore(torch, saved)
    assert torch.backends.cuda.matmul.allow_fp16_accumulation is True


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


def test_a_gpu_with_no_measured_figure_fails_and_says_why(tmp_path: Path) -> None:
    """Every figure errors (another tenant filled the GPU after nvidia-smi looked): it used to
    PASS 'every figure at or above the healthy floor ()'."""
    oom = "CUDA out of memory. Tried to allocate 512.00 MiB"
    host = _host(tmp_path, "h100-sxm", device={"fail_min_mib": 4, "fail": {
        k: oom for k in ("fp16", "bf16", "tf32", "fp32", "mem", "h2d")}})
    out, checks = _run(tmp_path, host, _config(1))
    assert out["verdict"] == "FAIL"
    assert checks["gpu 0 speed"]["status"] == "fail"
    assert checks["gpu 0 speed"]["reason"].startswith(f"{H100}: not measured: no type gave a figure "
                                                      f"(fp16: RuntimeError: {oom}")
    assert checks["gpu 0 memory bandwidth"] == {"name": "gpu 0 memory bandwidth", "status": "warn",
                                                "reason": f"not measured: RuntimeError: {oom}"}
    assert checks["gpu 0 bandwidth"]["status"] == "warn"


def test_a_sticky_cuda_error_fails_the_gpu(tmp_path: Path) -> None:
    bad = "CUDA error: unspecified launch failure"
    host = _host(tmp_path, "h100-sxm", device={"fail": {"bf16": bad}, "sticky": True})
    out, checks = _run(tmp_path, host, _config(1))
    assert out["verdict"] == "FAIL"
    speed = checks["gpu 0 speed"]
    assert speed["status"] == "fail" and speed["reason"].startswith(f"{H100}: a CUDA error stopped a figure")
    assert f"bf16 (RuntimeError: {bad})" in speed["reason"]


def test_a_slow_nvidia_smi_still_reads_the_link_under_the_copy(tmp_path: Path) -> None:
    """No persistence mode: nvidia-smi answers 1 s after it starts (smi.json), the copy's timed
    second is long over by then, and at idle this RTX 4080 SUPER's link reads gen 1 (its captured
    query): the work now goes on until nvidia-smi has answered, so the link is gen 4 x16."""
    out, checks = _run(tmp_path, "rtx4080super-slow-smi", {**_config(1), "reference": {}})
    g = out["measurements"]["gpus"][0]
    assert g["link"]["answered_under_load"] is True and g["link"]["pcie.link.gen.current"] == "4"
    assert checks["gpu 0 bandwidth"] == {"name": "gpu 0 bandwidth", "status": "pass", "reason":
                                         "host-to-device 25.1 GB/s on PCIe gen 4 x16 (about 24 expected)"}
    assert g["under_load"]["clocks.sm"] == "2805" and g["under_load"]["answered_under_load"] is True
    # an answer after the work ended is idle's, and would be judged as a narrowed link
    gv = payload("gpu_verdict_speed")
    late = {**g, "link": {"pcie.link.gen.current": "1", "pcie.link.width.current": "16",
                          "pcie.link.gen.max": "4", "pcie.link.width.max": "16",
                          "answered_under_load": False}}
    said: list[tuple[str, str, str]] = []
    gv.judge_h2d(late, {}, {"min_bandwidth_ratio": 0.5}, lambda *a, **k: said.append(a))
    # not as a narrowed link: the figure against the card's own best link, which 25.1 GB/s fits
    assert said[-1][1] == "pass" and said[-1][2].startswith(
        "host-to-device 25.1 GB/s, as this GPU's PCIe gen 4 x16 gives (nvidia-smi answered after "
        "the copy ended")
    # ... and a copy too slow for that link still shows, read late or not at all
    for link in ({**late["link"]}, {"pcie.link.gen.max": "4", "pcie.link.width.max": "16"}):
        gv.judge_h2d({**late, "h2d_gbs": 6.2, "link": link}, {}, {"min_bandwidth_ratio": 0.5},
                     lambda *a, **k: said.append(a))
        assert said[-1][1] == "warn" and "slow for this GPU's PCIe gen 4 x16 (about 24 " \
            "expected): a narrower link than the card's" in said[-1][2], said[-1]


def _recovery(tmp: Path, name: str, action: str) -> str:
    """A copy of fixture host ``name`` whose GPUs report ``action`` as gpu_recovery_action."""
    import csv
    folder = Path(_host(tmp, name))
    path = folder / "query-gpu.csv"
    rows = list(csv.reader(path.open(), skipinitialspace=True))
    at = rows[0].index("gpu_recovery_action")
    for r in rows[1:]:
        r[at] = action
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    return str(folder)


def test_xid_79_of_our_gpu_fails_it(tmp_path: Path) -> None:
    """The captured kernel log of akash-network/support#209 (Xid 79 on PCI 0000:a1:00) with
    leptonai/gpud#46's Xid 13 and 109 (PCI 0000:cb:00); this host's GPU is on a1, and its driver
    says a reboot is pending (gpu_recovery_action)."""
    out, checks = _run(tmp_path, _recovery(tmp_path, "h100-xid79-ours", "Reboot"), _config(1))
    health = checks["gpu health"]
    assert health["status"] == "fail" and out["verdict"] == "FAIL"
    assert health["reason"].startswith("GPU 0: 1 x Xid 79 (fell off the bus; hardware: the machine "
                                       "needs a reboot); the last: [Fri Apr  5 21:29:39 2024] NVRM: Xid")
    assert "(gpu_recovery_action now: GPU 0: Reboot)" in health["reason"]
    assert "4 Xid line(s) of GPUs that are not ours (another tenant's on this machine) not counted" \
        in health["reason"]


@pytest.mark.parametrize(("action", "status"), [("None", "warn"), ("[N/A]", "fail")])
def test_a_hardware_xid_the_gpu_recovered_from_warns(tmp_path: Path, action: str,
                                                     status: str) -> None:
    """The same Xid 79 line, still in the kernel log of this boot, on a GPU whose driver now
    says no recovery action is pending (it was reset, and answers): a warning to watch it, not
    a FAIL of a working GPU. Where the driver cannot say ([N/A], an older one), it FAILs."""
    out, checks = _run(tmp_path, _recovery(tmp_path, "h100-xid79-ours", action), _config(1))
    health = checks["gpu health"]
    assert health["status"] == status, health
    if status == "warn":
        assert "logged earlier in this boot; the GPU now reports no recovery action pending " \
            "(gpu_recovery_action: None)" in health["reason"]


def test_an_applications_xid_13_is_said_and_other_gpus_xid_79_is_not_ours(tmp_path: Path) -> None:
    out, checks = _run(tmp_path, "h100-xid13-ours", _config(1))
    health = checks["gpu health"]
    # Xid 109 (a context switch timeout: the catalog's RESET_GPU, a driver fault) warns; the
    # three Xid 13 are the application's own; the a1 GPU's Xid 79 is another GPU's
    assert health["status"] == "warn", health
    assert health["reason"].startswith("GPU 0: 1 x Xid 109 (context switch timeout; driver: the GPU "
                                       "needs a reset (nvidia-smi -r, root))")
    assert "GPU 0: 3 x Xid 13 (graphics engine exception; application: the application's own fault: " \
           "restarting it is enough)" in health["reason"]
    assert "1 Xid line(s) of GPUs that are not ours" in health["reason"]
    assert "Xid 79" not in health["reason"]


def test_a_power_limit_the_host_lowered_is_named_with_its_cost(tmp_path: Path) -> None:
    """GPU 0 as in the captured `nvidia-smi -q -d power` of stackhpc/ansible-slurm-appliance#975:
    500 W enforced of its default and maximum 700 W."""
    out, checks = _run(tmp_path, "4xh100-capped-power", _config(4))
    caps = checks["gpu caps"]
    assert caps["status"] == "warn"
    assert caps["reason"].startswith("GPU 0: power limited to 500 W of its default 700 W (max 700 W): "
                                     "the host lowered it (nvidia-smi -pl); under load the clocks drop "
                                     "until the draw fits, 29% less power than the card is made for, "
                                     "and only root on the host can raise it")
    assert "GPU 1" not in caps["reason"]


def test_the_sustained_load_names_the_card_that_brakes_when_all_draw_together(tmp_path: Path) -> None:
    """Four H100s loaded at once for 20 s: GPU 2's power brake engages after 6 s of the four
    drawing together (constructed: 0.62 of its rate, hw_slowdown and hw_power_brake_slowdown in
    its readings); the other three stay healthy. One GPU at a time, as the plain validate loads
    them, it is as fast as the others."""
    out, checks = _run(tmp_path, "4xh100-one-brakes-together", _config(4, sustained_s=20))
    assert all(checks[f"gpu {i} speed"]["status"] == "pass" for i in range(4))
    s = out["measurements"]["sustained"]
    assert s["dtype"] == "bf16" and [g["seconds"] >= 20 for g in s["gpus"]] == [True] * 4
    assert checks["sustained load"]["status"] == "pass"
    for i in (0, 1, 3):
        assert checks[f"gpu {i} sustained"]["status"] == "pass", checks[f"gpu {i} sustained"]
    hot = checks["gpu 2 sustained"]
    assert hot["status"] == "warn"
    assert hot["reason"].startswith("38% below the best of its siblings; below this model's healthy "
                                    "sustained floor; it slowed 38% as the load went on; hw_slowdown, "
                                    "hw_power_brake_slowdown during the load")
    assert len(s["gpus"][2]["samples"]) >= 3  # read during the load, not once at its end
    assert "clocks held by" in hot["reason"] and "SM clock 1230-1980/1980 MHz" in hot["reason"]
    assert out["verdict"] == "WARN"


def test_the_sustained_load_keeps_every_fast_gpu_busy_together(tmp_path: Path) -> None:
    """Eight B200-fast GPUs (an 8192 matmul in 0.6 ms): a round of the 8192 size
    would be about 1600 launches on one GPU, past CUDA's launch queue, so the launching thread
    would wait on each GPU in turn; the matrices grow instead, each round stays within
    MAX_LAUNCHES kernels per GPU, and all eight are loaded for the whole time."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("sustained", Path(__file__).resolve().parents[2] / "templates/gpu/sustained.py")
    assert spec is not None and spec.loader is not None
    sustained = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sustained)
    host = _host(tmp_path, "8xh100-one-throttled", device={
        "tflops": {"fp16": 1745.0, "bf16": 1745.0, "tf32": 870.0, "fp32": 75.0},
        "throttle": None})
    # one card 2% faster, past the cut between 16384 (196 launches a round at 1745 TFLOPS) and
    # 32768: the siblings still run one n, the median's
    doc = json.loads((Path(host) / "host.json").read_text())
    doc["devices"][3]["tflops"]["bf16"] = 1780.0
    (Path(host) / "host.json").write_text(json.dumps(doc))
    out, checks = _run(tmp_path, host, _config(8, sustained_s=5))
    s = out["measurements"]["sustained"]
    assert len(s["gpus"]) == 8 and len({g["n"] for g in s["gpus"]}) == 1
    for g in s["gpus"]:
        assert g["error"] is None and g["seconds"] >= 5
        assert g["n"] > 8192 and g["launches_per_round"] <= sustained.MAX_LAUNCHES, g
    assert checks["sustained load"]["status"] == "pass"


def test_validate_sustained_takes_seconds_or_the_default(cpu_host: Any) -> None:
    from dataclasses import replace

    from provision.cli.tasks_host import sustained_seconds
    from provision.config.inventory import Target, merge_settings
    from provision.config.recipes import load_platform, load_recipe
    from provision.errors import UsageError
    from provision.facts.nvidia import Gpu
    from provision.ops.layout import Layout
    from provision.ops.validate import validate_step
    assert sustained_seconds(None) is None and sustained_seconds(True) == 60.0
    assert sustained_seconds("120") == 120.0
    for bad in ("0", "a minute", "99999"):
        with pytest.raises(UsageError, match=r"--sustained: .* is not a number of seconds from 5 to 3600"):
            sustained_seconds(bad)
    settings = merge_settings(Target(name="box", host="h"), load_platform("generic-vm"), load_recipe("pytorch"))
    facts = replace(cpu_host, gpus=(Gpu(0, H100, compute_cap="9.0"), Gpu(1, H100, compute_cap="9.0")))
    lay = Layout("/root/miniconda3", "torch", False)
    plain = validate_step(facts, lay, settings)
    held = validate_step(facts, lay, replace(settings, validation={**settings.validation,
                                                                   "sustained_s": 90.0}))
    assert '"sustained_s": 90.0' in held.body and '"sustained_s":' not in plain.body
    assert held.inputs != plain.inputs  # a sustained run is not skipped as an earlier plain PASS
    assert held.reason.endswith("; then every GPU at once for 90 s, each against its siblings")


def test_gpu_health_read_from_nothing_is_not_a_pass() -> None:
    """An RTX 4090 in a RunPod or vast.ai container: ECC "[N/A]", no row remapping, no retired
    pages, and dmesg not permitted. Nothing was read, so nothing is vouched for: a warning that
    says so, never "no uncorrected ECC errors ..."."""
    gh = payload("gpu_verdict_health")
    na = {"index": "0", "ecc.errors.uncorrected.volatile.total": "[N/A]"}
    nothing = {"ecc": [na], "remapped": {"error": "[Not Supported]"},
               "retired": {"error": "[Not Supported]"},
               "xid": {"error": "dmesg: read kernel buffer failed: Operation not permitted"}}
    said: list[tuple[str, str, str]] = []
    gh.judge_health({"health": nothing}, lambda *a, **k: said.append(a))
    [(name, status, reason)] = said
    assert (name, status) == ("gpu health", "warn") and reason.startswith("not measured: ")
    # one field read is a measurement: a clean ECC count of 0 passes
    said.clear()
    gh.judge_health({"health": {**nothing, "ecc": [{"index": "0",
                    "ecc.errors.uncorrected.volatile.total": "0"}]}},
                    lambda *a, **k: said.append(a))
    assert said[0][1] == "pass" and said[0][2].startswith("no uncorrected ECC errors")
