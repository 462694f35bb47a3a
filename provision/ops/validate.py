"""Operations that measure the GPU: validation (and what `verify` expects) and the benchmark."""

from __future__ import annotations

import base64
import json
import re
import time
import zlib
from collections.abc import Mapping
from functools import cache
from typing import Any

import yaml

from ..config.inventory import Settings, Target
from ..config.minimums import KEYS as MINIMUM_KEYS
from ..config.minimums import Resources
from ..config.minimums import judge as judge_minimums
from ..config.shipped import data_file, templates_dir
from ..config.validators import split_gpu_claim
from ..facts.host import Disk, HostFacts
from ..remote.templating import render
from ..wheels.rule import TorchChoice
from ..wheels.simpleindex import variant_index
from .conda import configured_pypi
from .layout import Layout, expand_home
from .login import login_block_script
from .step import Outcome, Step, dict_result, inputs_hash, nothing

REVALIDATE_AFTER = 6 * 3600  # seconds: an unchanged host is measured again after this long


def validate_step(facts: HostFacts, lay: Layout, settings: Settings,
                  choice: TorchChoice | None = None, always: bool = True) -> Step:
    """Validation. Unless ``always``, it is skipped when the last run PASSed on this boot, less
    than REVALIDATE_AFTER ago, with the same GPUs, driver, env, torch, idle GPUs and config: the
    facts carry all of these, so a re-run that changes nothing costs one remote execution."""
    expected = len(facts.gpus)
    config = validation_config(facts, settings)
    expect = verify_expectations(facts, lay, settings, choice)
    h = inputs_hash(config=config, expect=expect, boot=facts.boot_id,
                    busy=sorted(p.name for p in facts.gpu_processes), state=facts.nvidia_state)
    last = facts.journal.get("verdict", {})
    age = facts.now - float(last.get("at") or 0) if facts.now else REVALIDATE_AFTER
    if not always and last.get("inputs") == h and last.get("result") == "PASS" \
            and 0 <= age < REVALIDATE_AFTER:
        return nothing("validate", f"PASS {age / 60:.0f} min ago on this boot, and nothing it "
                       "checked has changed (`validate` measures again)", kept=Outcome(verdict="PASS"))
    body = validate_body(lay.python_bin, config, expect, h, login=login_block_script())
    also = "; TFLOPS and bandwidth against each model's healthy floor" if config["reference"] else ""
    what = f"{expected} GPU(s): torch imports, sees every GPU, matmul matches the CPU{also}" \
        if expected else "CPU mode: torch imports, the CPU build, a matmul on the CPU" \
        if not facts.has_nvidia_gpu else \
        "the GPUs nvidia-smi sees once the driver answers: torch imports, sees every GPU, matmul"
    held = settings.validation.get("sustained_s")
    if held and expected:
        what += f"; then every GPU at once for {held:g} s, each against its siblings"
    need = minimums_of(settings)
    return Step("validate", what, action="run validate_gpu.py", body=body, inputs=h,
                read=lambda result: read_validation(result, need))


# The GPU payload as it ships: the measuring scripts and, beside them, the verdict rules they import
VALIDATE_PAYLOAD = ("validate_gpu.py", "gpu_figures.py", "gpu_smi.py", "gpu_verdict.py",
                    "gpu_verdict_speed.py", "gpu_verdict_multi.py", "gpu_verdict_health.py",
                    "gpu_verdict_sustained.py", "gpu_names.py", "nccl_check.py", "precision.py",
                    "sustained.py", "xid.py")
BENCH_PAYLOAD = (*VALIDATE_PAYLOAD, "bench_gpu.py")


def payload(names: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(name, (templates_dir() / "gpu" / name).read_text()) for name in names]


def packed(names: tuple[str, ...]) -> str:
    """The payload as templates/gpu/_payload.sh.j2 unpacks it: a JSON of name -> text, zlib,
    base64 in lines of 76 (a step's script is one `bash -c` argument, at most 128 KiB)."""
    raw = zlib.compress(json.dumps(dict(payload(names)), sort_keys=True).encode(), 9)
    return base64.encodebytes(raw).decode().strip()


def validate_body(python_bin: str, config: Mapping[str, Any], expect: Mapping[str, Any],
                  inputs: str, login: str = "") -> str:
    """The validate step's script: writes the payload, runs validate_gpu.py with ``config``;
    ``login``: the block that gives login shells the env (ops/login.py), none elsewhere."""
    return render("setup/validate.sh.j2", python_bin=python_bin, packed=packed(VALIDATE_PAYLOAD),
                  config=json.dumps(config, sort_keys=True), expected=json.dumps(expect, indent=1),
                  inputs=inputs, login=login)


