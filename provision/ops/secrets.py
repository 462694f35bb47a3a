"""Tokens the inventory pushes (``push_env``): into a 0600 env file that login shells source."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..facts.host import HostFacts
from ..remote.command import quote
from ..remote.contract import shown
from ..remote.templating import render
from .step import Outcome, Step, dict_result, nothing

SECRETS_FILE = shown("env")


def secrets_step(facts: HostFacts, values: Mapping[str, str], digest: str) -> Step:
    """``digest`` is a keyed hash of the values, so the journal tells whether they changed
    without holding anything that reveals them. The values travel on stdin only."""
    names = " ".join(sorted(values))
    done = facts.journal.get("secrets", {})
    if done.get("inputs") == digest and done.get("result") == "ok":
        return nothing("secrets", f"{names} already on the host (journal)")
    content = "".join(f"export {k}={quote(v)}\n" for k, v in sorted(values.items()))
    return Step("secrets", f"push_env in the inventory; into {SECRETS_FILE} (mode 0600), "
                "sourced by ~/.bashrc", action=f"push {names}",
                body=render("setup/secrets.sh.j2", names=names, inputs=digest), inputs=digest,
                foreground=True, stdin=content)


def read_forgotten(result: Any) -> Outcome:
    """The names of the tokens removed ("" when there were none)."""
    return Outcome(data=str(dict_result(result, "forget-secrets").get("forgotten") or ""))


def forget_secrets_step() -> Step:
    """Remove the pushed tokens: the env file, the line that sources it, the journal entry."""
    return Step("forget-secrets", "forget-secrets", action="remove the pushed tokens",
                body=render("setup/secrets_forget.sh.j2"), foreground=True, read=read_forgotten)
