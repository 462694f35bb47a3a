"""Host-specific words for the GPU, training and data entries: which GPU and driver this host
has, its RAM, its network interface, the torch build in the env, the Hub mirror it is set up
with. Same shape as fixes_env: (match values, host, normalised text) -> placeholders.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .context import HostView

Values = Mapping[str, str]


def gpu_ref(values: Values) -> str:
    bus = values.get("bus")
    return f"GPU {bus}" if bus else "The GPU"


def holders(values: Values, h: HostView, text: str) -> dict[str, str]:
    """Who else holds the GPU's memory: the host's GPU processes, else the ones the message
    names ("Process 1246069 has 577.00 MiB memory in use")."""
    f = h.facts
    if f is not None and f.gpu_processes:
        procs = ", ".join(f"{p.name} (pid {p.pid}, {p.used_memory_mib or '?'} MiB)"
                          for p in f.gpu_processes[:5])
        return {"holders": f" On the host now: {len(f.gpu_processes)} process(es) already run "
                           f"on it: {procs}."}
    if f is not None:
        used = [g for g in f.gpus if (g.memory_used_mib or 0) > 512]
        if used:
            return {"holders": " On the host now: " + "; ".join(
                f"GPU {g.index} has {g.memory_used_mib} MiB of {g.memory_total_mib} MiB in use"
                for g in used) + "."}
    named = re.findall(r"Process (\d+) has ([\d.]+ [KMGT]?i?B) memory in use", text)
    if named:
        return {"holders": " Other processes held memory on that GPU when it failed: "
                           + ", ".join(f"pid {pid} ({size})" for pid, size in named[:5]) + "."}
    return {"holders": ""}


def container_cuda(values: Values, h: HostView, text: str) -> dict[str, str]:
    f = h.facts
    hint = f" (CUDA {f.driver_cuda} or older here)" if f is not None and f.driver_cuda else ""
    return {"image_hint": hint}


def gsp(values: Values, h: HostView, text: str) -> dict[str, str]:
    return {"gpu_ref": gpu_ref(values)}


def module_key(values: Values, h: HostView, text: str) -> dict[str, str]:
    mod = values.get("mod")
    return {"mod_text": f" ({mod})" if mod else ""}


def rendezvous_port(values: Values, h: HostView, text: str) -> dict[str, str]:
    port = values.get("port") or ""
    if not port:
        m = re.search(r"port: (\d+)|\]:(\d+) \(errno: 98", text)
        port = (m.group(1) or m.group(2)) if m else ""
    return {"port_text": f" ({port})" if port else "", "port_or": port or "29500"}


def cuda_checkpoint(values: Values, h: HostView, text: str) -> dict[str, str]:
    env = h.env
    f = h.facts
    note = ""
    if env is not None and env.torch and env.torch_cuda is None:
        note = f" The env's torch is the CPU build ({env.torch}): that is why."
    elif f is not None and not f.gpus and not f.pci_gpus:
        note = " This host has no NVIDIA GPU."
    if f is not None and not f.gpus and not f.pci_gpus:
        fix = ("This machine has no GPU: load onto the CPU with "
               "`torch.load(path, map_location='cpu')` (or rent a GPU machine).")
    else:
        fix = ("If this machine has a GPU, torch is the CPU build or cannot reach the driver: "
               f"reinstall the CUDA build ({h.reinstall_torch()}) and check "
               "`python -c 'import torch; print(torch.cuda.is_available())'`; on a CPU-only "
               "machine load with `torch.load(path, map_location='cpu')`.")
    return {"cpu_torch_text": note, "cuda_ckpt_fix": fix}


def cublas_failed(values: Values, h: HostView, text: str) -> dict[str, str]:
    gpu = h.gpu_text()
    old = h.cuda_major is not None and h.cuda_major < 11
    fix = (f"Install a torch build made for this GPU: `gpu-provision -H {h.name} torch` picks "
           "one (Ampere and newer need CUDA 11+ builds, RTX 50xx/B200 need CUDA 12.8+ builds); "
           "if the build is right, check tensor shapes and free GPU memory.")
    if old:
        fix = f"The env's torch is a CUDA {h.cuda_major} build, too old for this GPU. " + fix
    return {"gpu_arch": gpu, "cublas_fix": fix}


def host_ram(values: Values, h: HostView, text: str) -> dict[str, str]:
    nbytes = values.get("nbytes")
    alloc = f"{int(nbytes) / 2**30:.1f} GiB" if nbytes and nbytes.isdigit() else "a block"
    return {"alloc_text": alloc}


def hf_repo(values: Values, h: HostView, text: str) -> dict[str, str]:
    repo = values.get("repo")
    return {"repo_text": f" ({repo})" if repo else "",
            "repo_url": f" (https://huggingface.co/{repo})" if repo else ""}


def hf_unreachable(values: Values, h: HostView, text: str) -> dict[str, str]:
    hub = values.get("hubhost") or values.get("hubhost2")
    mirror = (h.facts.mirrors.get("huggingface") or h.facts.mirrors.get("hf")) \
        if h.facts is not None else None
    return {"hub_text": f" ({hub})" if hub else "",
            "hf_mirror_text": f" (this host is set up with {mirror})" if mirror else ""}


def repo_not_found(values: Values, h: HostView, text: str) -> dict[str, str]:
    repo = values.get("repo")
    return {"repo_text": f"'{repo}'" if repo else "the id asked for"}


def space(values: Values, h: HostView, text: str) -> dict[str, str]:
    """The disk with the most free space here, for caches and checkpoints."""
    big = h.biggest_disk()
    path = values.get("path")
    return {"space_text": f" (the disk with most room here is {big})" if big else "",
            "big_dir": big or "/path/with/space",
            "path_text": f" ({path})" if path else ""}


def model_dir(values: Values, h: HostView, text: str) -> dict[str, str]:
    d = values.get("dir")
    return {"dir_text": f" ({d})" if d else ""}


def no_driver(values: Values, h: HostView, text: str) -> dict[str, str]:
    """Which of the reasons holds here, from the facts."""
    f = h.facts
    generic = ("On a machine meant to have a GPU: check `nvidia-smi`; install the driver "
               f"(`gpu-provision -H {h.name} driver`) or, in a container, start it with its GPUs "
               "(`docker run --gpus all`, or the provider's GPU option). On a machine without "
               "one, run on the CPU: map_location='cpu' for checkpoints and no .cuda() / "
               "device='cuda' in the code (or rent a GPU machine).")
    if f is None:
        return {"no_driver_why": "", "no_driver_fix": generic}
    if not f.pci_gpus and not f.gpus:
        return {"no_driver_why": " This machine has no NVIDIA GPU on its PCI bus.",
                "no_driver_fix": "Rent a machine with a GPU (or attach one in the provider's "
                                 "console), or run on the CPU: map_location='cpu' and no .cuda()."}
    if f.virtualization.kind == "container":
        return {"no_driver_why": " This is a container.",
                "no_driver_fix": "Start the container with its GPUs (`docker run --gpus all`, or "
                                 "the provider's GPU option); nothing inside it can add the driver."}
    return {"no_driver_why": f" The GPU is there ({', '.join(g.name for g in f.pci_gpus) or 'NVIDIA'})"
                             " but the driver is not working.",
            "no_driver_fix": f"Install the driver: `gpu-provision -H {h.name} driver` (then "
                             "`nvidia-smi` must list the GPU)."}


RUN_SPECIFICS = {
    "hf-rate-limited": hf_unreachable,
    "torch-finds-no-driver": no_driver,
    "hf-cant-load-from-hub": hf_unreachable,
    "hf-weights-missing-in-dir": model_dir,
    "hf-cache-no-space": space,
    "checkpoint-write-failed": space,
    "gpu-busy-or-exclusive": holders,
    "cudnn-internal-error": holders,
    "container-cuda-too-new": container_cuda,
    "gsp-rpc-timeout": gsp,
    "module-key-rejected": module_key,
    "rendezvous-port-in-use": rendezvous_port,
    "cuda-checkpoint-without-cuda": cuda_checkpoint,
    "cublas-execution-failed": cublas_failed,
    "host-ram-allocation-failed": host_ram,
    "hf-gated-repo": hf_repo,
    "hf-hub-unreachable": hf_unreachable,
    "hf-repo-not-found": repo_not_found,
}