def bench_body(python_bin: str, config: Mapping[str, Any]) -> str:
    """The bench step's script: writes the payload, runs bench_gpu.py with ``config``."""
    return render("gpu/bench.sh.j2", python_bin=python_bin, packed=packed(BENCH_PAYLOAD),
                  config=json.dumps(config, sort_keys=True))


def read_validation(result: Any, need: Mapping[str, float] | None = None) -> Outcome:
    """gpu/validate_gpu.py's report (schema in its docstring) with the recipe's minimums judged
    on what it measured (the rule the plan applies before installing), and its verdict."""
    report = dict(dict_result(result, "validate"))
    found = judge_minimums(need or {}, measured_resources(report.get("measurements") or {}),
                           "the recipe")
    if found:
        report["checks"] = [*report.get("checks", []),
                            *({"name": j.what, "status": "pass" if j.ok else "warn",
                               "reason": j.reason} for j in found)]
        if report.get("verdict") == "PASS" and not all(j.ok for j in found):
            report["verdict"] = "WARN"
    return Outcome(report=report, report_kind="validate", verdict=str(report.get("verdict")))


def minimums_of(settings: Settings) -> dict[str, float]:
    """The recipe's minimums (cores, memory, free disk, GPU memory) among its thresholds."""
    return {k: v for k, v in settings.validation.items() if k in MINIMUM_KEYS}


def host_resources(facts: HostFacts) -> Resources:
    """What the facts say a job on the host can use (before anything is installed): the
    cgroup's memory limit and CPU quota where they are below what /proc and nproc show."""
    lim = facts.limits
    # the judgement takes the smaller and says which it was ("(the cgroup's limit)")
    return Resources(cpu_cores=facts.cpu_cores or None, memory_gb=facts.memory_gb or None,
                     memory_limit_gb=lim.memory_limit_gb, cpu_limit=lim.cpu_quota,
                     free_disk_gb={d.path: _under_quota(d, lim.quotas) for d in facts.disks},
                     disk_total_gb={d.path: d.total_gb for d in facts.disks},
                     gpu_memory_gb=tuple(round(g.memory_total_mib / 1024, 1) for g in facts.gpus
                                         if g.memory_total_mib))


def _under_quota(d: Disk, quotas: tuple[tuple[str, int, int], ...]) -> float:
    """The GB a job can write to ``d``: df's free space, or less where the login's disk quota on
    that file system leaves less."""
    left = [max(0, allowed - used) / 1024**2 for fs, used, allowed in quotas if fs == d.device]
    return round(min([d.free_gb, *left]), 1)


def measured_resources(m: Mapping[str, Any]) -> Resources:
    """What validate_gpu.py measured: cores, memory and free disk of the host, torch's view of
    each GPU's memory (GB of 10^9 bytes there, GiB here as in the facts)."""
    h = m.get("host") or {}
    # memory_gb and cpu_cores are already the smaller of the machine's and the cgroup's; a
    # report that also carries the cgroup's figures gets the judgement to say so
    return Resources(cpu_cores=h.get("cpu_count", h.get("cpu_cores")),
                     memory_gb=h.get("meminfo_gb", h.get("memory_gb")),
                     memory_limit_gb=h.get("memory_limit_gb"), cpu_limit=h.get("cpu_quota"),
                     free_disk_gb={d["path"]: d["free_gb"] for d in h.get("disks") or []
                                   if d.get("free_gb") is not None},
                     disk_total_gb={d["path"]: d["total_gb"] for d in h.get("disks") or []
                                    if d.get("total_gb") is not None},
                     gpu_memory_gb=tuple(round(g["memory_gb"] * 1e9 / 2**30, 1)
                                         for g in m.get("gpus") or [] if g.get("memory_gb")))


def read_bench(result: Any) -> Outcome:
    return Outcome(report=dict_result(result, "bench"), report_kind="bench")


def bench_step(facts: HostFacts, lay: Layout, settings: Settings,
               choice: TorchChoice | None, download_mb: int = 50) -> Step:
    """The standard benchmark (templates/gpu/bench_gpu.py) in the env; downloads from every mirror."""
    m = settings.mirrors
    arch = facts.arch or "x86_64"
    variant = choice.cuda if choice else "cpu"
    mirrors = [{"kind": "miniconda", "url": f"{b.rstrip('/')}/Miniconda3-latest-Linux-{arch}.sh"}
               for b in m.miniconda]
    mirrors += [{"kind": "pypi", "url": f"{b.rstrip('/')}/torch/"} for b in m.pypi]
    mirrors += [{"kind": "pytorch", "url": variant_index(b, variant, "torch")} for b in m.pytorch]
    config = {"data_dir": data_dir(facts, settings), "mirrors": mirrors, "download_mb": download_mb}
    body = bench_body(lay.python_bin, config)
    return Step("bench", f"the standard suite; {len(mirrors)} mirror(s), at most {download_mb} MiB "
                "each", action="run bench_gpu.py", body=body, inputs=inputs_hash(config=config),
                read=read_bench)


