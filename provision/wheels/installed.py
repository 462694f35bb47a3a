"""A torch that is already installed, judged by the same rule as a new pick: its CUDA within
the driver's (or minor compatibility), kernels for every GPU by its release's arch list."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from .data import CompatData, cc_text, dotted, load_compat, parse_compute_cap
from .rule import TorchChoice, _covers, _ver, first_build_with
from .simpleindex import variant_index


def build_variant(version: str, torch_cuda: str | None) -> str:
    """The variant an installed torch was built as: ``2.1.0+cu121`` -> ``cu121``; a PyPI-named
    CUDA build (``2.5.1`` reporting CUDA 12.4) or a conda one -> ``cu124``; no CUDA -> ``cpu``."""
    m = re.match(r"(cu\d+|cpu)\b", version.partition("+")[2])
    if m:
        return m.group(1)
    if torch_cuda:
        return "cu" + "".join(torch_cuda.split(".")[:2])
    return "cpu"


def installed_choice(version: str, torch_cuda: str | None, index: str | None = None,
                     reason: str = "") -> TorchChoice:
    """An installed torch as a TorchChoice (what validation and verify then expect)."""
    variant = build_variant(version, torch_cuda)
    base = (index or load_compat().default_index).rstrip("/")
    return TorchChoice(torch=version.partition("+")[0], torchvision=None, torchaudio=None,
                       cuda=variant, index_url=variant_index(base, variant),
                       reasons=(reason,) if reason else ())


def short_gpu_name(name: str) -> str:
    """``NVIDIA GeForce RTX 5090`` -> ``RTX 5090``, ``NVIDIA H100 80GB HBM3`` -> ``H100 80GB HBM3``."""
    return re.sub(r"^(?:NVIDIA\s+)?(?:GeForce\s+)?", "", name.strip()) or name


@dataclass(frozen=True)
class BuildCheck:
    """The wheel rule applied to a torch that is already installed."""

    ok: bool
    reason: str  # why it fails, or what it was checked against


def check_installed(version: str, torch_cuda: str | None, driver: str | None,
                    driver_cuda: str | None, gpus: Sequence[tuple[str, str]],
                    cuda_compat: str = "strict", data: CompatData | None = None) -> BuildCheck:
    """Is an installed torch (``torch.__version__`` and ``torch.version.cuda``) one the rule
    would accept here? On a GPU host it must be a CUDA build, its CUDA within the driver's, with
    kernels for every GPU (``gpus``: (name, compute capability) per GPU) by the shipped arch
    list of its release and variant. A release the data does not have is judged by the arch
    list of the nearest release with that variant, and says so; a variant the data does not
    have cannot be judged and fails. Without a GPU every build runs.

    >>> check_installed("2.1.0+cu121", "12.1", "570.26", "12.8", [("NVIDIA GeForce RTX 5090", "12.0")]).reason
    'torch 2.1.0+cu121 has no sm_120 kernels; RTX 5090 needs cu128 or later'
    """
    d = data or load_compat()
    label = f"torch {version}" if "+" in version or torch_cuda is None else \
        f"torch {version} (CUDA {torch_cuda})"
    if not gpus:
        return BuildCheck(True, "no NVIDIA GPU: any build runs")
    names = _gpu_names([n for n, _ in gpus])
    variant = build_variant(version, torch_cuda)
    if variant == "cpu" or torch_cuda is None:
        return BuildCheck(False, f"{label} is a CPU build; {names} need{'s' if len(gpus) == 1 else ''}"
                                 " a CUDA build")
    if driver is None:
        return BuildCheck(True, "judged again once the driver answers")
    try:
        caps = sorted({parse_compute_cap(cc) for _, cc in gpus if cc})  # "": model unknown
        cuda = dotted(torch_cuda)[:2]
        drv = dotted(driver)
        max_cuda = dotted(driver_cuda)[:2] if driver_cuda else d.max_cuda_for_driver(drv)
    except ValueError as exc:
        return BuildCheck(False, f"{label} cannot be checked: {exc}")
    if not d.driver_allows(cuda, drv, max_cuda, cuda_compat):
        have = _ver(max_cuda) if max_cuda else "(none)"
        return BuildCheck(False, f"{label} needs CUDA {torch_cuda}; driver {driver} supports "
                                 f"CUDA <= {have}")
    try:
        release = Version(version.partition("+")[0])
    except InvalidVersion:
        return BuildCheck(False, f"{label} cannot be checked: unreadable version")
    arches, note = _arches_of(d, release, variant)
    if arches is None:
        span = f"{d.releases[-1].version} .. {d.releases[0].version}"
        return BuildCheck(False, f"{label} is not in gpu-provision's compatibility data ({span}): "
                                 f"its kernels for {', '.join(cc_text(c) for c in caps)} cannot be "
                                 "checked")
    for cc in caps:
        if not _covers(arches, cc):
            holders = [n for n, c in gpus if c and parse_compute_cap(c) == cc]
            first = first_build_with(cc)
            need = f"{first[1]} or later" if first else "a build no official wheel has"
            return BuildCheck(False, f"{label} has no {cc_text(cc)} kernels{note}; "
                                     f"{_gpu_names(holders)} need{'s' if len(holders) == 1 else ''} "
                                     f"{need}")
    return BuildCheck(True, f"CUDA {torch_cuda} within the driver's, kernels for "
                            f"{', '.join(cc_text(c) for c in caps)}{note}")


def has_kernels(version: str, torch_cuda: str | None, caps: Sequence[tuple[int, int]],
                data: CompatData | None = None) -> bool | None:
    """Does this installed torch ship kernels for every one of ``caps`` (by its release's arch
    list, or the nearest release's with its variant)? None where that cannot be told: a CPU
    build, a variant the data does not have, a version that does not parse."""
    d = data or load_compat()
    variant = build_variant(version, torch_cuda)
    try:
        release = Version(version.split("+")[0])
    except InvalidVersion:
        return None
    if variant not in d.variant_cuda:
        return None
    arches, _ = _arches_of(d, release, variant)
    if arches is None or not caps:
        return None
    return all(_covers(arches, c) for c in caps)


def _gpu_names(names: Sequence[str]) -> str:
    """``2x RTX 3090``, ``RTX 3090, GTX 960``: each model once, with its count."""
    counts: dict[str, int] = {}
    for n in names:
        counts[short_gpu_name(n)] = counts.get(short_gpu_name(n), 0) + 1
    return ", ".join(f"{c}x {n}" if c > 1 else n for n, c in counts.items())


def _arches_of(d: CompatData, release: Version, variant: str
               ) -> tuple[tuple[tuple[int, int], ...] | None, str]:
    """The arch list of (release, variant), else the nearest release's with that variant."""
    for rel in d.releases:
        if rel.version == release and variant in rel.variants:
            return rel.variants[variant], ""
    with_variant = [r for r in d.releases if variant in r.variants]
    if not with_variant:
        return None, ""
    nearest = min(with_variant, key=lambda r: (abs(r.version.major - release.major) * 1000
                                               + abs(r.version.minor - release.minor),
                                               -r.version.micro))
    return nearest.variants[variant], (f" (not in the data: judged by torch {nearest.version}+"
                                       f"{variant}'s arch list)")
