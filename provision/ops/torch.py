"""torch from the chosen PyTorch index only (checked by importing it), then the recipe's packages
with torch pinned."""

from __future__ import annotations

from functools import partial
from typing import Any

from ..compat import TorchChoice
from ..errors import ProvisionError
from ..facts.host import CondaEnv, HostFacts
from ..inventory import Settings
from ..templating import render
from .conda import MIRROR_TIMEOUT, configured_pypi, listed
from .installer import choose_installer
from .layout import INTERRUPTED, Layout, find_env
from .step import Outcome, Step, dict_result, inputs_hash, nothing


def torch_requirements(choice: TorchChoice, settings: Settings) -> list[str]:
    reqs = [f"torch=={choice.torch}"]
    if settings.domain_libraries:
        reqs += [f"{name}=={ver}" for name, ver in (("torchvision", choice.torchvision),
                                                     ("torchaudio", choice.torchaudio)) if ver]
    return reqs


def torch_matches(env: CondaEnv | None, choice: TorchChoice) -> bool:
    """The env's torch is the chosen release and build (PyPI-named CUDA builds have no +cuXXX)."""
    if env is None or env.torch is None:
        return False
    return env.torch.split("+")[0] == choice.torch and env.torch_cuda == choice.cuda_version


def read_torch(choice: TorchChoice, result: Any) -> Outcome:
    """The installed build must be the chosen one: same release, same CUDA (the body imported
    it and reported ``{"version", "cuda"}``)."""
    got = dict_result(result, "torch")
    want = choice.cuda_version
    if str(got.get("version", "")).split("+")[0] != choice.torch or got.get("cuda") != want:
        raise ProvisionError(f"installed torch {got.get('version')} (CUDA {got.get('cuda')}) is "
                             f"not the chosen {choice.label} (CUDA {want}); the index "
                             f"{choice.index_url} served another build")
    return Outcome(data=got)


def torch_step(facts: HostFacts, settings: Settings, lay: Layout, choice: TorchChoice) -> Step:
    env = find_env(facts, lay)
    repair = "torch" in facts.interrupted
    if torch_matches(env, choice) and not repair:
        return nothing("torch", f"{choice.label} already installed")
    if lay.adopted and env is not None and env.torch and not settings.torch:
        return nothing("torch", f"keep the platform's torch {env.torch} (set torch: in the "
                                f"recipe or inventory to replace it; the rule says {choice.label})")
    reqs = torch_requirements(choice, settings)
    indexes = tuple(f"{b.rstrip('/')}/{choice.cuda}" for b in settings.mirrors.pytorch)
    body = render("torch.sh.j2", python_bin=lay.python_bin, requirements=reqs, indexes=indexes,
                  mirror_timeout=MIRROR_TIMEOUT, repair=repair,
                  **choose_installer(facts, settings).template_vars())
    return Step("torch", INTERRUPTED if repair else "; ".join(choice.reasons),
                action=f"install {choice.label}", body=body,
                inputs=inputs_hash(reqs=reqs, index=indexes), repair=repair,
                read=partial(read_torch, choice))


def packages_step(facts: HostFacts, settings: Settings, lay: Layout) -> Step:
    if not settings.packages:
        return nothing("packages", f"recipe {settings.recipe} adds no packages")
    pypi = settings.mirrors.pypi
    h = inputs_hash(packages=settings.packages, pypi=pypi)
    done = facts.journal.get("packages", {})
    if done.get("inputs") == h and done.get("result") == "ok" and find_env(facts, lay) \
            and "packages" not in facts.interrupted:
        return nothing("packages", f"{' '.join(settings.packages)} installed (journal)")
    body = render("packages.sh.j2", python_bin=lay.python_bin, packages=settings.packages,
                  pypi=configured_pypi(settings), mirror_timeout=MIRROR_TIMEOUT,
                  **choose_installer(facts, settings).template_vars())
    return Step("packages", f"recipe {settings.recipe}, from {listed(pypi)}, torch pinned",
                action="install " + " ".join(settings.packages), body=body, inputs=h)
