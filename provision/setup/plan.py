"""Facts + settings -> every decision with its reason. Pure: nothing here touches a host."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..config.inventory import Settings
from ..config.minimums import shortfalls
from ..config.recipes import TOOLS, Platform
from ..errors import NoWheelError, ProvisionError
from ..facts.host import HostFacts, cc_from_name
from ..ops import driver as driver_ops
from ..ops import fabric as fabric_ops
from ..ops import space
from ..ops import validate as validate_ops
from ..ops.conda import conda_step
from ..ops.driver_pick import NoDriver, Pick, choose, first_release
from ..ops.driver_pick import table as driver_table
from ..ops.env import env_step, python_conflict
from ..ops.installer import installer_decision
from ..ops.layout import Layout, env_ready, find_env, place
from ..ops.privilege import THROUGH_SUDO, cannot_text, for_login
from ..ops.secrets import secrets_step
from ..ops.step import Step, nothing
from ..ops.tools import tool_steps
from ..ops.torch import packages_step, torch_step
from ..wheels.data import parse_compute_cap
from ..wheels.rule import TorchChoice, torch_candidates


@dataclass(frozen=True)
class Decision:
    step: str  # platform | driver | conda | env | torch | validate
    action: str | None  # None: nothing to do
    reason: str

    @property
    def changes(self) -> bool:
        return self.action is not None

    def as_json(self) -> dict[str, str]:
        return {"step": self.step, "action": self.action or "none", "reason": self.reason}


@dataclass(frozen=True)
class Plan:
    host: str
    settings: Settings
    decisions: tuple[Decision, ...]
    torch: TorchChoice | None
    risks: tuple[str, ...] = ()
    blocked: str | None = None  # a reason nothing can proceed (no wheel fits)
    steps: tuple[Step, ...] = ()  # what bootstrap applies, in order
    layout: Layout | None = None
    facts: HostFacts | None = None
    cannot: tuple[str, ...] = ()  # "step: why" for each step that needs root the login lacks
    fit: space.Fit | None = None  # what the steps fetch and unpack, where, against what is free
    # what each listed mirror answered `plan`'s probe and the one each download uses
    # (setup/mirrors.py; empty: not probed)
    mirrors: tuple[dict[str, Any], ...] = ()

    def require_env(self, what: str) -> None:
        """Tasks that run in the env (validate, bench) need bootstrap to have made it."""
        if self.layout is None or self.facts is None or not env_ready(self.facts, self.layout):
            raise ProvisionError(f"{self.host}: no env to {what} yet: run bootstrap first")

    def as_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "changes": [s.name for s in self.steps if s.changes and s.name != "validate"],
            "settings": asdict(self.settings),
            "decisions": [d.as_json() for d in self.decisions],
            "torch": self.torch.as_json() if self.torch else None,
            "risks": list(self.risks),
            "blocked": self.blocked,
            "cannot": list(self.cannot),
            "space": self.fit.as_json() if self.fit else None,
            "mirrors": list(self.mirrors),
        }


# steps whose change breaks a job under way: its env's files, its driver, a reboot, the program
# a serving job runs (a tool's folder is swapped)
UNDER_JOBS = ("driver", "reboot", "env", "torch", "packages", *TOOLS)


def busy_with_jobs(facts: HostFacts, host: str, steps: list[Step]) -> str | None:
    """Why the plan waits: a job of ours runs and a step would change what it runs on (None:
    no job runs, or nothing it uses changes; a no-op bootstrap and validate run beside jobs)."""
    changing = [s.name for s in steps if s.changes and s.name in UNDER_JOBS]
    if not facts.running_jobs or not changing:
        return None
    ids = ", ".join(f"{j} (pid {pid})" for j, pid in facts.running_jobs[:3])
    more = f" and {len(facts.running_jobs) - 3} more" if len(facts.running_jobs) > 3 else ""
    first = facts.running_jobs[0][0]
    return (f"job {ids}{more} runs; the {', '.join(changing)} change would break it under way: "
            f"wait for it to end (`gpu-provision -H {host} jobs`), or stop it first "
            f"(`gpu-provision -H {host} kill {first}`)")


def make_plan(host: str, facts: HostFacts, settings: Settings, platform: Platform,
              secrets: Mapping[str, str] | None = None, secrets_digest: str = "",
              revalidate: bool = False) -> Plan:
    """Every decision with its reason. Where the home's disk cannot hold the plan and another
    can (a data disk), the env goes there (ops/space.py); where none can, the plan is blocked
    with the figures."""
    settings = space.settled(facts, settings)  # an env of ours already on a data disk stays
    plan = _make_plan(host, facts, settings, platform, secrets, secrets_digest, revalidate)
    fit = plan.fit
    if fit is None or fit.ok or plan.blocked or settings.env_dir:
        return plan
    for where in space.elsewhere(facts, settings, fit):
        moved = replace(settings, env_dir=where)
        alt = _make_plan(host, facts, moved, platform, secrets, secrets_digest, revalidate,
                         moved_from=fit)
        if alt.fit is not None and alt.fit.ok and not alt.blocked:
            return alt
    return _make_plan(host, facts, settings, platform, secrets, secrets_digest, revalidate,
                      no_room=space.refusal(fit, settings))


def _make_plan(host: str, facts: HostFacts, settings: Settings, platform: Platform,
               secrets: Mapping[str, str] | None = None, secrets_digest: str = "",
               revalidate: bool = False, moved_from: space.Fit | None = None,
               no_room: str | None = None) -> Plan:
    decisions: list[Decision] = []
    detected = facts.platform or "none detected"
    decisions.append(Decision("platform", None,
                              f"{platform.name} ({platform.kind}; detected: {detected}, "
                              f"{facts.platform_evidence}; host is a {facts.virtualization.kind}"
                              f" - {facts.virtualization.evidence})"))
    touchable = platform.driver_touchable and facts.virtualization.kind != "container"
    caps = sorted({parse_compute_cap(c) for c in facts.compute_caps})
    if not caps and facts.pci_gpus:  # no driver yet: the GPU model from the PCI bus
        caps = sorted({parse_compute_cap(cc) for g in facts.pci_gpus
                       if (cc := cc_from_name(g.name))})
    if not caps and facts.nvlink5:  # "8x B200": known by its PCI ID where lspci has no name
        cc = cc_from_name(facts.nvlink5.partition("x ")[2])
        caps = [parse_compute_cap(cc)] if cc else []
    glibc = facts.glibc
    torch: TorchChoice | None = None
    cands: tuple[TorchChoice, ...] = ()
    blocked: str | None = None
    install: Pick | None = None

    # What is kept must pass the rule that picks what is installed (ops/layout.py `place`): a
    # platform's env, an image's conda env, system python or venv whose torch passes is used as
    # it is; one that fails (or a pinned torch: it is not) stays as it is, and an env of ours
    # beside it gets the torch the rule picks. Nothing of the platform's or the image's changes.
    placed = place(facts, settings, platform)
    lay, left_alone = placed.layout, placed.left_alone
    decisions += [Decision("image", None, line) for line in placed.lines]
    kept = find_env(facts, lay) if lay.adopted else None
    # the rule is applied for the Python of the env the torch goes into
    python = kept.python if kept is not None and kept.python else settings.python

    def pick(driver: str | None, driver_cuda: str | None) -> TorchChoice:
        nonlocal cands
        cands = torch_candidates(driver=driver, compute_caps=caps, python=python,
                                 torch=settings.torch, cuda_compat=settings.cuda_compat,
                                 glibc=glibc, driver_cuda=driver_cuda, arch=facts.arch or "x86_64",
                                 index=settings.mirrors.pytorch[0])
        return cands[0]

    def no_wheel(exc: NoWheelError) -> str:
        """A pinned torch: that fails the rule is an error naming the pin and the nearest fix."""
        if not settings.torch:
            return str(exc)
        return (f"the torch {settings.torch} asked ({settings.how_asked('torch')}) fails the "
                f"rule: {exc}")

    def chosen() -> Pick:
        """The driver bootstrap would install here (NoDriver: none, and why)."""
        return choose(caps, facts)

    def newer_driver_helps(newer: Pick) -> bool:
        """Would the branch bootstrap installs give a wheel? (Not for a pin without the
        GPUs' kernels, or GPUs no build has.)"""
        try:
            pick(newer.version, None)
        except NoWheelError:
            return False
        return True

    def limited_by_branch(chosen_pick: Pick) -> bool:
        """Would NVIDIA's long-term branch give a wheel where the chosen (older) one does not?"""
        best = int(driver_table()["prefer"])
        if chosen_pick.branch >= best:
            return False
        try:
            pick(first_release(best), None)
        except NoWheelError:
            return False
        return True

    # Driver
    if not facts.has_nvidia_gpu:
        decisions.append(Decision("driver", None, "no NVIDIA GPU on the PCI bus: CPU-only host"))
    elif facts.gpu_faults:  # a GPU nvidia-smi cannot read: nothing to build on
        blocked = "; ".join(facts.gpu_faults)
        decisions.append(Decision("driver", None, blocked))
    elif facts.nvidia_state == "ok" and facts.driver:
        try:
            torch = pick(facts.driver, facts.driver_cuda)
            owner = "" if touchable else \
                f"; {platform.name} owns the driver (never touched on a {platform.kind})"
            decisions.append(Decision("driver", None,
                                      f"driver {facts.driver} loaded (CUDA <= {facts.driver_cuda}, "
                                      f"{facts.driver_cuda_source}); enough for {torch.label}{owner}"))
        except NoWheelError as exc:
            try:
                newer: Pick | None = chosen() if touchable else None
            except NoDriver as refused:
                newer = None
                blocked = f"driver {facts.driver} is too old: {exc}; {refused}"
                decisions.append(Decision("driver", None, blocked))
            if newer is not None and newer_driver_helps(newer):
                install = newer
                decisions.append(Decision("driver", f"upgrade to branch {install.branch}"
                                          f"{' (open modules)' if install.open else ''} from "
                                          f"{install.source}",
                                          f"driver {facts.driver} is too old: {exc}; "
                                          f"{install.why}"))
            elif touchable and blocked is None:  # the pin (or the GPUs) no driver can save
                blocked = no_wheel(exc)
                decisions.append(Decision("driver", None, f"driver {facts.driver} loaded; a "
                                          f"newer one would not help: {exc}"))
            elif blocked is None:
                blocked = no_wheel(exc)
                decisions.append(Decision("driver", None, f"{platform.name} owns the driver "
                                          f"(never touched on a {platform.kind}); {exc}"))
    elif facts.nvidia_state in ("gpu_lost", "unknown_error"):
        blocked = f"the GPU is not usable: {facts.nvidia_detail}"
        decisions.append(Decision("driver", None, blocked))
    elif not touchable:
        decisions.append(Decision("driver", None,
                                  f"{facts.nvidia_detail}; {platform.name} is a {platform.kind} whose "
                                  "driver belongs to the platform: never touched. Ask the "
                                  "provider, or rent another instance"))
        # the refusal says whose driver it is: a task that shows only the refusal says it too
        blocked = (f"the GPU is not usable: {facts.nvidia_detail}; {platform.name} is a "
                   f"{platform.kind} whose driver belongs to the platform: never touched. Ask "
                   "the provider, or rent another instance")
    elif facts.nvidia_state == "nvml_mismatch":
        decisions.append(Decision("driver", "reboot", facts.nvidia_detail))
    else:
        try:
            install = chosen()
        except NoDriver as exc:  # refused before anything is installed, with what to do
            blocked = f"no driver can be installed here: {exc}"
            decisions.append(Decision("driver", None, f"{facts.nvidia_detail}; {exc}"))
        else:
            reason = f"{facts.nvidia_detail}; {install.why}"
            if facts.nouveau_loaded:
                reason += "; nouveau is loaded and will be blacklisted (reboot needed)"
            decisions.append(Decision("driver", f"install branch {install.branch}"
                                      f"{' (open modules)' if install.open else ''} from "
                                      f"{install.source}", reason))

    if torch is None and blocked is None and facts.has_nvidia_gpu:
        try:  # the driver the host gets: the branch's first release is what it may count on
            expected = install.version if install is not None else chosen().version
        except NoDriver:  # a reboot into the installed driver (NVML mismatch): its branch unknown
            expected = first_release(int(driver_table()["prefer"]))
        try:
            torch = pick(expected, None) if caps else None
        except NoWheelError as exc:
            blocked = no_wheel(exc)
            if install is not None and limited_by_branch(install):
                blocked += (f" (the driver to install is branch {install.branch}, the newest "
                            f"{install.source} has for {install.release} that drives these GPUs)")
        if caps == [] and torch is None and blocked is None:
            decisions.append(Decision("torch", "decide after the driver",
                                      "compute capability unknown until nvidia-smi answers"))
    elif not facts.has_nvidia_gpu:
        try:
            torch = pick(None, None)
        except NoWheelError as exc:
            blocked = no_wheel(exc)

    steps: list[Step] = []
    driver_decision = next(d for d in decisions if d.step == "driver")
    if install is not None and blocked is None:
        assert driver_decision.action is not None
        try:
            steps.append(driver_ops.install_step(facts, install, driver_decision.action,
                                                 driver_decision.reason))
        except NoDriver as exc:
            blocked = f"no driver can be installed here: {exc}"
    elif driver_decision.action == "reboot":
        steps.append(driver_ops.reboot_step(facts, driver_decision.reason))
    fabric = fabric_ops.fabric_step(facts, touchable)  # NVSwitch boards only
    if fabric is not None:
        steps.append(fabric)
    env = env_step(facts, settings, lay, why=left_alone)
    refusal = python_conflict(facts, settings, lay)
    if refusal is not None and blocked is None:
        blocked = refusal
    steps += [conda_step(facts, settings, lay), env]
    if torch is not None and cands:
        # a new conda env has no torch yet; a venv made over the image's python sees its torch
        step, torch = torch_step(facts, settings, lay, cands, python,
                                 fresh_env=env.changes and lay.conda, why=left_alone)
        steps += [step, packages_step(facts, settings, lay, fresh_env=env.changes)]
    elif blocked:
        steps.append(nothing("torch", f"blocked: {blocked}"))
    steps += tool_steps(facts, settings)  # outside the env: they need neither torch nor conda
    # validation runs after any change it checks, or when asked; otherwise it may be skipped
    steps.append(validate_ops.validate_step(facts, lay, settings, torch,
                                            always=revalidate or any(s.changes for s in steps)))
    if secrets:  # tokens change nothing validation measures; they go in before conda
        steps.insert(next(i for i, s in enumerate(steps) if s.name == "conda"),
                     secrets_step(facts, secrets, secrets_digest))
    # steps that need root: "(through sudo)", or left out (named) where the login cannot
    # become root; the rest, all in the login's home, goes ahead
    steps, cannot = for_login(steps, facts)
    if any(c.startswith("driver:") for c in cannot):  # no driver to validate against yet
        steps = [nothing(s.name, "not run: the driver step cannot run for this login")
                 if s.name == "validate" and s.changes else s for s in steps]
    decisions = [_as_login(d, facts) if d.step == "driver" and d.changes else d
                 for d in decisions]
    # (a plan blocked for another reason fetches nothing: nothing to judge)
    fit = space.judge(facts, settings, lay, steps, torch) if blocked is None else None
    disk: list[Decision] = []
    if moved_from is not None and fit is not None:
        disk.append(Decision("disk", f"put the env in {settings.env_dir}",
                             space.moved_text(moved_from, fit, settings)))
    if blocked is None and no_room:  # (said once: the plan's blocked line)
        blocked = no_room
    if blocked is None:
        blocked = busy_with_jobs(facts, host, steps)
    if blocked:  # bootstrap runs nothing then: the plan says so instead of promising work
        cannot = []
        steps = [nothing(s.name, f"not run while blocked (would {s.label})") if s.changes else s
                 for s in steps]
        decisions = [Decision(d.step, None, f"not run while blocked (would {d.action}): {d.reason}")
                     if d.changes else d for d in decisions]
    decisions += disk + [Decision(s.name, s.label if s.changes else None, s.reason)
                         for s in steps if s.name != "driver"]
    installs = installer_decision(facts, settings, [s.name for s in steps if s.changes],
                                  over_image=bool(lay.base))
    if installs:  # right after the steps it serves
        at = max(i for i, d in enumerate(decisions) if d.step in ("torch", "packages")) + 1
        decisions.insert(at, Decision("installer", *installs))
    # the recipe's minimums, judged before anything is installed by the rule validation
    # applies after (provision/config/minimums.py): a warning naming what is short
    short = tuple(shortfalls(validate_ops.minimums_of(settings),
                             validate_ops.host_resources(facts), f"recipe {settings.recipe}"))
    return Plan(host=host, settings=settings, decisions=tuple(decisions), torch=torch,
                risks=(*(torch.risks if torch else ()), *short), blocked=blocked,
                steps=tuple(steps), layout=lay, facts=facts, cannot=tuple(cannot), fit=fit)


def _as_login(d: Decision, facts: HostFacts) -> Decision:
    """The driver's decision as this login carries it out (ops/privilege.py)."""
    assert d.action is not None
    if facts.root:
        return d
    if facts.sudo:
        return Decision(d.step, d.action + THROUGH_SUDO, d.reason)
    return Decision(d.step, None, f"{cannot_text(d.action, facts)}. {d.reason}")