def bench_report(report: Mapping[str, Any], target: Target, settings: Settings) -> dict[str, Any]:
    """gpu/bench_gpu.py's figures with what compare joins them by: host, inventory, platform, the GPU
    advertised and its price, and when."""
    return {**report, "host": target.name,
            "inventory": str(target.source) if target.source else None,
            "platform": settings.platform, "advertised": settings.gpu,
            "price_per_hour": settings.price_per_hour, "currency": settings.currency,
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def data_dir(facts: HostFacts, settings: Settings) -> str | None:
    return expand_home(settings.data_dir, facts.home) if settings.data_dir else None


def verify_expectations(facts: HostFacts, lay: Layout, settings: Settings,
                        choice: TorchChoice | None) -> dict[str, Any]:
    """What the shipped testinfra suite (provision/verify) checks the host against; kept on the
    host as ~/.gpu-provision/expected.json so `pytest --hosts=...` needs nothing else."""
    torch, cuda = (choice.torch, choice.cuda_version) if choice else (None, None)  # kept or new
    ours = lay.conda and (f"{lay.conda_root}/bin/conda" not in facts.conda or
                          facts.journal.get("conda", {}).get("result") == "ok")  # our .condarc
    # an image's venv, or ours over its system python, has no conda (conda_root null); ours
    # names the image's python it runs (base_python)
    over = {"base_python": lay.base} if lay.base else {}
    return {"conda_root": lay.conda_root or None, "env_prefix": lay.env_prefix, **over,
            "python": None if lay.adopted else settings.python, "torch": torch, "torch_cuda": cuda,
            "gpus": [g.name for g in facts.gpus], "driver": facts.driver,
            "conda_channels": list(settings.mirrors.conda_channels) if ours else None,
            "pypi": list(configured_pypi(settings)) if ours else None}


def validation_config(facts: HostFacts, settings: Settings) -> dict[str, Any]:
    """What validate_gpu.py judges against: the GPU count seen now, the advertised GPU, the
    recipe's thresholds and the reference figures of the GPUs present."""
    refs = {g.name: ref for g in facts.gpus if (ref := gpu_reference(g.name))}
    return {"expected_gpus": len(facts.gpus), "advertised": parse_gpu_claim(settings.gpu),
            # the minimums among them are judged here, on what it measures (read_validation)
            "thresholds": dict(settings.validation), "reference": refs,
            "data_dir": data_dir(facts, settings)}


def parse_gpu_claim(claim: str | None) -> dict[str, Any] | None:
    """``RTX 4090 x2`` or ``2x RTX 4090`` -> {"model": "RTX 4090", "count": 2}; no count means
    one (the inventory's validator has checked the shape)."""
    if not claim:
        return None
    model, count = split_gpu_claim(claim)
    return {"model": model, "count": count or 1}


@cache
def _perf_table() -> tuple[float, dict[str, dict[str, Any]]]:
    raw = yaml.safe_load(data_file("gpu_perf.yaml").read_text())
    return float(raw["floor_of_sustained"]), dict(raw["gpus"])


def _words(name: str) -> frozenset[str]:
    return frozenset(w for w in re.split(r"[\s_\-]+", name.lower()) if w)


def gpu_model(name: str) -> str | None:
    """The gpu_perf.yaml key for the GPU nvidia-smi calls ``name``: every word of the key a
    whole word of the name, the key with most words winning ("L4" is not "NVIDIA L40";
    "H100 NVL" beats "H100")."""
    have = _words(name)
    hits = [k for k in _perf_table()[1] if _words(k) <= have]
    return max(hits, key=lambda k: len(_words(k)), default=None)


def gpu_reference(name: str) -> dict[str, Any] | None:
    """What validation judges a GPU by: the datasheet's dense peaks, the healthy floor per type
    (floor_of_sustained x the published sustained figure), memory bandwidth, SM count, sources."""
    model = gpu_model(name)
    if model is None:
        return None
    share, table = _perf_table()
    row = table[model]
    floor = {k: round(share * v, 1) for k, v in (row.get("sustained") or {}).items() if v}
    return {"model": model, "peak": dict(row.get("peak") or {}), "floor": floor,
            "sustained": dict(row.get("sustained") or {}), "mem_gbs": row.get("mem_gbs"),
            "sms": row.get("sms"), "memory_gb": row.get("memory_gb"), "source": row.get("source"),
            "sustained_source": row.get("sustained_source")}
