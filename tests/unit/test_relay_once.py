"""At most once through a kept connection (remote/relay.py): a command whose request reached the
keeper is never sent again, however late its answer; a request that never went out is retried on
a fresh keeper. The keeper here is a real Unix socket server that reads the request and answers
too late."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from provision.remote import relay


class SlowKeeper:
    """Reads each request line and never answers in time (a keeper behind a slow link)."""

    def __init__(self, path: str):
        self.requests: list[dict[str, object]] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(8)
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(conn)
            self.requests.append(json.loads(relay.read_line(conn)))

    def close(self) -> None:
        self.listener.close()
        for c in self.held:
            c.close()


@pytest.fixture()
def slow(tmp_path: Path) -> Iterator[tuple[SlowKeeper, str]]:
    path = str(tmp_path / "k")
    k = SlowKeeper(path)
    yield k, path
    k.close()


def test_a_command_sent_is_never_sent_again(slow: tuple[SlowKeeper, str], tmp_path: Path) -> None:
    keeper, path = slow
    renewed: list[int] = []

    def renew() -> str:
        renewed.append(1)
        return path

    transport = relay.RelayTransport(path, 0.5, renew)
    with pytest.raises(paramiko.SSHException, match=r"did not answer within 0\.5s after the "
                       r"command was sent; it may have started on the host, so it is not sent"):
        transport.open({"op": "exec", "command": "python train.py", "env": {}})
    assert [r["command"] for r in keeper.requests] == ["python train.py"]  # once
    assert renewed == []  # the keeper the other commands share was left alone


def test_a_request_that_never_went_out_is_retried(tmp_path: Path,
                                                  slow: tuple[SlowKeeper, str]) -> None:
    keeper, live = slow
    transport = relay.RelayTransport(str(tmp_path / "gone"), 0.5, lambda: live)
    # no keeper at the first path (it ended): the request goes to the renewed one, once
    with pytest.raises(paramiko.SSHException, match="may have started on the host"):
        transport.open({"op": "exec", "command": "echo once", "env": {}})
    assert [r["command"] for r in keeper.requests] == ["echo once"]


def test_a_channel_that_runs_nothing_may_be_asked_again(slow: tuple[SlowKeeper, str]) -> None:
    keeper, path = slow
    transport = relay.RelayTransport(path, 0.5, lambda: path)
    with pytest.raises(paramiko.SSHException):
        transport.open({"op": "subsystem", "name": "sftp"})
    assert [r["op"] for r in keeper.requests] == ["subsystem", "subsystem"]  # harmless twice
