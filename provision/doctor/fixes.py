"""Host-specific words for the GPU and driver entries and the registry of all of them: the exact
wheel to reinstall, the first torch build with a GPU's architecture, the fabric manager package
of this driver, the nvidia-* wheel that carries a missing CUDA library for this torch.

Every function takes the match's values (named groups and check results), the host as doctor
knows it (``HostView``; facts and plan may be absent) and the normalised text the signature was
found in, and returns placeholders for the entry's diagnosis and fix. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from ..facts.fabric import fm_install_spec
from ..wheels.data import cc_text, dotted, load_compat, parse_compute_cap
from ..wheels.installed import has_kernels
from ..wheels.rule import first_build_with
from .context import HostView
from .fixes_env import ENV_SPECIFICS, wheel_fix
from .fixes_run import RUN_SPECIFICS, gpu_ref, holders

Values = Mapping[str, str]
Specific = Callable[[Values, HostView, str], "dict[str, str]"]


def torch_cpu_build(values: Values, h: HostView, text: str) -> dict[str, str]:
    choice = h.plan.torch if h.plan is not None else None
    if choice is not None and h.plan is not None and h.plan.layout is not None and choice.cuda != "cpu":
        return {"reinstall": f"Reinstall the CUDA build the wheel rule picks for this host: "
                             f"{h.plan.layout.python_bin} -m pip install --force-reinstall "
                             f"torch=={choice.torch} --index-url {choice.index_url} "
                             f"(or `gpu-provision -H {h.name} torch`)"}
    return {"reinstall": f"Reinstall torch from the PyTorch CUDA index: `gpu-provision -H {h.name} "
                         "torch` picks the build for the driver and GPU; by hand, `gpu-provision "
                         "pick --driver <version> --compute-cap <cc>` names the --index-url"}


def driver_too_old(values: Values, h: HostView, text: str) -> dict[str, str]:
    found = values.get("found", "")
    cuda = f"{int(found) // 1000}.{int(found) % 1000 // 10}" if found.isdigit() else None
    out = {"found_cuda": f" (the driver supports CUDA {cuda})" if cuda else ""}
    choice = h.plan.torch if h.plan is not None else None
    if h.facts is not None and h.facts.driver:
        out["driver_fix"] = (f"Either install the wheel the rule picks for driver {h.facts.driver}"
                             f" (`gpu-provision -H {h.name} torch`"
                             + (f": {choice.label}" if choice else "")
                             + f") or upgrade the driver (`gpu-provision -H {h.name} driver`).")
    else:
        out["driver_fix"] = ("Either upgrade the driver (`gpu-provision -H <host> driver`) or "
                             "install a wheel for the driver's CUDA: `gpu-provision pick "
                             "--driver <version>` names it.")
    return out


def gpu_arch(values: Values, h: HostView, text: str) -> dict[str, str]:
    caps: list[tuple[int, int]] = []
    if values.get("sm"):
        sm = values["sm"]
        caps = [(int(sm[:-1]), int(sm[-1]))]
    elif h.facts is not None:
        caps = [parse_compute_cap(c) for c in h.facts.compute_caps]
    env = h.env
    if caps and env is not None and env.torch and not values.get("sm") \
            and has_kernels(env.torch, env.torch_cuda, caps):
        # "no kernel image" where the env's own torch has this GPU's kernels: torch is not it
        return not_torchs_kernel(h, caps, env.torch)
    if not caps:
        fix = ("Install a build that lists this GPU's sm_XY in torch.cuda.get_arch_list(): "
               f"`gpu-provision -H {h.name} torch` picks one")
        return {"gpu_arch": "", "arch_fix": fix, "sm_fix": fix}
    fixes = []
    for cc in sorted(set(caps)):
        first = first_build_with(cc)
        fixes.append(f"torch {first[0]}+{first[1]} is the first build with {cc_text(cc)} "
                     f"(it needs driver >= {first[2]})" if first else
                     f"no official build has kernels for {cc_text(cc)}")
    fix = "; ".join(fixes) + f"; `gpu-provision -H {h.name} torch` installs the newest that fits"
    return {"gpu_arch": f" ({', '.join(cc_text(c) for c in caps)})", "arch_fix": fix,
            "sm_fix": fix}


def not_torchs_kernel(h: HostView, caps: list[tuple[int, int]], torch: str) -> dict[str, str]:
    """The kernel that is missing is an extension's (built from source for other GPUs, or a
    wheel without this architecture) or another interpreter's torch: which is named, and how
    to rebuild it for this GPU only."""
    archs = ", ".join(cc_text(c) for c in sorted(set(caps)))
    arch_list = ";".join(f"{c[0]}.{c[1]}" for c in sorted(set(caps)))
    diagnosis = (f"A CUDA kernel has no image for this GPU ({archs}), but the env's torch {torch} "
                 f"ships kernels for it: the kernel is an extension's (flash-attn, xformers, "
                 f"bitsandbytes, apex, a package built from source for other GPUs), or the job "
                 f"ran another Python whose torch lacks them.")
    fix = (f"The traceback's last frames name the package; rebuild it for this GPU: "
           f"TORCH_CUDA_ARCH_LIST=\"{arch_list}\" {h.pip} install --no-build-isolation "
           f"--no-cache-dir --force-reinstall --no-binary <package> <package>. Check that the job "
           f"runs {h.py} (`which python` in the job's shell: `gpu-provision -H {h.name} shell -- "
           f"which python`)")
    return {"__diagnosis__": diagnosis, "gpu_arch": f" ({archs})", "arch_fix": fix,
            "sm_fix": fix}


def fabric_manager(values: Values, h: HostView, text: str) -> dict[str, str]:
    driver = values.get("drv") or (h.facts.driver if h.facts is not None else None)
    if not driver:
        return {"fm_install": "Install the fabric manager of exactly the driver's version "
                              "(`nvidia-smi` shows it): Ubuntu `apt-get install "
                              "nvidia-fabricmanager-<branch>=<driver>-1` (from branch 580 the "
                              "package is `nvidia-fabricmanager=<driver>-1`), RHEL family `dnf "
                              "install nvidia-fabric-manager-<driver>` (from branch 580 "
                              "`nvidia-fabricmanager-<driver>`)"}
    if not driver.split(".")[0].isdigit():
        return {"fm_install": f"Install the fabric manager of exactly the driver's version ({driver})"}
    apt, dnf = fm_install_spec("apt", driver), fm_install_spec("dnf", driver)
    if h.family == "apt":
        how = f"`{h.sudo}apt-get install {apt}`"
    elif h.family == "yum":
        how = f"`{h.sudo}dnf install {dnf}`"
    else:
        how = f"Ubuntu `apt-get install {apt}`, RHEL family `dnf install {dnf}`"
    return {"fm_install": f"The driver here is {driver}: install the fabric manager of exactly "
                          f"that version, {how}"}


_ECC_WHAT = {
    "48": "an uncorrectable double-bit ECC error in its memory (Xid 48)",
    "63": "a memory row with ECC errors, now marked for remapping (Xid 63); the spare row is "
          "used only after a GPU reset or a reboot",
    "64": "a failed remapping of a bad memory row (Xid 64): its spare rows are used up",
    "94": "a contained uncorrectable ECC error (Xid 94): the process using that memory was "
          "stopped, the GPU keeps running",
    "95": "an uncontained uncorrectable ECC error (Xid 95): every process on the GPU is "
          "affected and the GPU needs a reset",
}


def ecc(values: Values, h: HostView, text: str) -> dict[str, str]:
    what = _ECC_WHAT.get(values.get("xid", ""), "an uncorrectable ECC error in its memory (CUDA "
                         "reports it to the process that touched that memory)")
    return {"gpu_ref": gpu_ref(values), "ecc_what": what}


def fallen(values: Values, h: HostView, text: str) -> dict[str, str]:
    return {"gpu_ref": gpu_ref(values)}


def extension(values: Values, h: HostView, text: str) -> dict[str, str]:
    """The library named before ": undefined symbol: <sym>" on the matched line, and the torch
    it has to be built for: the one in the env."""
    sym = values.get("sym", "")
    line = next((ln for ln in text.splitlines() if f"undefined symbol: {sym}" in ln), "")
    words = line.split(": undefined symbol:")[0].split()
    name = words[-1].rsplit("/", 1)[-1] if words else ""
    torch = h.torch
    return {"so": name if ".so" in name else "A compiled extension",
            "torch_here": f" (torch {torch} in this env)" if torch else "",
            "for_torch": f"torch {torch}" if torch else "this torch"}


def missing_lib(values: Values, h: HostView, text: str) -> dict[str, str]:
    """A CUDA or torch library torch's wheels (or a package built on them) load."""
    lib = values.get("lib", "the library")
    low = lib.lower()
    if low.startswith(("libc10", "libtorch", "libcaffe2", "libshm")):
        why = (f"{lib} is part of torch itself: the package that loads it was built for another "
               "torch (another version, or a CUDA build where a CPU build is installed), or "
               "torch's own files are incomplete.")
        fix = (f"Reinstall torch ({h.reinstall_torch()}), then the package that failed, "
               "in its build for exactly that torch.")
        return {"lib_why": why, "lib_fix": fix}
    found = wheel_fix(lib, h)
    if low.startswith("libcudart"):
        m = re.search(r"\.so\.(\d+)", lib)
        cuda = f"CUDA {m.group(1)}" if m else "another CUDA"
        wheel = f"nvidia-cuda-runtime-cu{m.group(1)}" if m else (found[0] if found else
                                                                "nvidia-cuda-runtime-cu12")
        why = (f"The package that loads {lib} was built for {cuda}, whose runtime is not "
               "installed (torch's wheels bring their own copy, which other packages do not see).")
        fix = ("Install that package's build for the CUDA your torch uses (`python -c \"import "
               "torch; print(torch.version.cuda)\"`"
               + (f"; here {h.torch}" if h.torch else "")
               + f"), or add the runtime it wants from pip: `{h.pip} install {wheel}`.")
        return {"lib_why": why, "lib_fix": fix}
    wheel = found[0] if found else "nvidia-cudnn-cu12, nvidia-cublas-cu12, ..."
    basis = f", the variant for {found[1]}" if found and found[1] else ""
    major = re.search(r"\.so\.(\d+)", lib)
    pin = (f"=={major.group(1)}.*" if found and major and low.startswith("libcudnn") else "")
    why = (f"torch's pip wheels load {lib} from the nvidia-* pip packages ({wheel} here{basis}): "
           "it is missing or not where torch looks (an install with --no-deps, an interrupted "
           "one, or pip splitting lib and lib64), or a package built for another CUDA wants it.")
    fix = (f"Reinstall torch with its dependencies: {h.reinstall_torch()}. A package that needs "
           f"this library beside torch gets it from `{h.pip} install '{wheel}{pin}'`. Do not "
           "point LD_LIBRARY_PATH at a system CUDA to paper over it.")
    return {"lib_why": why, "lib_fix": fix}


