"""The conda env: created with the Python asked for, or the platform's own adopted.

What was asked is what the env has: an env of ours whose Python differs from the one asked is
recreated with it (the old one is put back if conda cannot make the new one); an env we did
not make, or the platform's, is never replaced: the plan refuses in one line naming both
versions and what resolves it.
"""

from __future__ import annotations

from ..config.inventory import Settings
from ..facts.host import CondaEnv, HostFacts
from ..remote.templating import render
from .layout import INTERRUPTED, Layout, find_env
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
    if env is None or env.python is None or env.python == settings.python:
        return None
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
                  have=have)
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
