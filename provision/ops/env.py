"""The conda env: created with the Python asked for, or the platform's own adopted."""

from __future__ import annotations

from ..facts.host import HostFacts
from ..inventory import Settings
from ..templating import render
from .layout import INTERRUPTED, Layout, find_env
from .step import Step, inputs_hash, nothing


def env_step(facts: HostFacts, settings: Settings, lay: Layout) -> Step:
    env = find_env(facts, lay)
    repair = "env" in facts.interrupted and not lay.adopted
    if env is not None and not repair:
        what = "adopt the platform's env" if lay.adopted else "env exists:"
        return nothing("env", f"{what} {lay.env_name!r} (python {env.python}, "
                              f"torch {env.torch or 'none'})")
    if lay.adopted:
        return nothing("env", f"adopt the platform's env {lay.env_name!r} at {lay.env_prefix}")
    body = render("env.sh.j2", root=lay.conda_root, name=lay.env_name, python=settings.python,
                  channels=settings.mirrors.conda_channels, repair=repair)
    return Step("env", INTERRUPTED if repair else
                f"conda create -n {lay.env_name} python={settings.python}",
                action=f"create {lay.env_name!r}", body=body,
                inputs=inputs_hash(name=lay.env_name, python=settings.python), repair=repair)
