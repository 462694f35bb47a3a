"""``pick``'s command line, checked before the wheel rule runs: each mistake is one line naming
the option and what would be right (exit 2)."""

from __future__ import annotations

import re

from ..config import validators as v
from ..config.shipped import data_file
from ..config.yamlspec import fast_load
from ..errors import UsageError

SMI_CAP = "nvidia-smi --query-gpu=compute_cap --format=csv,noheader"


def known_compute_caps() -> list[str]:
    """Every compute capability an NVIDIA GPU has (provision/tables/gpus.yaml)."""
    return [str(x) for x in fast_load(data_file("gpus.yaml").read_text())["compute_capabilities"]]


def _cap(text: str, known: list[str]) -> str:
    t = text.strip().lower().removeprefix("sm_")
    m = re.fullmatch(r"(\d+)\.(\d)", t) or re.fullmatch(r"(\d+)(\d)", t)
    if not m:
        raise UsageError(f"--compute-cap: {text!r} is not a compute capability: write it like "
                         f"8.6 or sm_86 ({SMI_CAP} prints each GPU's)")
    cap = f"{int(m.group(1))}.{m.group(2)}"
    if cap not in known:
        raise UsageError(f"--compute-cap: no NVIDIA GPU has compute capability {cap} (known: "
                         f"{known[0]} .. {known[-1]}); {SMI_CAP} prints each GPU's")
    return cap


def check_pick(driver: str | None, compute_cap: str | None, python: str, torch: str | None,
               cuda_compat: str, glibc: str | None, index: str | None) -> list[str]:
    """The compute capabilities asked for; UsageError for the first option that cannot work."""
    caps_given = [x for x in (compute_cap or "").split(",") if x.strip()]
    if driver is not None and not re.fullmatch(r"\d+(\.\d+){1,2}", driver.strip()):
        raise UsageError(f"--driver: {driver!r} is not a driver version, e.g. 550.54.14 "
                         "(nvidia-smi --query-gpu=driver_version --format=csv,noheader)")
    if caps_given and not driver:
        raise UsageError("--compute-cap given without --driver: a GPU needs a driver (omit "
                         "both for a host without a GPU)")
    if driver and not caps_given:
        raise UsageError(f"--driver given without --compute-cap: the GPU is unknown, so no wheel "
                         f"can be checked against it; add --compute-cap ({SMI_CAP}), or omit "
                         "--driver for a host without a GPU")
    problems = [f"--python: {p}" for p in [v.python_version(python)] if p]
    problems += [f"--torch: {p}" for p in [v.torch_spec(torch) if torch else None] if p]
    problems += [f"--cuda-compat: {p}" for p in [v.one_of("strict", "minor")(cuda_compat)] if p]
    if glibc is not None and not re.fullmatch(r"\d+\.\d+", glibc.strip()):
        problems.append(f"--glibc: {glibc!r} is not a glibc version, e.g. 2.17 "
                        "(getconf GNU_LIBC_VERSION)")
    problems += [f"--index: {p}" for p in [v.url(index) if index else None] if p]
    if problems:
        raise UsageError(problems[0])
    known = known_compute_caps()
    return [_cap(x, known) for x in caps_given]
