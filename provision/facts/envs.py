"""The env a layout names, as the facts see it: a conda env by its prefix, or a venv (the image's
own, or ours over the image's system python, whose torch is the base's) by its interpreter. One
lookup for the plan's operations and for doctor, which sit on the same floor."""

from __future__ import annotations

from .host import CondaEnv, HostFacts


def env_at(facts: HostFacts, prefix: str, base: str = "", conda: bool = True) -> CondaEnv | None:
    """``prefix``: the env's; ``base``: the image's python a venv of ours is made over (the venv
    itself may not be made yet); ``conda``: a conda env, else a venv."""
    if not conda:
        python = base or f"{prefix}/bin/python"
        it = next((i for i in facts.image_torches if i.python_bin == python), None)
        return None if it is None else CondaEnv(
            conda="", prefix=prefix, name=prefix.rsplit("/", 1)[-1], python=it.python,
            torch=it.torch, torch_cuda=it.torch_cuda)
    return next((e for e in facts.envs if e.prefix == prefix), None)
