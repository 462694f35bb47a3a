"""May a torch already on the host stay? The rule that picks a new torch, applied to one that
is there (a platform's env, an image's conda env, system python or venv, an env of ours)."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from ..config.inventory import Settings
from ..facts.host import CondaEnv, HostFacts, cc_from_name
from ..wheels.installed import BuildCheck, check_installed
from ..wheels.rule import torch_spec


def host_gpus(facts: HostFacts) -> list[tuple[str, str]]:
    """(name, compute capability or "") per GPU: nvidia-smi's, else the PCI bus's by name."""
    if facts.gpus:
        return [(g.name, g.compute_cap or cc_from_name(g.name) or "") for g in facts.gpus]
    if facts.pci_gpus:
        return [(g.name, cc_from_name(g.name) or "") for g in facts.pci_gpus]
    return [("the GPU", "")] if facts.has_nvidia_gpu else []


def judge_env_torch(facts: HostFacts, settings: Settings, env: CondaEnv) -> BuildCheck:
    """May the torch in ``env`` stay? The rule (a CUDA build on a GPU host, its CUDA within the
    driver's, kernels for every GPU) and a pinned ``torch:``, which it must match."""
    assert env.torch is not None
    driver = facts.driver if facts.nvidia_state == "ok" else None
    check = check_installed(env.torch, env.torch_cuda, driver, facts.driver_cuda,
                            host_gpus(facts), settings.cuda_compat)
    if not check.ok or not settings.torch:
        return check
    try:
        pinned = Version(env.torch.partition("+")[0]) in torch_spec(settings.torch)
    except InvalidVersion:
        pinned = False
    if not pinned:
        return BuildCheck(False, f"torch {env.torch} is not the torch {settings.torch} asked "
                                 f"({settings.how_asked('torch')})")
    return check
