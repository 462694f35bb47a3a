"""The login block: the env bootstrap made, activated in every login shell on the host.

Bootstrap's validation writes ``~/.gpu-provision/expected.json`` (the env's prefix and conda
root); right after, it writes ``~/.gpu-provision/activate.sh`` (templates/setup/activate.sh,
which reads that record when sourced) and adds one marked block that sources it to ``~/.bashrc``
and to the profile a login shell reads (templates/setup/_login.sh.j2). ``forget-login`` takes
the blocks out again; ``shell`` sources the same file.
"""

from __future__ import annotations

from typing import Any

from ..remote.templating import render
from .step import Outcome, Step, dict_result


def activation() -> str:
    """The POSIX sh text of ``~/.gpu-provision/activate.sh``."""
    return render("setup/activate.sh")


def login_block_script() -> str:
    """The part of the validate step's body that writes activate.sh and the login blocks."""
    return render("setup/_login.sh.j2", activate=activation())


def read_removed(result: Any) -> Outcome:
    """The files the block was taken out of ("" when there were none)."""
    return Outcome(data=str(dict_result(result, "forget-login").get("removed") or ""))


def forget_login_step() -> Step:
    return Step("forget-login", "forget-login", action="remove the login block",
                body=render("setup/login_forget.sh.j2"), foreground=True, read=read_removed)
