"""``Step``: what an operation decided for one part of the host, as a typed value.

An operation turns facts + settings into a Step: nothing to do (``action`` None, with the
reason), or a bash body to run. The operation that writes the body also reads what the body
reports (``read``: the JSON value the body wrote to ``$RESULT``), so a step's result is parsed in
one place; the apply engine (provision/bootstrap.py) only follows the typed fields and never
asks which step it holds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ProvisionError
from ..remote.contract import CONTRACT, shown

if TYPE_CHECKING:
    from ..facts.host import HostFacts


@dataclass(frozen=True)
class Outcome:
    """What an applied step reported, as its operation reads it."""

    reboot: bool = False  # it takes effect only after the host reboots
    report: Mapping[str, Any] | None = None  # saved as reports/<host>/<report_kind>-<run>.json
    report_kind: str = "validate"
    verdict: str | None = None  # PASS | WARN | FAIL
    data: Any = None  # what else a task shows of it


def no_result(result: Any) -> Outcome:
    """For bodies that report nothing but their exit code."""
    return Outcome()


@dataclass(frozen=True)
class Upload:
    """A local file the step puts on the host before its body runs (``~/`` is the home)."""

    local: Path
    remote: str


@dataclass(frozen=True)
class Step:
    """One decision and, when there is work, the body that carries it out.

    ``settle``: the step changes facts the rest of the plan depends on (the driver): after it,
    the engine re-reads the facts (rebooting first when the outcome says so), re-plans what is
    left, and calls ``settle`` on the new facts; it returns what to tell the user, or raises
    ProvisionError when the step did not take. ``then``: a step to run right after, built from
    the settled facts (holding the driver packages once nvidia-smi answers).
    """

    name: str
    reason: str
    action: str | None = None  # what it changes; None: nothing to do
    body: str | None = None  # bash, run by provision/remote/runtime.py
    inputs: str = ""  # hash of what it depends on (the host's journal keeps it)
    repair: bool = False  # redoes a run that was interrupted or left half done
    foreground: bool = False  # quick: run in the foreground, without a lock or journal
    stdin: str | None = None  # secret input: sent on stdin (foreground only), never logged
    read: Callable[[Any], Outcome] = no_result
    settle: Callable[[HostFacts], str] | None = None
    then: Callable[[HostFacts], Step] | None = None
    kept: Outcome | None = None  # nothing to do: what its last run reported
    uploads: tuple[Upload, ...] = ()
    lock: str = CONTRACT.locks.host  # the lock it holds while it runs (remote/contract.py)
    # the body needs root (the driver, the package manager, /etc, a reboot): the runtime runs it
    # as root, through `sudo -n` when the login is not root (provision/remote/runtime.py)
    needs_root: bool = False

    def __post_init__(self) -> None:
        if (self.action is None) != (self.body is None):
            raise ValueError(f"step {self.name}: an action needs a body and a body an action")
        if self.stdin is not None and not self.foreground:
            raise ValueError(f"step {self.name}: input on stdin needs a foreground step")

    @property
    def changes(self) -> bool:
        return self.body is not None

    @property
    def label(self) -> str:
        """The action as shown: ``redo: install ...`` for a repair, ``none`` for nothing."""
        if self.action is None:
            return "none"
        return f"redo: {self.action}" if self.repair else self.action


def inputs_hash(**values: Any) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def nothing(name: str, reason: str, kept: Outcome | None = None) -> Step:
    """A step with nothing to do, and why."""
    return Step(name, reason, kept=kept)


def dict_result(result: Any, step: str) -> Mapping[str, Any]:
    """The JSON object a body reported; anything else is a broken body."""
    if not isinstance(result, Mapping):
        raise ProvisionError(f"step {step!r} reported {result!r} instead of a JSON object; see "
                             f"its log ({shown('logs', f'{step}.log')} on the host)")
    return result
