"""The conda env: created with the Python asked for, or the platform's own adopted; or the
image's venv used as it is, or a venv of ours over the image's system python (ops/layout.py).

What was asked is what the env has: an env of ours whose Python differs from the one asked is
recreated with it (the old one is put back if conda cannot make the new one); an env we did
not make, or the platform's, is never replaced: the plan refuses in one line naming both
versions and what resolves it.
"""

from __future__ import annotations

from ..config.inventory import Settings
from ..facts.host import CondaEnv, HostFacts
from ..facts.images import USER_SITE_PTH
from ..remote.contract import CONTRACT, shown
from ..remote.templating import render
from .layout import INTERRUPTED, Layout, find_env, view_site
from .space import figures, step_space
from .step import Step, inputs_hash, nothing


def made_by_us(facts: HostFacts, lay: Layout, env: CondaEnv) -> bool:
    """The env carries our marker (templates/setup/env.sh.j2), or the journal's last env step made
    this very env (same name and Python) before the marker existed."""
    if env.prefix in facts.own_envs:
        return True
    done = facts.journal.get("env", {})
    return done.get("result") == "ok" and \
        done.get("inputs") == inputs_hash(name=lay.env_name, python=env.python)


def python_conflict(facts: HostFacts, settings: Settings, lay: Layout) -> str | None:
    """Why the env step must refuse: the existing env has another Python than the one asked
    and is not ours to recreate. None when there is nothing to refuse."""
    env = find_env(facts, lay)
    if not lay.conda or env is None or env.python is None or env.python == settings.python:
        return None  # (an image's python of another version is not chosen: layout.place)
    asked = settings.how_asked("python")
    if lay.adopted:
        if not settings.asked_by_user("python"):
            return None  # the recipe's Python is for envs we create; the platform's env has its own
        return (f"{lay.owner}'s env {lay.env_name!r} has python {env.python}, python "
                f"{settings.python} is asked ({asked}): {lay.owner}'s env is never replaced; "
                f"drop {asked} to use it with python {env.python}, or name an env of ours for "
                f"python {settings.python} beside it (--env-name NAME, or env_name: in the "
                "inventory)")
    if lay.env_name != "base" and made_by_us(facts, lay, env):
        return None  # ours: recreated
    return (f"env {lay.env_name!r} at {env.prefix} has python {env.python}, python "
            f"{settings.python} is asked ({asked}); gpu-provision did not make it, so it is not "
            f"recreated: ask for python {env.python} to use it (--python {env.python}), or name "
            f"another env for python {settings.python} (--env-name NAME)")


def env_step(facts: HostFacts, settings: Settings, lay: Layout, why: str = "") -> Step:
    """``why``: what the plan says first (the platform's env it leaves alone)."""
    if not lay.conda:
        return venv_step(facts, lay)
    env = find_env(facts, lay)
    repair = "env" in facts.interrupted and not lay.adopted
    refusal = python_conflict(facts, settings, lay)
    if refusal is not None:
        return nothing("env", f"refused: {refusal}")
    recreate = env is not None and not repair and not lay.adopted and \
        env.python is not None and env.python != settings.python
    if env is not None and not repair and not recreate:
        if lay.adopted:
            own = "" if env.python == settings.python or env.python is None else \
                f"; the recipe's python {settings.python} is for envs gpu-provision creates"
            return nothing("env", f"adopt {lay.owner}'s env {lay.env_name!r} (python "
                                  f"{env.python}, torch {env.torch or 'none'}){own}")
        return nothing("env", f"{why}env exists: {lay.env_name!r} (python {env.python}, "
                              f"torch {env.torch or 'none'})")
    if lay.adopted:
        return nothing("env", f"adopt {lay.owner}'s env {lay.env_name!r} at {lay.env_prefix}")
    have = env.python if env is not None and recreate else ""
    body = render("setup/env.sh.j2", root=lay.conda_root, name=lay.env_name, python=settings.python,
                  channels=settings.mirrors.conda_channels, repair=repair, recreate=recreate,
                  have=have, space=step_space(facts, settings, f"the env {lay.env_name}",
                                              sum(figures("env")[:2])))
    if recreate:
        reason = (f"env {lay.env_name!r} has python {have}, python {settings.python} is asked "
                  f"({settings.how_asked('python')}): it is recreated with it (what was installed "
                  "in it goes; the old env is put back if conda cannot make the new one)")
        action = f"recreate {lay.env_name!r} with python {settings.python}"
    else:
        reason = INTERRUPTED if repair else \
            f"conda create -n {lay.env_name} python={settings.python}"
        action = f"create {lay.env_name!r}"
    return Step("env", why + reason, action=action, body=body,
                inputs=inputs_hash(name=lay.env_name, python=settings.python), repair=repair)


def venv_step(facts: HostFacts, lay: Layout) -> Step:
    """The image's venv is used as it is; the image's system python through a venv of ours made
    over it with ``--system-site-packages``: the image's torch stays where it is and imports as
    it is, `python` is on PATH for jobs and login shells, and what the recipe adds goes into the
    venv. pip refuses to install into an "externally managed" system python, ``--user`` included
    (Debian 12, Ubuntu 23.04+), and permits it in a venv, where it never removes what lies outside
    it (PEP 668, use cases 2 and 4: https://peps.python.org/pep-0668/#use-cases)."""
    env = find_env(facts, lay)
    have = f"python {env.python}, torch {env.torch}" if env is not None else "its torch"
    if not lay.base:
        return nothing("env", f"use the image's venv {lay.prefix} as it is ({have})")
    view = shown(CONTRACT.view.removeprefix(f"{CONTRACT.state}/"))
    site = view_site(facts, lay)
    if facts.view == lay.base and facts.view_site == site:
        return nothing("env", f"{view}, a venv over the image's {lay.base}, is there ({have}, "
                              "the image's as it is)")
    again = f"; the one there is over {facts.view}: made again" if facts.view else ""
    if facts.view == lay.base:
        again = "; the one there names another user site: made again"
    # a torch installed with pip --user: the venv reads the user site only where
    # $PYTHONUSERBASE is what it was at install when a job runs (site.py: ENABLE_USER_SITE
    # holds in a venv with system site-packages, the folder comes from PYTHONUSERBASE,
    # https://docs.python.org/3/library/site.html#site.USER_BASE): its .pth names it for good
    user = f"; its user site {site} (pip --user) is named in the venv's {USER_SITE_PTH}, " \
        "so it is seen whatever $PYTHONUSERBASE is when a job runs" if site else ""
    it = next((i for i in facts.image_torches if i.python_bin == lay.base), None)
    return Step("env", f"the image's {lay.base} ({have}) stays as it is; a venv over it "
                f"(--system-site-packages: nothing downloaded) gives jobs and login shells its "
                f"`python`, and what the recipe adds goes into the venv, never into the image's "
                f"python (PEP 668){user}{again}",
                action=f"make {view} over {lay.base}",
                body=render("setup/view.sh.j2", base=lay.base, site=site, pth=USER_SITE_PTH,
                            torch_dir=it.site + "/torch" if it is not None else ""),
                inputs=inputs_hash(view=lay.base, **({"site": site} if site else {})))
