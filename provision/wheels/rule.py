"""The wheel rule: which torch release and CUDA variant fit a host's driver, GPUs and Python.

The tables live in ``provision/tables/compat.yaml``; this module only reads them and applies the
rule of PRODUCT.md "Compatibility data and the wheel rule":

1. driver max CUDA = what the driver reports, else the highest CUDA whose minimum driver <= it;
2. candidates = (release, variant) published for the host's Python (and glibc);
3. keep variants whose CUDA the driver allows (``strict``: native support; ``minor``: NVIDIA's
   minor-version floors, as uv does) and that ship SASS for EVERY GPU (sm_X.Y runs on X.Z, Z >= Y);
4. the torch spec filters releases (none means newest);
5. newest release with a survivor; within it the highest CUDA;
6. no GPU -> cpu; a GPU and no survivor -> NoWheelError naming the nearest fixes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from ..errors import NoWheelError, ProvisionError
from .data import CUDA_ARCHES, CompatData, Release, cc_text, dotted, load_compat, parse_compute_cap
from .simpleindex import variant_index

CudaCompat = Literal["strict", "minor"]
POLICIES: tuple[str, ...] = ("strict", "minor")
MINOR_RISK = (
    "cuda_compat=minor runs {variant} on driver {driver} through CUDA minor-version "
    "compatibility: PTX JIT from the newer toolkit fails (cudaErrorUnsupportedPtxVersion) and "
    "APIs that need a newer driver fail (cudaErrorCallRequiresNewerDriver); torch.compile/Triton "
    "and custom extensions may hit this. Driver >= {native} supports {cuda} natively."
)


@dataclass(frozen=True)
class TorchChoice:
    """The answer of the wheel rule; ``as_json()`` is the ``pick --json`` interface."""

    torch: str
    torchvision: str | None
    torchaudio: str | None
    cuda: str  # "cu124" or "cpu"
    index_url: str
    reasons: tuple[str, ...]
    risks: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "torch": self.torch,
            "torchvision": self.torchvision,
            "torchaudio": self.torchaudio,
            "cuda": self.cuda,
            "index_url": self.index_url,
            "reasons": list(self.reasons) + list(self.risks),
        }

    @property
    def label(self) -> str:
        return f"torch {self.torch}+{self.cuda}"

    @property
    def cuda_version(self) -> str | None:
        """What ``torch.version.cuda`` reports for this build ("13.0"; None for cpu)."""
        if self.cuda == "cpu":
            return None
        known = load_compat().variant_cuda.get(self.cuda)
        if known is not None:
            return ".".join(map(str, known[:2]))
        digits = self.cuda.removeprefix("cu")  # cu122 -> 12.2, cu92 -> 9.2
        return f"{digits[:-1]}.{digits[-1]}" if digits.isdigit() and len(digits) > 1 else None

    @property
    def requirements(self) -> tuple[str, ...]:
        """``torch==X`` and its companions (those it names) as pip requirements."""
        return tuple(f"{name}=={ver}" for name, ver in (
            ("torch", self.torch), ("torchvision", self.torchvision),
            ("torchaudio", self.torchaudio)) if ver)


def torch_spec(spec: str | None) -> SpecifierSet:
    """``2.5`` -> ``==2.5.*``; ``2.5.0`` -> exact; PEP 440 ranges as given; None -> any."""
    if spec is None or not spec.strip():
        return SpecifierSet()
    s = spec.strip()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return SpecifierSet(f"=={s}.*")
    if re.fullmatch(r"\d+\.\d+\.\d+", s):
        return SpecifierSet(f"=={s}")
    try:
        return SpecifierSet(s)
    except InvalidSpecifier:
        raise ProvisionError(
            f"torch spec {spec!r} is not valid: use 2.5 (any 2.5.x), 2.5.1 (exact) "
            "or a PEP 440 range such as >=2.4,<2.6"
        ) from None


def _ver(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def _covers(arches: Sequence[tuple[int, int]], cc: tuple[int, int]) -> bool:
    """SASS for X.Y runs on X.Z when Z >= Y, never across majors (PTX is not counted)."""
    return any(a[0] == cc[0] and a[1] <= cc[1] for a in arches)


def choose_torch(
    driver: str | None = None,
    compute_caps: Iterable[str | tuple[int, int]] = (),
    python: str = "3.11",
    torch: str | None = None,
    cuda_compat: str = "strict",
    glibc: str | None = None,
    driver_cuda: str | None = None,
    arch: str = "x86_64",
    index: str | None = None,
    data: CompatData | None = None,
) -> TorchChoice:
    """Apply the wheel rule.

    Args:
        driver: NVIDIA driver version (``"550.54.14"``); None for a host without a driver.
        compute_caps: one entry per GPU (``"8.6"`` or ``(8, 6)``); empty for no NVIDIA GPU.
        python: the env's Python (``"3.10"``).
        torch: a torch spec (``2.5``, ``2.5.1``, ``>=2.4,<2.6``); None means newest.
        cuda_compat: ``strict`` (driver must support the CUDA natively) or ``minor``.
        glibc: the host's glibc (``"2.17"`` on CentOS 7); None means new enough.
        driver_cuda: the max CUDA the driver reports (nvidia-smi header), if known.
        index: the PyTorch index prefix holding ``<variant>/`` (a mirror); default pytorch.org.

    Raises NoWheelError (exit code 2) when a GPU is present and nothing fits.

    >>> choose_torch(driver="550.54.14", compute_caps=["8.9"], python="3.10").label
    'torch 2.7.1+cu118'
    """
    return torch_candidates(driver, compute_caps, python, torch, cuda_compat, glibc, driver_cuda,
                            arch, index, data)[0]


def torch_candidates(
    driver: str | None = None,
    compute_caps: Iterable[str | tuple[int, int]] = (),
    python: str = "3.11",
    torch: str | None = None,
    cuda_compat: str = "strict",
    glibc: str | None = None,
    driver_cuda: str | None = None,
    arch: str = "x86_64",
    index: str | None = None,
    data: CompatData | None = None,
) -> tuple[TorchChoice, ...]:
    """Every (release, variant) the rule allows, best first: the newest release, within it the
    highest CUDA, then the next release. The first is ``choose_torch``'s answer; the rest are
    what a mirror that lags behind the data may still serve. Same arguments and errors as
    ``choose_torch``."""
    d = data or load_compat()
    if cuda_compat not in POLICIES:
        raise ProvisionError(f"cuda_compat must be one of {', '.join(POLICIES)}, not {cuda_compat!r}")
    try:
        py = dotted(python)[:2]
        libc = dotted(glibc) if glibc else None
        drv = dotted(driver) if driver else None
        caps = sorted({c if isinstance(c, tuple) else parse_compute_cap(c) for c in compute_caps})
        reported = dotted(driver_cuda)[:2] if driver_cuda else None
    except ValueError as exc:
        raise ProvisionError(str(exc)) from None
    spec = torch_spec(torch)
    base = (index or d.default_index).rstrip("/")
    reasons: list[str] = []

    def fits_host(rel: Release, variant: str) -> bool:
        return rel.python[0][:2] <= py <= rel.python[1][:2] and (
            libc is None or rel.glibc_for(variant) <= libc
        )

    releases = [r for r in d.releases if r.version in spec]
    if not releases:
        raise NoWheelError(f"no torch release in the data matches the spec {torch!r}; "
                           f"known: {d.releases[-1].version} .. {d.releases[0].version}")

    if not caps:
        cpu = [rel for rel in releases if fits_host(rel, "cpu")]
        if not cpu:
            raise NoWheelError(_no_cpu_message(releases, python, glibc))
        return tuple(_choice(rel, "cpu", base, [
            f"no NVIDIA GPU -> the CPU build; python {python} -> torch {rel.version} "
            f"({'newest' if i == 0 else 'next'}{' matching ' + torch if torch else ''})"])
            for i, rel in enumerate(cpu))

    if drv is None:
        raise NoWheelError(
            "GPU present but no NVIDIA driver answers; install or load the driver first "
            "(bootstrap does this on a VM), then pick again"
        )
    if arch not in CUDA_ARCHES:
        raise NoWheelError(f"CUDA wheel data covers {', '.join(CUDA_ARCHES)} only, not {arch}")

    max_cuda = reported or d.max_cuda_for_driver(drv)
    source = "reported by the driver" if reported else "from NVIDIA's driver table"
    reasons.append(f"driver {driver} supports CUDA <= {_ver(max_cuda) if max_cuda else '(none)'} "
                   f"({source})")
    reasons.append("GPUs: " + ", ".join(cc_text(c) for c in caps))

    def driver_allows(variant: str, policy: str) -> bool:
        assert drv is not None
        return d.driver_allows(d.variant_cuda[variant], drv, max_cuda, policy)

    out: list[TorchChoice] = []
    for rel in releases:
        survivors = [v for v in rel.variants
                     if fits_host(rel, v) and driver_allows(v, cuda_compat)
                     and all(_covers(rel.variants[v], c) for c in caps)]
        for best in sorted(survivors, key=lambda v: d.variant_cuda[v], reverse=True):
            why = ("newest release with kernels for every GPU within the driver's CUDA" if not out
                   else "next allowed")
            risks: tuple[str, ...] = ()
            if max_cuda is None or d.variant_cuda[best][:2] > max_cuda:
                risks = (MINOR_RISK.format(variant=best, driver=driver,
                                           native=d.native_driver(best),
                                           cuda=_ver(d.variant_cuda[best])),)
            out.append(_choice(rel, best, base, [
                *reasons, f"python {python} -> torch {rel.version}+{best} ({why}"
                          f"{'; spec ' + torch if torch else ''}) from {base}/{best}/"], risks))
    if out:
        return tuple(out)
    assert driver is not None  # drv was parsed from it
    raise NoWheelError(_nearest_fixes(d, releases, caps, driver, py, libc, cuda_compat, python,
                                      torch))


def _choice(rel: Release, variant: str, base: str, reasons: list[str],
            risks: tuple[str, ...] = ()) -> TorchChoice:
    return TorchChoice(
        torch=str(rel.version), torchvision=rel.torchvision, torchaudio=rel.torchaudio,
        cuda=variant, index_url=variant_index(base, variant), reasons=tuple(reasons), risks=risks,
    )


def _no_cpu_message(releases: list[Release], python: str, glibc: str | None) -> str:
    """Say which of Python and glibc rules every release out (glibc only when it is why)."""
    lo = min(r.python[0] for r in releases)
    hi = max(r.python[1] for r in releases)
    py = dotted(python)[:2]
    if lo[:2] <= py <= hi[:2] and glibc:
        oldest = min(r.glibc_for("cpu") for r in releases)
        return (f"no torch release runs on glibc {glibc} with python {python} (these releases "
                f"need glibc >= {_ver(oldest)})")
    return f"no torch release for python {python} (these releases cover {_ver(lo)}..{_ver(hi)})"


def first_build_with(cc: tuple[int, int]) -> tuple[str, str, str] | None:
    """The oldest (torch release, variant) with kernels for ``cc``, and the driver it needs."""
    d = load_compat()
    for rel in reversed(d.releases):
        for variant in sorted(rel.variants, key=lambda v: d.variant_cuda.get(v, ())):
            if variant in d.variant_cuda and _covers(rel.variants[variant], cc):
                return str(rel.version), variant, d.native_driver(variant)
    return None


def _nearest_fixes(d: CompatData, releases: list[Release], caps: list[tuple[int, int]],
                   driver: str, py: tuple[int, ...], libc: tuple[int, ...] | None,
                   policy: str, python: str, spec: str | None) -> str:
    """Name what would make a wheel fit: a newer driver, another Python, glibc, torch spec."""
    drv = dotted(driver)
    need = "driver" if policy == "strict" else "minor"
    arch_ok = [(r, v) for r in releases for v in r.variants
               if all(_covers(r.variants[v], c) for c in caps)]
    gpus = ", ".join(cc_text(c) for c in caps)
    if not arch_ok:
        everywhere = [(r, v) for r in d.releases for v in r.variants
                      if all(_covers(r.variants[v], c) for c in caps)]
        if not everywhere:
            span = f"{d.releases[-1].version}..{d.releases[0].version}"
            if len(caps) == 1:
                return (f"no torch wheel ({span}) ships kernels for {gpus}: this GPU is older "
                        "than every official PyTorch build; build PyTorch from source or rent a "
                        "newer GPU")
            return (f"no single torch wheel ({span}) ships kernels for all of {gpus}; "
                    "use GPUs of one generation (CUDA_VISIBLE_DEVICES) or rent a uniform host")
        newest = everywhere[0]
        return (f"no torch release matching {spec!r} ships kernels for {gpus}; torch "
                f"{newest[0].version}+{newest[1]} does: use torch spec {newest[0].version}")

    fixes: list[str] = []
    host_ok = [(r, v) for r, v in arch_ok
               if r.python[0][:2] <= py <= r.python[1][:2] and (libc is None or r.glibc_for(v) <= libc)]
    if host_ok:
        def floor(rv: tuple[Release, str]) -> tuple[int, ...]:
            return dotted(d.native_driver(rv[1]) if need == "driver" else d.minor_floor(rv[1]))
        lowest_rv = min(host_ok, key=floor)
        lowest = floor(lowest_rv)
        lowest_text = d.native_driver(lowest_rv[1]) if need == "driver" else d.minor_floor(lowest_rv[1])
        at_lowest = [rv for rv in host_ok if floor(rv) == lowest]
        first = min(at_lowest, key=lambda rv: rv[0].version)
        newest = max(at_lowest, key=lambda rv: rv[0].version)
        runnable = [(r, v) for r in releases for v in r.variants
                    if r.python[0][:2] <= py <= r.python[1][:2] and floor((r, v)) <= drv]
        missing = [c for c in caps if not any(_covers(r.variants[v], c) for r, v in runnable)]
        first_with = f", the first with {', '.join(cc_text(c) for c in missing)}" if missing else ""
        fixes.append(f"driver >= {lowest_text} allows torch "
                     f"{first[0].version.major}.{first[0].version.minor}+{first[1]}{first_with} "
                     f"(newest there: {newest[0].version}+{newest[1]})")
        if policy == "strict" and any(dotted(d.minor_floor(v)) <= drv for _, v in host_ok):
            fixes.append("or --cuda-compat minor (NVIDIA minor-version compatibility, with its risks)")
    else:
        pys = [r for r, _ in arch_ok if not (r.python[0][:2] <= py <= r.python[1][:2])]
        if pys:
            r = pys[0]
            fixes.append(f"python {_ver(r.python[0])}..{_ver(r.python[1])} allows torch {r.version} "
                         f"(python {python} is outside every matching release)")
        if libc is not None and all(r.glibc_for(v) > libc for r, v in arch_ok):
            fixes.append(f"glibc >= {_ver(min(r.glibc_for(v) for r, v in arch_ok))} (a newer distro) "
                         f"is needed: glibc {_ver(libc)} is too old for every matching wheel")
    return f"no torch wheel fits driver {driver} with {gpus} and python {python}: " + "; ".join(fixes)