def glibc(values: Values, h: HostView, text: str) -> dict[str, str]:
    need = values.get("need", "")
    have = h.facts.glibc if h.facts is not None else None
    out = {"glibc_have": f"; this host has glibc {have}" if have else ""}
    releases = load_compat().releases
    if have:
        fits = [r for r in releases if r.glibc <= dotted(have)]
    elif need:
        fits = [r for r in releases if r.glibc < dotted(need)]
    else:
        fits = []
    out["glibc_torch"] = (f"the newest torch whose wheels run there is {fits[0].version} (glibc "
                          f"{'.'.join(map(str, fits[0].glibc))})" if fits else
                          "no torch release in gpu-provision's table runs on it")
    return out


def pip_no_match(values: Values, h: HostView, text: str) -> dict[str, str]:
    req = values.get("req", "")
    notes = []
    py = re.search(r"\bPython (3\.\d+)", text) or re.search(r"\bcp3(\d+)\b", text)
    python = (py.group(1) if py.group(1).startswith("3.") else f"3.{py.group(1)}") if py else None
    m = re.match(r"torch(?:===?(?P<ver>\d+\.\d+(?:\.\d+)?))?(?:\+\w+)?$", req)
    releases = load_compat().releases
    index = re.search(r"download\.pytorch\.org/whl/(cu\d+|cpu|rocm[\d.]+)\b", text)
    if m:
        if m.group("ver"):
            rel = next((r for r in releases if str(r.version) == m.group("ver")), None)
            what = f"torch {m.group('ver')}"
        elif index:
            rel = next((r for r in releases if index.group(1) in r.variants), None)
            what = f"the newest torch on the {index.group(1)} index, {rel.version}," if rel else ""
        else:
            rel, what = releases[0], f"the newest torch, {releases[0].version},"
        if rel is not None:
            lo, hi = (".".join(map(str, v)) for v in rel.python)
            notes.append(f"{what} has wheels for Python {lo} to {hi}")
    if python:
        notes.append(f"the Python in this log is {python}")
    elif h.python_version:
        notes.append(f"the env's Python is {h.python_version}")
    if h.plan is not None and h.plan.torch is not None:
        notes.append(f"the wheel rule picks {h.plan.torch.label} for this host")
    return {"pip_note": (" (" + "; ".join(notes) + ")") if notes else ""}


def forward_compat(values: Values, h: HostView, text: str) -> dict[str, str]:
    f = h.facts
    if f is not None and f.driver and f.driver_cuda:
        return {"driver_cuda_text": f" This host's driver {f.driver} supports CUDA "
                                    f"{f.driver_cuda} natively."}
    return {"driver_cuda_text": ""}


SPECIFICS: dict[str, Specific] = {
    "torch-cpu-build": torch_cpu_build,
    "driver-too-old": driver_too_old,
    "no-kernel-image": gpu_arch,
    "arch-not-compatible": gpu_arch,
    "fabric-manager-version": fabric_manager,
    "fabric-manager-not-running": fabric_manager,
    "fabric-manager-down": fabric_manager,
    "gpu-ecc-error": ecc,
    "gpu-fallen-off-bus": fallen,
    "rm-init-adapter-failed": fallen,
    "cuda-oom": holders,
    "cublas-not-initialized": holders,
    "cuda-lib-missing": missing_lib,
    "torch-extension-abi": extension,
    "glibc-too-old": glibc,
    "pip-no-matching-distribution": pip_no_match,
    "cuda-forward-compat": forward_compat,
    **ENV_SPECIFICS,
    **RUN_SPECIFICS,
}
