"""The wait for a rebooted host: a link that drops while the facts are read is the reboot
taking the old boot's sshd down (a kept link to it, or a login just before it went), so the
wait goes on; only a NEW boot id ends it."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from provision.errors import ConnectionLost
from provision.setup import engine


class Host:
    """What reboot_and_wait asks of an executor: run the reboot, close, count executions."""

    def __init__(self) -> None:
        self.host, self.executions, self.closed = "box", 1, False
        self.conn = SimpleNamespace(close=self.close)

    def close(self) -> None:
        self.closed = True

    def run(self, *args: Any, **kw: Any) -> Any:
        return SimpleNamespace(exit_code=0, stderr="")


def test_a_link_that_drops_during_the_facts_is_waited_past(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.time, "sleep", lambda s: None)
    answers: list[Any] = [ConnectionLost("box", "the facts"), "old", "new"]
    links: list[Host] = []

    def connect() -> Host:
        links.append(Host())
        return links[-1]

    def replan(ex: Host) -> Any:
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return SimpleNamespace(facts=SimpleNamespace(boot_id=got))

    console = Console(file=io.StringIO())
    new, plan, _ = engine.reboot_and_wait(Host(), "old", engine.Reconnect(connect, replan), console)
    assert plan.facts.boot_id == "new" and new is links[2]
    assert links[0].closed and links[1].closed and not links[2].closed
