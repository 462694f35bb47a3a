"""Where the env lives on the host, known before it exists, and which Python's torch is used.

``place`` is the one decision about what is already there. Every Python with a torch that the
image or the platform provides is judged by the rule that picks a new torch
(``kept.judge_env_torch``): a conda env (a base or ``envs/*``), the system's python3.X, a venv in
the usual places. One that passes is used as it is; one that fails is left untouched and an env
of ours goes beside it. The plan says, one line each, which is used and why.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from packaging.version import InvalidVersion, Version

from ..config.inventory import Settings
from ..config.recipes import Platform
from ..facts.envs import env_at
from ..facts.host import CondaEnv, HostFacts
from ..remote.contract import CONTRACT
from .kept import judge_env_torch
from .step import inputs_hash


def expand_home(path: str, home: str) -> str:
    """``~`` and ``~/x`` are the host user's home (facts know it); a quoted ``~`` would be a
    folder named ``~``."""
    if path == "~":
        return home
    return f"{home.rstrip('/')}/{path[2:]}" if path.startswith("~/") else path


@dataclass(frozen=True)
class Layout:
    conda_root: str  # "" where the env is a venv
    env_name: str
    adopted: bool  # the platform's or the image's env, used as it is: not one of ours
    owner: str = "the platform"  # whose env an adopted one is: the platform's, or the image's
    prefix: str = ""  # a venv (not conda's): the image's own, or ours over its system python
    base: str = ""  # the image's system python that venv of ours is made over (its torch is used)

    @property
    def conda(self) -> bool:
        return not self.prefix

    @property
    def env_prefix(self) -> str:
        if self.prefix:
            return self.prefix
        return self.conda_root if self.env_name == "base" else f"{self.conda_root}/envs/{self.env_name}"

    @property
    def python_bin(self) -> str:
        return f"{self.env_prefix}/bin/python"


def layout(facts: HostFacts, settings: Settings, platform: Platform) -> Layout:
    """The conda env: the platform's (AutoDL's base) where it ships one, else ours."""
    roots = [c.removesuffix("/bin/conda") for c in facts.conda]
    prefix = expand_home(platform.conda_prefix, facts.home) if platform.conda_prefix else None
    root = prefix if prefix in roots else (roots[0] if roots else prefix or f"{facts.home}/miniconda3")
    # an env name set on the command line or in the inventory is one of ours, even where the
    # platform ships an env to adopt
    adopt = None if settings.asked_by_user("env_name") else platform.adopt_env
    if not adopt:
        root = own_root(facts, settings, root)
    return Layout(conda_root=root, env_name=adopt or settings.env_name, adopted=bool(adopt))


def asked_env_dir(settings: Settings) -> str:
    """`` (env_dir: in box.yaml)`` where the user set env_dir; "" where the plan chose it."""
    return f" ({settings.how_asked('env_dir')})" if settings.asked_by_user("env_dir") else ""


def own_root(facts: HostFacts, settings: Settings, root: str) -> str:
    """The conda an env of ours goes in: our Miniconda in ``env_dir`` where one is set (a data
    disk: ops/space.py), else ``root`` where the login can write to it."""
    if settings.env_dir:
        return f"{expand_home(settings.env_dir, facts.home).rstrip('/')}/miniconda3"
    return writable_root(facts, root)


def writable_root(facts: HostFacts, root: str) -> str:
    """Where an env of ours can go: ``root``, or our own Miniconda in the home where the login
    cannot write to that conda (an image's /opt/conda made by root, reached without sudo). conda
    run as another user against a root-owned install either fails on its own folders
    ("NotWritableError: ... path: /usr/local/miniconda/envs/.conda_envs_dir_test",
    microsoft/vscode-python#10878; ".../pkgs/cache/...json", conda/conda#7267) or puts the env
    under another envs_dir than the plan names: ours is made where it can be."""
    if root not in facts.conda_readonly:
        return root
    return f"{facts.home.rstrip('/')}/miniconda3"


@dataclass(frozen=True)
class Found:
    """A Python with a torch the image provides, and the layout that uses it as it is."""

    env: CondaEnv  # its python and torch
    where: str  # how the plan names it
    use: Layout


def image_pythons(facts: HostFacts, lay: Layout) -> list[Found]:
    """Every Python with a torch the image provides, outside the platform's env: conda envs of a
    conda our conda step did not install (and not ours), system pythons, venvs."""
    found = []
    done = facts.journal.get("env", {})  # an env of ours made before envs carried our marker
    if "conda" not in facts.journal and not lay.adopted:
        for e in facts.envs:
            ours = e.prefix in facts.own_envs or done.get("result") == "ok" and \
                done.get("inputs") == inputs_hash(name=e.name, python=e.python)
            if e.torch and not ours:
                what = "conda base" if e.name == "base" else f"conda env {e.name!r}"
                found.append(Found(e, f"{e.prefix} (the image's {what}, python {e.python or '?'})",
                                   Layout(conda_root=e.conda, env_name=e.name, adopted=True,
                                          owner="the image")))
    for it in facts.image_torches:
        if not it.torch:
            continue
        if it.kind == "venv":
            use = Layout(conda_root="", env_name=it.prefix, adopted=True, owner="the image",
                         prefix=it.prefix)
        else:  # system or user site: its torch through a venv of ours over the image's python
            use = Layout(conda_root="", env_name="venv", adopted=True, owner="the image",
                         prefix=f"{facts.home.rstrip('/')}/{CONTRACT.view}", base=it.python_bin)
        found.append(Found(CondaEnv(conda="", prefix=use.prefix, name=use.env_name,
                                    python=it.python, torch=it.torch, torch_cuda=it.torch_cuda),
                           it.where, use))
    return found


@dataclass(frozen=True)
class Placement:
    layout: Layout
    left_alone: str = ""  # what the env and torch steps say first: the platform's env kept aside
    lines: tuple[str, ...] = ()  # one per Python with torch the image provides: used or not, why


def _release(env: CondaEnv) -> Version:
    try:
        return Version((env.torch or "0").partition("+")[0])
    except InvalidVersion:
        return Version("0")


def place(facts: HostFacts, settings: Settings, platform: Platform) -> Placement:
    """Which Python's torch bootstrap uses, and where an env of ours goes when none passes."""
    lay = layout(facts, settings, platform)
    found = image_pythons(facts, lay)
    if settings.asked_by_user("env_name"):
        why = f"an env of ours is asked ({settings.how_asked('env_name')})"
        return Placement(lay, lines=tuple(f"{f.where} has torch {f.env.torch}: left untouched, "
                                          f"as {why}" for f in found))
    if lay.adopted:  # the platform ships an env: it comes first, judged by the same rule
        left = ""
        env = find_env(facts, lay)
        if env is not None and env.torch:
            check = judge_env_torch(facts, settings, env)
            if not check.ok:
                left = (f"{lay.owner}'s env {env.name!r} keeps its torch {env.torch}, "
                        f"unchanged ({check.reason}); ")
                lay = ours(lay, settings, facts)
        elif settings.env_dir:  # the torch would go where the platform's env lies: ours instead
            left = (f"{lay.owner}'s env {lay.env_name!r} has no torch and is left as it is: "
                    f"ours goes in {settings.env_dir}{asked_env_dir(settings)}; ")
            lay = ours(lay, settings, facts)
        return Placement(lay, left, tuple(f"{f.where} has torch {f.env.torch}: left untouched; "
                                          f"{platform.name}'s env comes first" for f in found))
    judged = [(f, judge_env_torch(facts, settings, f.env)) for f in found]
    asked = settings.asked_by_user("python")

    def other_python(f: Found) -> bool:
        return asked and f.env.python is not None and f.env.python != settings.python

    usable = [f for f, check in judged if check.ok and not other_python(f)]
    # the first of the newest; at the same release, what the image made (its conda env, its
    # venv) before a venv of ours over its python
    chosen = max(usable, key=lambda f: (_release(f.env), not f.use.base), default=None)
    lines = []
    for f, check in judged:
        head = f"{f.where} has torch {f.env.torch}"
        if f is chosen:
            lines.append(f"{head}, which passes the rule ({check.reason}): used as it is, "
                         "nothing downloaded")
        elif not check.ok:
            beside = "" if chosen else ", and an env of ours goes beside it"
            lines.append(f"{head}, which fails the rule ({check.reason}): left untouched{beside}")
        elif other_python(f):
            lines.append(f"{head} on python {f.env.python}; python {settings.python} is asked "
                         f"({settings.how_asked('python')}): left untouched")
        else:
            assert chosen is not None
            same = _release(chosen.env) == _release(f.env)
            lines.append(f"{head}, which passes the rule ({check.reason}); {chosen.where} " + (
                "has it too and is used" if same else f"has the newer torch {chosen.env.torch}")
                + ": left untouched")
    if chosen is not None:
        return Placement(chosen.use, lines=tuple(lines))
    # ours, in the image's conda where it has one: never in an env of the image's own
    taken = {f.env.prefix for f in found}
    if lay.env_name == "base" or lay.env_prefix in taken:
        lay = Layout(conda_root=lay.conda_root, env_name="torch" if
                     f"{lay.conda_root}/envs/torch" not in taken else "gpu-provision",
                     adopted=False)
    return Placement(lay, lines=tuple(lines))


def ours(lay: Layout, settings: Settings, facts: HostFacts) -> Layout:
    """An env of ours beside the platform's, in the same conda where the login can write to it
    (the platform's env stays as it is)."""
    name = settings.env_name if settings.env_name != lay.env_name and settings.env_name != "base" \
        else "torch"
    return Layout(conda_root=own_root(facts, settings, lay.conda_root), env_name=name,
                  adopted=False, owner=lay.owner)


def find_env(facts: HostFacts, lay: Layout) -> CondaEnv | None:
    """The env the layout names, as the facts see it; for a venv over the image's system python,
    the base's torch and python (the venv itself may not be made yet: ``view_ready``)."""
    env = env_at(facts, lay.env_prefix, lay.base, lay.conda)
    return None if env is None else replace(env, name=lay.env_name)


def env_ready(facts: HostFacts, lay: Layout) -> bool:
    """The env is there to run in (validate, bench, fit): made, or the image's own."""
    if lay.base:
        return facts.view == lay.base and facts.view_site == view_site(facts, lay)
    return find_env(facts, lay) is not None


def view_site(facts: HostFacts, lay: Layout) -> str:
    """The user site (pip --user) whose torch a venv of ours over the image's python must see,
    named in the venv's .pth: a venv with --system-site-packages reads the user site only where
    $PYTHONUSERBASE, if the torch went under one, is set when it runs; "" for any other."""
    it = next((i for i in facts.image_torches if i.python_bin == lay.base), None)
    return it.site if it is not None and it.kind == "user" and lay.base else ""


INTERRUPTED = "interrupted on the host before it finished (a reboot or a kill)"
