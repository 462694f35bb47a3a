"""Host-specific words for the install, import and build entries: the distro package or the
nvidia-* wheel that provides a missing library, the pip command of this env, the torch and CUDA
variant a build must match. Each function takes the match's values, the host and the normalised
text the signature was found in, and returns placeholders for the entry's texts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .context import HostView
from .libraries import cuda_major_of, cuda_wheel, os_library

Values = Mapping[str, str]


def wheel_fix(lib: str, h: HostView) -> tuple[str, str] | None:
    """(wheel name, how the CUDA variant was chosen) for a CUDA library, or None."""
    row = cuda_wheel(lib)
    if row is None:
        return None
    major = h.cuda_major
    why = f"this env's torch {h.torch}" if major is not None and h.torch else ""
    if major is None:
        major = cuda_major_of(lib)
        why = f"{lib}'s CUDA {major}" if major is not None else ""
    if major is None:
        return row.name(12), "a CUDA 12 torch (check `python -c 'import torch; print(torch.version.cuda)'`)"
    return row.name(major), why


def shared_object(values: Values, h: HostView, text: str) -> dict[str, str]:
    """A missing OS library: name the package of this distro (or both families)."""
    lib = values.get("lib", "the library")
    row = os_library(lib)
    if row is None:
        return {"so_why": f"{lib} is missing: the program or a package in the env loads it and the "
                          "loader found it nowhere (not in the system's libraries, the env's lib/ "
                          "or LD_LIBRARY_PATH). A name with a hash (libfoo-1a2b3c.so) ships inside "
                          "a wheel: then that package's files are incomplete.",
                "so_fix": f"Find the package that provides {lib} (`apt-file search {lib}` on "
                          f"Debian/Ubuntu, `dnf provides '*/{lib}'` on RHEL) and install it; a "
                          "wheel's own library comes back with a reinstall of that package "
                          f"(`{h.pip} install --force-reinstall <package>`)."}
    apt = row.apt_t64 if h.t64 and row.apt_t64 else row.apt
    if h.debian13 and row.apt_debian13:
        apt = row.apt_debian13
    why = f"{lib} is a system library the package needs; this OS{_os(h)} does not have it."
    fix = f"Install it: {h.install(apt, row.dnf)}."
    if h.family is None and row.apt_t64 and row.apt_debian13:
        fix += f" (Ubuntu 24.04+ names it {row.apt_t64}, Debian 13+ {row.apt_debian13}.)"
    elif h.family is None and row.apt_t64:
        fix += f" (Ubuntu 24.04+/Debian 13+ name it {row.apt_t64}.)"
    if row.pip:
        fix += (f" For OpenCV (cv2) the GUI-less wheel needs none of these libraries: "
                f"`{h.pip} uninstall -y opencv-python && {h.pip} install {row.pip}`.")
    return {"so_why": why, "so_fix": fix}


def _os(h: HostView) -> str:
    return f" ({h.os_label})" if h.os_label else ""


def symbol_shadowed(values: Values, h: HostView, text: str) -> dict[str, str]:
    lib = "libnccl.so.2" if values.get("sym") else "libnvJitLink.so.12"
    found = wheel_fix(lib, h)
    wheel = found[0] if found else "the nvidia-* wheel"
    return {"wheel_fix": f"`{h.pip} install --force-reinstall --no-deps {wheel}=="
                         "<the version torch requires>` (`pip show torch` lists them)"}


def glibcxx(values: Values, h: HostView, text: str) -> dict[str, str]:
    """Whose libstdc++ is too old: the conda env's own copy, or the OS's."""
    conda = re.search(r"(\S*/(?:envs/[^/\s]+|anaconda3|miniconda3|miniforge3|conda)[^\s:]*)"
                      r"/lib/libstdc\+\+\.so", text)
    if conda:
        return {"libstdcxx_where": " (the conda environment's own lib/libstdc++.so.6 is loaded first)",
                "glibcxx_fix": "Update the env's C++ runtime from conda-forge: `conda install -p "
                               f"{h.env_prefix} -c conda-forge 'libstdcxx-ng>=12'` (newer conda "
                               "names it libstdcxx); linking the system libstdc++ into the env's "
                               "lib/ also works while the OS's is the newer one."}
    return {"libstdcxx_where": f" (the operating system's{_os(h)})",
            "glibcxx_fix": "Install a newer libstdc++ where the program finds it: in a conda env "
                           f"`conda install -p {h.env_prefix} -c conda-forge 'libstdcxx-ng>=12'`, "
                           "or use a newer OS image (Ubuntu 22.04 has GLIBCXX_3.4.30); a build made "
                           "on this OS avoids it."}


def torchvision_pair(values: Values, h: HostView, text: str) -> dict[str, str]:
    choice = h.plan.torch if h.plan is not None else None
    if choice is not None and choice.torchvision:
        fix = (f"`{h.pip} install --force-reinstall torch=={choice.torch} "
               f"torchvision=={choice.torchvision} --index-url {choice.index_url}`")
    else:
        fix = ("`pip install --force-reinstall torchvision==<the release paired with your torch> "
               "--index-url <the index torch came from>` (`gpu-provision pick` names the pair)")
    pair = (f" (torch with CUDA {values['tcuda']}, torchvision with CUDA {values['vcuda']})"
            if values.get("tcuda") and values.get("vcuda") else "")
    return {"tv_text": f"; torch here is {h.torch}" if h.torch else "", "tv_fix": fix,
            "cuda_pair": pair}


# The pip name of modules a build commonly imports before declaring them.
_MODULE_PACKAGES = {"pkg_resources": "setuptools", "Cython": "cython", "cv2": "opencv-python-headless",
                    "yaml": "pyyaml", "PIL": "pillow", "sklearn": "scikit-learn"}


def build_isolation(values: Values, h: HostView, text: str) -> dict[str, str]:
    mod = (values.get("mod") or "torch").split(".")[0]
    pkg = _MODULE_PACKAGES.get(mod, mod)
    if mod == "torch" and h.torch:
        pkg = f"torch (here {h.torch}, already installed: keep it)"
    return {"mod": mod, "mod_pkg": pkg if " " not in pkg else "torch",
            "env_text": f": {h.env_prefix}" if h.env_prefix != "<env>" else ""}


def cuda_home(values: Values, h: HostView, text: str) -> dict[str, str]:
    f = h.facts
    torch_cuda = f"{h.cuda_major}" if h.cuda_major else "<torch's CUDA>"
    if f is not None and f.nvcc:
        return {"nvcc_text": f" (this host has nvcc {f.nvcc})",
                "cuda_home_fix": "nvcc is installed: point the build at its toolkit, e.g. "
                                 "`export CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH` "
                                 "(the directory whose bin/ holds nvcc), then build again."}
    nvcc_text = " (this host has no nvcc)" if f is not None else ""
    return {"nvcc_text": nvcc_text,
            "cuda_home_fix": "Install a CUDA toolkit of the same major version as torch's CUDA "
                             f"({torch_cuda}): `conda install -p {h.env_prefix} -c nvidia "
                             "cuda-toolkit=<torch's CUDA, e.g. 12.4>` or the distro's "
                             "cuda-toolkit-12-4 package; then `export CUDA_HOME=/usr/local/cuda` "
                             "(or the env prefix for conda's) and build again. A prebuilt wheel of "
                             "the package, where one exists, needs no toolkit."}


def cuda_mismatch(values: Values, h: HostView, text: str) -> dict[str, str]:
    nvcc = values.get("nvcc", "")
    torch_cuda = values.get("torchcuda", "")
    nvcc_major = nvcc.split(".")[0] if nvcc else "<nvcc's>"
    return {"mismatch_fix": f"Either install the torch build for CUDA {nvcc_major} (from the "
                            f"PyTorch index of that CUDA, https://download.pytorch.org/whl/"
                            f"cu{nvcc_major}X; `gpu-provision pick` lists the builds), or point "
                            f"CUDA_HOME at a CUDA {torch_cuda} toolkit (`conda install -c nvidia "
                            f"cuda-toolkit={torch_cuda}`, then export CUDA_HOME=<its prefix>). "
                            "Within one major version (12.1 vs 12.4) torch only warns."}


# The first CUDA toolkit whose nvcc compiles each architecture (NVIDIA CUDA Toolkit release
# notes: sm_86 in 11.1, sm_89 and sm_90 in 11.8, sm_100 and sm_120 in 12.8), and the older
# architecture whose code runs on it when the toolkit cannot be upgraded.
_ARCH_TOOLKIT = {"80": ("11.0", "7.5"), "86": ("11.1", "8.0"), "87": ("11.4", "8.6"),
                 "89": ("11.8", "8.6"), "90": ("11.8", "8.6"), "100": ("12.8", "9.0"),
                 "120": ("12.8", "9.0")}


def unsupported_arch(values: Values, h: HostView, text: str) -> dict[str, str]:
    arch = values.get("arch", "")
    num = re.sub(r"\D", "", arch)
    f = h.facts
    known = _ARCH_TOOLKIT.get(num)
    need = f"CUDA {known[0]} or newer" if known else "a newer CUDA toolkit"
    older = known[1] if known else "<an older compute capability>"
    return {"nvcc_text": f" (CUDA {f.nvcc})" if f is not None and f.nvcc else "",
            "arch_build_fix": f"Install {need} and build with it (CUDA_HOME pointing at it), or "
                              f"build for an older architecture this nvcc knows: "
                              f"`export TORCH_CUDA_ARCH_LIST=\"{older}\"` (runs, somewhat slower); "
                              "with CMake, -DCMAKE_CUDA_ARCHITECTURES="
                              f"{older.replace('.', '')}."}


def gcc_too_new(values: Values, h: HostView, text: str) -> dict[str, str]:
    top = values.get("max", "<N>")
    return {"gcc_install": h.install(f"gcc-{top} g++-{top}", f"gcc-toolset-{top}")}


def xformers(values: Values, h: HostView, text: str) -> dict[str, str]:
    have = values.get("have", "")
    if "+cpu" in have:
        return {"cpu_note": "; the installed torch is the CPU build, which is the real problem",
                "xformers_fix": f"Install the CUDA build of torch first ({h.reinstall_torch()}), "
                                "then the xformers made for that torch (the PyTorch index carries "
                                "them: `pip install -U xformers --index-url "
                                "https://download.pytorch.org/whl/<cuXXX>`)."}
    m = re.search(r"\+(cu\d+)", have)
    index = f"https://download.pytorch.org/whl/{m.group(1)}" if m else "https://download.pytorch.org/whl/<cuXXX>"
    return {"cpu_note": "",
            "xformers_fix": f"Reinstall xformers built for torch {have}: `{h.pip} install -U "
                            f"--force-reinstall --no-deps xformers --index-url {index}` (pick the "
                            "xformers release paired with that torch), or install the torch it "
                            f"was built for ({values.get('built', '')})."}


def python_headers(values: Values, h: HostView, text: str) -> dict[str, str]:
    ver = h.python_version
    pkg = f"python{ver}-dev" if ver else "python3-dev"
    return {"python_dev_fix": f"Install them: {h.install(pkg, 'python3-devel')}; a conda env's "
                              "Python has its own headers, so also check the build runs with the "
                              f"env's interpreter ({h.py})."}


def wheel_platform(values: Values, h: HostView, text: str) -> dict[str, str]:
    parts = values.get("wheel", "").rsplit("/", 1)[-1][:-len(".whl")].split("-")
    tag = parts[-3] if len(parts) >= 5 else ""
    need = f"3.{tag[3:]}" if re.fullmatch(r"cp3\d+", tag) else None
    have = h.python_version
    return {"pytag_text": f"Python {need} ({tag})" if need else f"another Python ({tag or '?'})",
            "plat": parts[-1] if len(parts) >= 5 else "another platform",
            "pyver_need": need or "<the wheel's Python>",
            "py_text": f" (this env runs Python {have})" if have else ""}


def uv_local(values: Values, h: HostView, text: str) -> dict[str, str]:
    m = re.search(r"download\.pytorch\.org/whl/(cu\d+|cpu|rocm[\d.]+)", text)
    choice = h.plan.torch if h.plan is not None else None
    local = m.group(1) if m else (choice.cuda if choice is not None else "cu124")
    index = (f"https://download.pytorch.org/whl/{local}" if m or choice is None
             else choice.index_url)
    return {"local": local, "index": index}


def pip_space(values: Values, h: HostView, text: str) -> dict[str, str]:
    big = h.biggest_disk()
    return {"tmp_text": f" (the disk with most room here is {big})" if big else "",
            "big_dir": big or "/path/with/space"}


def requires_python(values: Values, h: HostView, text: str) -> dict[str, str]:
    spec = values.get("spec") or values.get("spec2") or "another version"
    have = values.get("have") or h.python_version or "another version"
    return {"spec_text": spec, "have_text": have}


# transformers names the library as its docs do; pip names the package otherwise
_LIBRARY_PACKAGES = {"sentencepiece": "sentencepiece", "protobuf": "protobuf", "tiktoken": "tiktoken",
                     "accelerate": "accelerate", "bitsandbytes": "bitsandbytes",
                     "scipy": "scipy", "timm": "timm", "einops": "einops", "pytorch": "torch",
                     "vision": "pillow", "pillow": "pillow", "librosa": "librosa"}


def library_for_class(values: Values, h: HostView, text: str) -> dict[str, str]:
    lib = (values.get("libname") or "sentencepiece").lower()
    cls = values.get("cls")
    return {"pkg_name": _LIBRARY_PACKAGES.get(lib, lib),
            "cls_text": cls if cls else "Converting this tokenizer"}


def kernel_headers(values: Values, h: HostView, text: str) -> dict[str, str]:
    kver = values.get("kver") or (h.facts.kernel if h.facts is not None else None)
    k = kver or "$(uname -r)"
    return {"kernel_text": f" ({kver})" if kver else "",
            "headers_install": h.install(f"linux-headers-{k}", f"kernel-devel-{k} kernel-headers")}


ENV_SPECIFICS = {
    "python-library-missing-for-class": library_for_class,
    "kernel-headers-missing": kernel_headers,
    "shared-object-missing": shared_object,
    "cuda-lib-symbol-shadowed": symbol_shadowed,
    "glibcxx-too-old": glibcxx,
    "torchvision-mismatch": torchvision_pair,
    "torchvision-cuda-variant": torchvision_pair,
    "torchvision-newer-than-torch": torchvision_pair,
    "build-isolation-no-module": build_isolation,
    "cuda-home-not-set": cuda_home,
    "cuda-headers-missing": cuda_home,
    "nvcc-torch-cuda-mismatch": cuda_mismatch,
    "nvcc-unsupported-arch": unsupported_arch,
    "nvcc-gcc-too-new": gcc_too_new,
    "xformers-built-for-other-torch": xformers,
    "python-headers-missing": python_headers,
    "wheel-not-supported": wheel_platform,
    "uv-local-version": uv_local,
    "pip-no-space-tmp": pip_space,
    "pip-requires-python": requires_python,
}
