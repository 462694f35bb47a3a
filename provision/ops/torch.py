"""torch: what is there is kept only when it passes the wheel rule, else the newest release the
rule allows AND the configured mirror serves is installed from the PyTorch index (checked by
importing it); then the recipe's packages with torch pinned.

The mirror is read on the host by the torch step itself (facts stay one execution): the step
is given every candidate the rule allows, best first, reads the index pages of their variants
(PEP 691 JSON where offered, else PEP 503 HTML), installs the first one served, and leaves what
it read in the state folder's ``index/``. The facts read that cache back, so later plans choose
among what the mirror serves and say when it lags. What was installed may differ from the
plan's choice, so the step settles: the engine re-reads the facts and re-plans, and the torch
now there passes the rule and is kept (nothing left to do).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..config.inventory import Settings
from ..config.shipped import package_source
from ..errors import ProvisionError
from ..facts.host import HostFacts
from ..remote.contract import CONTRACT, shown
from ..remote.templating import render
from ..wheels import simpleindex
from ..wheels.installed import installed_choice
from ..wheels.rule import TorchChoice
from .conda import configured_pypi, listed
from .installer import choose_installer
from .kept import judge_env_torch
from .layout import INTERRUPTED, Layout, find_env
from .space import figures, step_space, torch_kind
from .step import Outcome, Step, dict_result, inputs_hash, nothing

INDEX_DIR = CONTRACT.index  # under the host's $HOME: what the mirror served


def candidates_json(candidates: tuple[TorchChoice, ...], settings: Settings
                    ) -> list[dict[str, Any]]:
    """What the step and ``simpleindex.pick`` take: companions only when the recipe wants them."""
    libs = settings.domain_libraries
    return [{"torch": c.torch, "variant": c.cuda,
             "torchvision": c.torchvision if libs else None,
             "torchaudio": c.torchaudio if libs else None} for c in candidates]


def _ago(facts: HostFacts, at: float) -> str:
    minutes = max(0, int((facts.now - at) // 60)) if facts.now else 0
    return f"{minutes} min ago" if minutes < 120 else f"{minutes // 60} h ago"


@dataclass(frozen=True)
class MirrorChoice:
    choice: TorchChoice
    note: str  # what the plan says about the mirror


def mirror_choice(facts: HostFacts, settings: Settings, candidates: tuple[TorchChoice, ...],
                  python: str) -> MirrorChoice:
    """The first candidate the mirror serves by its cached answer; a variant not read yet is
    taken as served (the step confirms it before installing)."""
    bases = [b.rstrip("/") for b in settings.mirrors.pytorch]
    arch = facts.arch or "x86_64"
    cached = [c for c in facts.torch_index if c.base in bases and c.arch in ("", arch)]
    tag = "cp" + python.replace(".", "")
    rc, cand, note = simpleindex.pick(candidates_json(candidates, settings),
                                      [c.as_entry() for c in cached], tag)
    if rc == simpleindex.NONE_SERVED or cand is None:
        newest = max(c.at for c in cached)
        return MirrorChoice(candidates[0], f"{note} (read {_ago(facts, newest)}; the torch step "
                                           "reads it again and stops if it still has none)")
    pos = next(i for i, c in enumerate(candidates)
               if (c.torch, c.cuda) == (cand["torch"], cand["variant"]))
    choice = candidates[pos]
    if rc == simpleindex.NEED_MORE:
        return MirrorChoice(choice, f"the step confirms {choice.label} against the mirror "
                                    f"({listed(settings.mirrors.pytorch)}) before installing")
    at = max(c.at for c in cached if c.variant == choice.cuda)
    if note:
        return MirrorChoice(choice, f"{note} (read {_ago(facts, at)})")
    return MirrorChoice(choice, f"the mirror serves it (read {_ago(facts, at)})")


def read_torch(candidates: tuple[TorchChoice, ...], result: Any) -> Outcome:
    """The installed build must be one of the candidates: the body imported it and reported
    ``{"version", "cuda", "index", "note"}``."""
    got = dict_result(result, "torch")
    release = str(got.get("version", "")).split("+")[0]
    if not any(release == c.torch and got.get("cuda") == c.cuda_version for c in candidates):
        want = ", ".join(c.label for c in candidates[:3]) + (", ..." if len(candidates) > 3 else "")
        where = f"the index {got['index']}" if got.get("index") else "the index"
        raise ProvisionError(f"installed torch {got.get('version')} (CUDA {got.get('cuda')}) is "
                             f"none of the builds the rule allows ({want}); {where} served "
                             "another build")
    return Outcome(data=got)


def confirm_torch(prefix: str, facts: HostFacts) -> str:
    """After the install, on fresh facts: the env has a torch (the re-plan then keeps it)."""
    env = next((e for e in facts.envs if e.prefix == prefix), None)
    if env is None or env.torch is None:
        raise ProvisionError(f"after the torch step no torch is importable in {prefix}; see "
                             f"{shown('logs', 'torch.log')} on the host")
    return f"torch {env.torch} (CUDA {env.torch_cuda or 'none'}) installed in {prefix}"


def torch_step(facts: HostFacts, settings: Settings, lay: Layout,
               candidates: tuple[TorchChoice, ...], python: str, fresh_env: bool = False,
               why: str = "") -> tuple[Step, TorchChoice]:
    """The torch step and the build the host will then have (what validation expects).

    ``candidates``: what the rule allows, best first; ``python``: the env's; ``fresh_env``: the
    env step makes the env anew (what is in it now goes); ``why``: what the plan already said
    about the torch that stays elsewhere (the platform's)."""
    env = None if fresh_env else find_env(facts, lay)
    repair = "torch" in facts.interrupted
    mc = mirror_choice(facts, settings, candidates, python)
    choice = mc.choice
    replace = ""
    if env is not None and env.torch and not repair:
        check = judge_env_torch(facts, settings, env)
        if check.ok:
            kept = installed_choice(env.torch, env.torch_cuda, settings.mirrors.pytorch[0],
                                    check.reason)
            if (kept.torch, kept.cuda_version) == (choice.torch, choice.cuda_version):
                reason = f"{choice.label} already installed"
            else:
                reason = (f"keep torch {env.torch}: {check.reason} (the newest the rule allows "
                          f"here is {candidates[0].label}; set torch: to change it)")
            mirror = f"; {mc.note}" if "has no" in mc.note else ""
            return nothing("torch", reason + mirror), kept
        replace = f"replace: {check.reason}; "
    cands = candidates_json(candidates, settings)
    bases = tuple(b.rstrip("/") for b in settings.mirrors.pytorch)
    body = render("setup/torch.sh.j2", python_bin=lay.python_bin, bases=bases,
                  variants=list(dict.fromkeys(c["variant"] for c in cands)),
                  projects=[p for p in simpleindex.PROJECTS
                            if any(c.get(p) for c in cands) or p == "torch"],
                  candidates=json.dumps(cands), index_dir=INDEX_DIR, accept=simpleindex.ACCEPT,
                  simpleindex=package_source("wheels/simpleindex.py"),
                  mirror_timeout=settings.mirrors.timeout, repair=repair,
                  space=_torch_space(facts, settings, choice),
                  **choose_installer(facts, settings).template_vars())
    reason = INTERRUPTED if repair else \
        f"{why}{replace}{'; '.join(choice.reasons)}; {mc.note}"
    step = Step("torch", reason, action=f"install {choice.label}", body=body,
                inputs=inputs_hash(candidates=cands, bases=bases), repair=repair,
                read=partial(read_torch, candidates),
                settle=partial(confirm_torch, lay.env_prefix))
    return step, choice


def _torch_space(facts: HostFacts, settings: Settings, choice: TorchChoice) -> dict[str, Any]:
    installed, download, _ = figures("torch", torch_kind(choice))
    return step_space(facts, settings, choice.label, installed, download, installed / download)


def packages_step(facts: HostFacts, settings: Settings, lay: Layout,
                  fresh_env: bool = False) -> Step:
    """``fresh_env``: the env step makes the env anew, so what the journal says was installed
    goes with the old one."""
    if not settings.packages:
        return nothing("packages", f"recipe {settings.recipe} adds no packages")
    pypi = settings.mirrors.pypi
    h = inputs_hash(packages=settings.packages, pypi=pypi)
    done = facts.journal.get("packages", {})
    if done.get("inputs") == h and done.get("result") == "ok" and find_env(facts, lay) \
            and "packages" not in facts.interrupted and not fresh_env:
        return nothing("packages", f"{' '.join(settings.packages)} installed (journal)")
    base = next((i for i in facts.image_torches if i.python_bin == lay.base), None)
    fix = pip_fix(facts) if lay.base else ""
    nopip = "" if base is None or base.pip else (
        f"; {lay.base} has no pip module: pip's own wheel from the PyPI mirror is installed into "
        "the venv first (no root needed)")
    body = render("setup/packages.sh.j2", python_bin=lay.python_bin, packages=settings.packages,
                  pypi=configured_pypi(settings), mirror_timeout=settings.mirrors.timeout,
                  pip_fix=fix, space=step_space(facts, settings, f"recipe {settings.recipe}'s "
                                                "packages", len(settings.packages) *
                                                sum(figures("packages")[:2])),
                  **choose_installer(facts, settings, bool(lay.base)).template_vars())
    return Step("packages", f"recipe {settings.recipe}, from {listed(pypi)}, torch pinned{nopip}",
                action="install " + " ".join(settings.packages), body=body, inputs=h)


def pip_fix(facts: HostFacts) -> str:
    """What gives the image's python a pip, for this distro, when none can be fetched."""
    root = "" if facts.root else "sudo "
    family = facts.os.family
    cmd = {"apt": f"{root}apt-get install python3-pip", "yum": f"{root}dnf install python3-pip"
           }.get(family or "", "install the distro's python3-pip")
    return (f"{cmd} (root's to run), or ask for an env of ours with a pip of its own: "
            "--env-name NAME")
