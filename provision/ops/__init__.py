"""Operations: facts + desired state -> the remote scripts still needed (None means done).

Each ``Step`` is one remote execution when applied; its reason says why it runs or why not.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..command import quote
from ..compat import TorchChoice, dotted, load_compat
from ..facts.host import CondaEnv, HostFacts
from ..inventory import Settings
from ..recipes import Platform
from ..templating import render

DEFAULT_PYPI = "https://pypi.org/simple"
SECRETS_FILE = "~/.gpu-provision/env"
MIRROR_TIMEOUT = 10  # seconds a mirror has to answer before the next one listed is tried


@dataclass(frozen=True)
class Step:
    name: str
    action: str  # "none" when nothing is to be done
    reason: str
    body: str | None = None  # the bash body run under templates/step.sh.j2
    inputs: str = ""  # hash of what the step depends on (journal)
    stdin: str | None = None  # secret input: sent on stdin, run in the foreground, never logged

    @property
    def changes(self) -> bool:
        return self.body is not None


def inputs_hash(**values: Any) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Layout:
    """Where conda and the env live on the host (known before they exist)."""

    conda_root: str
    env_name: str
    adopted: bool

    @property
    def env_prefix(self) -> str:
        return self.conda_root if self.env_name == "base" else f"{self.conda_root}/envs/{self.env_name}"

    @property
    def python_bin(self) -> str:
        return f"{self.env_prefix}/bin/python"


def layout(facts: HostFacts, settings: Settings, platform: Platform) -> Layout:
    roots = [c.removesuffix("/bin/conda") for c in facts.conda]
    root = platform.conda_prefix if platform.conda_prefix in roots else (
        roots[0] if roots else platform.conda_prefix or f"{facts.home}/miniconda3")
    adopt = platform.adopt_env
    return Layout(conda_root=root, env_name=adopt or settings.env_name, adopted=bool(adopt))


def find_env(facts: HostFacts, lay: Layout) -> CondaEnv | None:
    return next((e for e in facts.envs if e.prefix == lay.env_prefix), None)


INTERRUPTED = "interrupted on the host before it finished (a reboot or a kill)"


def conda_step(facts: HostFacts, settings: Settings, lay: Layout) -> Step:
    partial = facts.conda_partial == lay.conda_root
    if f"{lay.conda_root}/bin/conda" in facts.conda and not partial:
        return Step("conda", "none", f"conda found at {lay.conda_root}")
    m = settings.mirrors
    arch = facts.arch or "x86_64"
    version, why = settings.miniconda_version, ""
    data = load_compat()
    if version == "latest" and facts.glibc and dotted(facts.glibc) < data.miniconda_min_glibc:
        version = data.miniconda_old_glibc
        why = (f"; glibc {facts.glibc} is older than the {'.'.join(map(str, data.miniconda_min_glibc))}"
               f" current installers need, so {version}")
    if partial:
        why += f"; an earlier install at {lay.conda_root} did not finish: it is cleared first"
    file = f"Miniconda3-{version}-Linux-{arch}.sh"
    body = render("conda.sh.j2", prefix=lay.conda_root, bases=m.miniconda, file=file,
                  sha256=settings.miniconda_sha256 or "", channels=m.conda_channels,
                  pypi=configured_pypi(settings), mirror_timeout=MIRROR_TIMEOUT)
    return Step("conda", f"{'redo: ' if partial else ''}install Miniconda at {lay.conda_root}",
                f"no conda on the host; {file} from {_listed(m.miniconda)}, sha256 checked{why}",
                body, inputs_hash(file=file, base=m.miniconda, channels=m.conda_channels,
                                  pypi=m.pypi))


def configured_pypi(settings: Settings) -> tuple[str, ...]:
    """The PyPI mirrors to configure; none when only pypi.org is listed (pip's default)."""
    return () if settings.mirrors.pypi == (DEFAULT_PYPI,) else settings.mirrors.pypi


def _listed(urls: tuple[str, ...]) -> str:
    return urls[0] + (f" (then {', '.join(urls[1:])})" if len(urls) > 1 else "")


def env_step(facts: HostFacts, settings: Settings, lay: Layout) -> Step:
    env = find_env(facts, lay)
    repair = "env" in facts.interrupted and not lay.adopted
    if env is not None and not repair:
        what = "adopt the platform's env" if lay.adopted else "env exists:"
        return Step("env", "none", f"{what} {lay.env_name!r} (python {env.python}, "
                                   f"torch {env.torch or 'none'})")
    if lay.adopted:
        return Step("env", "none", f"adopt the platform's env {lay.env_name!r} at {lay.env_prefix}")
    body = render("env.sh.j2", root=lay.conda_root, name=lay.env_name, python=settings.python,
                  channels=settings.mirrors.conda_channels, repair=repair)
    return Step("env", f"{'redo: ' if repair else ''}create {lay.env_name!r}",
                INTERRUPTED if repair else f"conda create -n {lay.env_name} python={settings.python}",
                body,
                inputs_hash(name=lay.env_name, python=settings.python))


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


def torch_step(facts: HostFacts, settings: Settings, lay: Layout, choice: TorchChoice) -> Step:
    env = find_env(facts, lay)
    repair = "torch" in facts.interrupted
    if torch_matches(env, choice) and not repair:
        return Step("torch", "none", f"{choice.label} already installed")
    if lay.adopted and env is not None and env.torch and not settings.torch:
        return Step("torch", "none", f"keep the platform's torch {env.torch} (set torch: in the "
                                     f"recipe or inventory to replace it; the rule says {choice.label})")
    reqs = torch_requirements(choice, settings)
    indexes = tuple(f"{b.rstrip('/')}/{choice.cuda}" for b in settings.mirrors.pytorch)
    body = render("torch.sh.j2", python_bin=lay.python_bin, requirements=reqs, indexes=indexes,
                  mirror_timeout=MIRROR_TIMEOUT, repair=repair)
    return Step("torch", f"{'redo: ' if repair else ''}install {choice.label}",
                INTERRUPTED if repair else "; ".join(choice.reasons), body,
                inputs_hash(reqs=reqs, index=indexes))


def packages_step(facts: HostFacts, settings: Settings, lay: Layout) -> Step:
    if not settings.packages:
        return Step("packages", "none", f"recipe {settings.recipe} adds no packages")
    pypi = settings.mirrors.pypi
    h = inputs_hash(packages=settings.packages, pypi=pypi)
    done = facts.journal.get("packages", {})
    if done.get("inputs") == h and done.get("result") == "ok" and find_env(facts, lay) \
            and "packages" not in facts.interrupted:
        return Step("packages", "none", f"{' '.join(settings.packages)} installed (journal)")
    body = render("packages.sh.j2", python_bin=lay.python_bin, packages=settings.packages,
                  pypi=configured_pypi(settings), mirror_timeout=MIRROR_TIMEOUT)
    return Step("packages", "pip install " + " ".join(settings.packages),
                f"recipe {settings.recipe}, from {_listed(pypi)}, torch pinned", body, h)


def secrets_step(facts: HostFacts, values: Mapping[str, str], digest: str) -> Step:
    """Push tokens (HF_TOKEN, ...) into a 0600 env file that login shells source. ``digest``
    is a keyed hash of the values, so the journal tells whether they changed without holding
    anything that reveals them."""
    names = " ".join(sorted(values))
    done = facts.journal.get("secrets", {})
    if done.get("inputs") == digest and done.get("result") == "ok":
        return Step("secrets", "none", f"{names} already on the host (journal)")
    content = "".join(f"export {k}={quote(v)}\n" for k, v in sorted(values.items()))
    return Step("secrets", f"push {names}", f"push_env in the inventory; into {SECRETS_FILE} "
                f"(mode 0600), sourced by ~/.bashrc", render("secrets.sh.j2", names=names,
                                                             inputs=digest), digest, content)


def forget_secrets_body() -> str:
    return render("secrets_forget.sh.j2")
