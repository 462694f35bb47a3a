"""The only module that builds shell strings: every remote value is quoted here.

A ``Command`` is argv plus environment, working dir and secret values. ``render()`` gives the
exact string a remote bash runs; ``display()`` the same with secrets masked, for logs and output.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

MASK = "********"


def quote(value: str) -> str:
    """Quote one value for a POSIX shell (``shlex.quote``; safe for every byte but NUL)."""
    if "\x00" in value:
        raise ValueError("a shell value cannot contain a NUL byte")
    return shlex.quote(value)


@dataclass(frozen=True)
class Command:
    """One remote command. ``argv[0]`` is the program; nothing in argv is ever parsed by a shell.

    >>> Command(("conda", "create", "-n", "my env")).render()
    "conda create -n 'my env'"
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    secrets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("a Command needs at least a program")
        for name in self.env:
            if not name.isidentifier():
                raise ValueError(f"invalid environment variable name: {name!r}")

    def render(self) -> str:
        """The exact shell string to run remotely."""
        parts: list[str] = []
        if self.cwd is not None:
            parts.append(f"cd {quote(self.cwd)} &&")
        if self.env:
            parts.append("env")
            parts.extend(quote(f"{k}={v}") for k, v in self.env.items())
        parts.extend(quote(a) for a in self.argv)
        return " ".join(parts)

    def display(self) -> str:
        """``render()`` with every secret value masked: the only form that reaches logs."""
        return mask(self.render(), self.secrets)


def mask(text: str, secrets: Sequence[str]) -> str:
    """Replace every occurrence of each secret (raw and shell-quoted) with a mask."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(quote(secret), MASK).replace(secret, MASK)
    return text


def bash_script(command: str) -> Command:
    """Run a rendered script text through ``bash -c`` (the text itself is one quoted value)."""
    return Command(("bash", "-c", command))
