"""The compatibility data the wheel rule reads (provision/tables/compat.yaml), typed once:
NVIDIA's driver -> CUDA table, the minor-compatibility floors, each torch release's variants
and the GPU architectures each variant ships kernels for."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from packaging.version import InvalidVersion, Version

from ..config.yamlspec import fast_load
from ..errors import ConfigError

CUDA_ARCHES = ("x86_64",)  # the variant and arch tables describe Linux x86_64 wheels


def dotted(text: str) -> tuple[int, ...]:
    """``"550.54.14"`` -> ``(550, 54, 14)``; versions of drivers and CUDA compare as int tuples."""
    if not re.fullmatch(r"\d+(\.\d+)*", text.strip()):
        raise ValueError(f"not a dotted version: {text!r}")
    return tuple(int(p) for p in text.strip().split("."))


def _driver_text(value: object) -> str:
    text = str(value)
    dotted(text)  # validate
    return text


def cc_text(cc: tuple[int, int]) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def parse_compute_cap(text: str) -> tuple[int, int]:
    """``"8.6"`` -> ``(8, 6)``; also accepts ``sm_86`` and ``86``."""
    t = text.strip().lower().removeprefix("sm_")
    m = re.fullmatch(r"(\d+)\.(\d)", t) or re.fullmatch(r"(\d+)(\d)", t)
    if not m:
        raise ValueError(f"not a compute capability: {text!r} (expected like 8.6 or sm_86)")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class Release:
    version: Version
    torchvision: str | None
    torchaudio: str | None
    python: tuple[tuple[int, ...], tuple[int, ...]]
    glibc: tuple[int, ...]
    glibc_by_variant: dict[str, tuple[int, ...]]
    variants: dict[str, tuple[tuple[int, int], ...]]  # variant -> SASS compute capabilities

    def glibc_for(self, variant: str) -> tuple[int, ...]:
        return self.glibc_by_variant.get(variant, self.glibc)


@dataclass(frozen=True)
class CompatData:
    cuda_min_driver: dict[tuple[int, ...], str]  # driver text keeps NVIDIA's spelling (560.28.03)
    mvc_floor: dict[str, str]
    variant_cuda: dict[str, tuple[int, ...]]
    releases: tuple[Release, ...]  # newest first
    default_index: str
    miniconda_min_glibc: tuple[int, ...]  # what "latest" installers need
    miniconda_old_glibc: str  # the installer version used below that

    def max_cuda_for_driver(self, driver: tuple[int, ...]) -> tuple[int, ...] | None:
        """Rule 1's fallback: the highest CUDA whose Table 3 minimum driver is <= ``driver``."""
        ok = [cuda for cuda, floor in self.cuda_min_driver.items() if dotted(floor) <= driver]
        return max(ok) if ok else None

    def native_driver(self, variant: str) -> str:
        return self.cuda_min_driver[self.variant_cuda[variant]]

    def minor_floor(self, variant: str) -> str:
        """The lowest driver that runs ``variant`` under minor-version compatibility."""
        floor = self.minor_floor_of(self.variant_cuda[variant])
        assert floor is not None  # every variant's CUDA has a native driver in the data
        return floor

    def minor_floor_of(self, cuda: tuple[int, ...]) -> str | None:
        """The lowest driver that runs CUDA ``cuda`` under minor-version compatibility: the
        release's own floor, else its family's (CUDA 11 on), else its native driver (no MVC
        before CUDA 11); None for a CUDA the data does not know."""
        exact = self.mvc_floor.get(".".join(map(str, cuda[:2])))
        family = self.mvc_floor.get(str(cuda[0]))
        if exact is not None:
            return exact
        if family is not None and cuda[0] >= 11:
            return family
        native = self.cuda_min_driver.get(tuple(cuda[:2]))
        return native

    def driver_allows(self, cuda: tuple[int, ...], driver: tuple[int, ...],
                      max_cuda: tuple[int, ...] | None, policy: str) -> bool:
        """THE rule for "does this driver run this CUDA": within the driver's maximum CUDA, or
        (``policy`` "minor") a driver at least at that CUDA's minor-compatibility floor. Used by
        the pick (choose_torch) and by the judge of an installed torch (check_installed)."""
        if max_cuda is not None and tuple(cuda[:2]) <= tuple(max_cuda[:2]):
            return True
        floor = self.minor_floor_of(cuda) if policy == "minor" else None
        return floor is not None and driver >= dotted(floor)


def _load(text: str, path: str) -> CompatData:
    raw: Any = fast_load(text)  # libyaml where there is one: start-up
    try:
        arch_lists = {k: tuple(parse_compute_cap(c) for c in v) for k, v in raw["arch_lists"].items()}
        releases = []
        for ver, r in raw["releases"].items():
            releases.append(Release(
                version=Version(ver),
                torchvision=r.get("torchvision"),
                torchaudio=r.get("torchaudio"),
                python=(dotted(r["python"][0]), dotted(r["python"][1])),
                glibc=dotted(r["glibc"]),
                glibc_by_variant={k: dotted(v) for k, v in (r.get("glibc_by_variant") or {}).items()},
                variants={v: arch_lists[a] for v, a in r["variants"].items()},
            ))
        data = CompatData(
            cuda_min_driver={dotted(k): _driver_text(v) for k, v in raw["cuda_min_driver"].items()},
            mvc_floor={str(k): _driver_text(v) for k, v in raw["mvc_floor"].items()},
            variant_cuda={k: dotted(v) for k, v in raw["variants"].items()},
            releases=tuple(sorted(releases, key=lambda r: r.version, reverse=True)),
            default_index=str(raw["default_index"]).rstrip("/"),
            miniconda_min_glibc=dotted(raw["miniconda"]["latest_min_glibc"]),
            miniconda_old_glibc=str(raw["miniconda"]["old_glibc_version"]),
        )
    except (KeyError, TypeError, ValueError, InvalidVersion) as exc:
        raise ConfigError(path, f"compatibility data is malformed: {exc!r}") from exc
    for rel in data.releases:
        for variant in rel.variants:
            if variant not in data.variant_cuda:
                raise ConfigError(path, f"unknown variant {variant!r}", key=f"releases.{rel.version}")
    return data


def compat_text() -> tuple[str, str]:
    """(text, path) of the shipped tables."""
    ref = resources.files("provision.tables").joinpath("compat.yaml")
    return ref.read_text(encoding="utf-8"), str(ref)


@cache
def load_compat() -> CompatData:
    """The shipped tables (read once per process)."""
    return _load(*compat_text())
