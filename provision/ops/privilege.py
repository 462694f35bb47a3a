"""Steps that need root, for the login the facts report: as they are for root, "(through sudo)"
for a login with passwordless sudo, and for any other login a step that cannot run, named with
why and the fix, while everything that lives in the login's home goes ahead.

The runtime (provision/remote/runtime.py) is what runs a ``needs_root`` body as root; this
module only decides what the plan says and which steps are left out.
"""

from __future__ import annotations

from dataclasses import replace

from ..facts.host import HostFacts
from .step import Step, nothing

THROUGH_SUDO = " (through sudo)"


def who(facts: HostFacts) -> str:
    """The login, as a message names it."""
    return f"the login {facts.login or 'used'}"


def no_root_reason(facts: HostFacts) -> str:
    """Why a step that needs root cannot run for this login ("" where it can)."""
    if facts.root or facts.sudo:
        return ""
    said = f" ({facts.sudo_said})" if facts.sudo_said else ""
    return f"{who(facts)} is not root and has no passwordless sudo{said}"


def as_login(step: Step, facts: HostFacts) -> Step:
    """``step`` as this login runs it: labelled "(through sudo)" where sudo carries it; a step
    with nothing to do, naming why, where the login cannot become root."""
    if not step.needs_root or not step.changes or facts.root:
        return step
    assert step.action is not None
    if facts.sudo:
        if step.action.endswith(THROUGH_SUDO):
            return step
        return replace(step, action=step.action + THROUGH_SUDO)
    return nothing(step.name, cannot_text(step.action, facts))


def cannot_text(action: str, facts: HostFacts) -> str:
    """The one line that says a root step cannot run, and the fix."""
    return (f"cannot run: {action} needs root, and {no_root_reason(facts)}; log in as root or "
            "as a user with passwordless sudo (NOPASSWD in /etc/sudoers.d), or have an admin "
            "do it")


def for_login(steps: list[Step], facts: HostFacts) -> tuple[list[Step], list[str]]:
    """Every step as this login runs it, and one line per root step that cannot run."""
    out, cannot = [], []
    for step in steps:
        mine = as_login(step, facts)
        if step.changes and not mine.changes:
            cannot.append(f"{step.name}: {mine.reason}")
        out.append(mine)
    return out, cannot
