"""Which package provides a shared object the loader could not find: the distro package for an
OS library (libGL.so.1 -> libgl1 / mesa-libGL), the pip wheel for a CUDA library torch loads
(libcudnn.so.9 -> nvidia-cudnn-cu12). The tables are data (doctor/libraries.yaml, with sources);
this module only reads them and picks the row and the CUDA variant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from ..errors import ConfigError
from .files import read_yaml, shipped

LIBRARIES = "libraries.yaml"


@dataclass(frozen=True)
class OsLibrary:
    soname: str
    apt: str | None
    apt_t64: str | None
    dnf: str | None
    pip: str | None
    # Debian 13's name where it differs from Ubuntu 24.04's t64 one (Open MPI 5 there)
    apt_debian13: str | None = None


@dataclass(frozen=True)
class CudaWheel:
    lib: str  # the soname's start, e.g. libcudnn
    wheel: str  # nvidia-cudnn
    suffixed_from_13: bool  # keeps the -cu13 suffix from CUDA 13 on (cuDNN, NCCL, cuSPARSELt)

    def name(self, cuda_major: int) -> str:
        """The wheel for a torch built with CUDA ``cuda_major``."""
        if cuda_major >= 13 and not self.suffixed_from_13:
            return self.wheel
        return f"{self.wheel}-cu{cuda_major}"


@dataclass(frozen=True)
class Tables:
    os_libraries: tuple[OsLibrary, ...]
    cuda_wheels: tuple[CudaWheel, ...]


@cache
def load_tables(name: str = LIBRARIES) -> Tables:
    path = shipped(name)
    raw = read_yaml(path) or {}
    try:
        libs = tuple(OsLibrary(soname=str(r["soname"]), apt=r.get("apt"), apt_t64=r.get("apt_t64"),
                               dnf=r.get("dnf"), pip=r.get("pip"),
                               apt_debian13=r.get("apt_debian13"))
                     for r in raw.get("libraries") or [])
        wheels = tuple(CudaWheel(lib=str(r["lib"]), wheel=str(r["wheel"]),
                                 suffixed_from_13=bool(r.get("suffixed_from_13", False)))
                       for r in raw.get("cuda_wheels") or [])
    except (KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(str(path), f"a row lacks a field or is not a mapping ({exc})") from None
    return Tables(libs, wheels)


def os_library(soname: str) -> OsLibrary | None:
    """The row for ``soname``: exact, else the same library with another version suffix."""
    libs = load_tables().os_libraries
    exact = next((r for r in libs if r.soname == soname), None)
    if exact is not None:
        return exact
    base = re.sub(r"\.so(?:\.\d+)*$", ".so", soname)
    return next((r for r in libs if re.sub(r"\.so(?:\.\d+)*$", ".so", r.soname) == base), None)


def cuda_wheel(soname: str) -> CudaWheel | None:
    """The nvidia-* wheel row for a CUDA library (the longest matching prefix)."""
    rows = sorted(load_tables().cuda_wheels, key=lambda r: len(r.lib), reverse=True)
    return next((r for r in rows if soname.startswith(r.lib + ".") or soname.startswith(r.lib + "_")
                 or soname.startswith(r.lib + "-")), None)


# The CUDA libraries whose soname major is the CUDA major (libcublas.so.12 ships with CUDA 12).
# cuFFT, cuRAND and cuSOLVER number themselves (CUDA 12 ships libcufft.so.11, libcurand.so.10),
# and so do cuDNN (.so.9) and NCCL (.so.2).
_CUDA_NUMBERED = ("libcudart", "libcublas", "libcublasLt", "libcusparse", "libnvrtc",
                  "libnvJitLink", "libcupti")


def cuda_major_of(soname: str) -> int | None:
    """The CUDA major a library's soname implies, where it implies one."""
    m = re.match(r"(lib\w+?)\.so\.(\d+)", soname)
    if m and m.group(1) in _CUDA_NUMBERED:
        major = int(m.group(2))
        return major if major >= 10 else None
    return None
