"""At most once through a kept connection (remote/relay.py): a command whose request reached the
keeper is never sent again, however late its answer; a request that never went out is retried on
a fresh keeper. The keeper here is a real Unix socket server that reads the request and answers
too late."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from provision.remote import relay


class SlowKeeper:
    """Reads each request line and does not answer in time (a keeper behind a slow link); a
    probe of its link it answers with ``link`` (None: not at all), and whether the command's
    exec had gone out with ``issued`` (None: a keeper too old to say). ``answer_after``: the
    exec's answer comes after that many probes (a host slow to start it). ``reply``: the answer
    sent at once instead (a keeper's error). ``hang_up``: the connection is closed unanswered
    (a keeper that ends)."""

    def __init__(self, path: str, link: bool | None = True, issued: bool | None = True,
                 answer_after: int | None = None, reply: dict[str, object] | None = None,
                 hang_up: bool = False):
        self.link, self.issued, self.answer_after = link, issued, answer_after
        self.reply, self.hang_up = reply, hang_up
        self.requests: list[dict[str, Any]] = []
        self.waiting: list[socket.socket] = []
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
            request = json.loads(relay.read_line(conn))
            self.requests.append(request)
            if request["op"] != "probe":
                if self.hang_up:
                    conn.close()
                elif self.reply is not None:
                    conn.sendall(json.dumps(self.reply).encode() + b"\n")
                self.waiting.append(conn)
            elif self.link is not None:
                answer: dict[str, object] = {"answered": self.link}
                if self.issued is not None:
                    answer["issued"] = self.issued
                probes = sum(r["op"] == "probe" for r in self.requests)
                if self.answer_after is not None and probes == self.answer_after:
                    self.waiting[-1].sendall(b'{"ok": true}\n' + relay.HEADER.pack(
                        relay.STATUS, 1) + b"0")
                conn.sendall(json.dumps(answer).encode() + b"\n")

    def execs(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["op"] == "exec"]

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
    """Its exec went out and the link answers, but no answer comes: it is waited for over
    LATE_ROUNDS timeouts, each time asking the keeper, and then fails; never sent twice."""
    keeper, path = slow
    renewed: list[int] = []

    def renew() -> str:
        renewed.append(1)
        return path

    transport = relay.RelayTransport(path, 0.3, renew)
    with pytest.raises(paramiko.SSHException, match=r"lost the command's answer after it was "
                       r"sent; it may have started on the host, so it is not sent again"):
        transport.open({"op": "exec", "command": "python train.py", "env": {}})
    [sent] = keeper.execs()  # once
    probes = [r for r in keeper.requests if r["op"] == "probe"]
    assert len(probes) == relay.LATE_ROUNDS and {r["id"] for r in probes} == {sent["id"]}
    assert renewed == []  # the keeper the other commands share was left alone


def test_a_late_answer_on_a_live_link_is_waited_for(tmp_path: Path) -> None:
    """A host slow to start the command (swapping, a stalled Wi-Fi that recovers): the keeper
    says the exec went out and the link answers, so the command waits on for its answer on the
    same connection and runs, once, instead of failing with a false alarm."""
    keeper = SlowKeeper(str(tmp_path / "k"), answer_after=2)
    chan = relay.RelayChannel(relay.RelayTransport(str(tmp_path / "k"), 0.3, lambda: ""))
    chan.exec_command("python train.py")
    assert chan.recv_exit_status() == 0 and len(keeper.execs()) == 1
    keeper.close()


def test_a_request_that_never_went_out_is_retried(tmp_path: Path,
                                                  slow: tuple[SlowKeeper, str]) -> None:
    keeper, live = slow
    transport = relay.RelayTransport(str(tmp_path / "gone"), 0.3, lambda: live)
    # no keeper at the first path (it ended): the request goes to the renewed one, once
    with pytest.raises(paramiko.SSHException, match="may have started on the host"):
        transport.open({"op": "exec", "command": "echo once", "env": {}})
    assert [r["command"] for r in keeper.execs()] == ["echo once"]


@pytest.mark.parametrize(("keeper_does", "kw"), [
    ("ends with the command in flight", {"hang_up": True, "link": None}),
    ("answers as a keeper too old to say", {"reply": {"ok": False, "lost": True,
                                                      "error": "EOF"}}),
    ("says its exec went out before the link failed",
     {"reply": {"ok": False, "lost": True, "issued": True, "error": "EOF"}}),
])
def test_a_keeper_that_cannot_say_it_did_not_send_it_is_not_sent_again(
        tmp_path: Path, keeper_does: str, kw: dict[str, Any]) -> None:
    keeper = SlowKeeper(str(tmp_path / "k"), **kw)
    renewed: list[int] = []
    transport = relay.RelayTransport(str(tmp_path / "k"), 0.3,
                                     lambda: renewed.append(1) or str(tmp_path / "k"))
    with pytest.raises(paramiko.SSHException, match="may have started on the host"):
        transport.open({"op": "exec", "command": "python train.py", "env": {}})
    assert len(keeper.execs()) == 1 and renewed == [], keeper_does
    keeper.close()


def test_a_keeper_that_ended_before_sending_it_has_it_sent_afresh(tmp_path: Path) -> None:
    dead = SlowKeeper(str(tmp_path / "dead"), reply={"ok": False, "lost": True, "issued": False,
                                                     "error": "the kept connection ended"})
    fresh = SlowKeeper(str(tmp_path / "fresh"), answer_after=1)
    chan = relay.RelayChannel(relay.RelayTransport(str(tmp_path / "dead"), 0.3,
                                                   lambda: str(tmp_path / "fresh")))
    chan.exec_command("python train.py")
    assert chan.recv_exit_status() == 0
    assert len(dead.execs()) == 1 and len(fresh.execs()) == 1
    dead.close()
    fresh.close()


def test_ctrl_c_while_waiting_sends_nothing_more(tmp_path: Path) -> None:
    """close() (the executor's Ctrl-C) during the wait ends it at once: nothing is sent again
    and the request is withdrawn (a probe that does not wait for the link)."""
    keeper = SlowKeeper(str(tmp_path / "k"), issued=False)
    renewed: list[int] = []
    transport = relay.RelayTransport(str(tmp_path / "k"), 5, lambda: renewed.append(1) or "")
    threading.Timer(0.5, transport.close).start()
    started = time.monotonic()
    with pytest.raises(paramiko.SSHException, match="the connection is closed"):
        transport.open({"op": "exec", "command": "python train.py", "env": {}})
    assert time.monotonic() - started < 4 and renewed == []
    [sent] = keeper.execs()
    [withdrawal] = [r for r in keeper.requests if r["op"] == "probe"]
    assert withdrawal["id"] == sent["id"] and withdrawal["wait"] == 0
    keeper.close()


@pytest.mark.parametrize(("issued", "reads_only", "runs_again"), [
    (False, False, True),  # it never went out (and now never will): the fresh keeper runs it
    (True, False, False),  # it went out just before the link died: the host may be running it
    (True, True, True),  # it went out, but it only reads: running it twice harms nothing
    (None, False, False),  # a keeper too old to say: it may have gone out
])
def test_a_command_in_flight_on_a_dead_link(tmp_path: Path, issued: bool | None,
                                            reads_only: bool, runs_again: bool) -> None:
    """The link dropped (NAT, a sleeping laptop, a cut cable) with the command's request at the
    keeper: the keeper's probe of it gets no answer. Whether the command is sent again on a fresh
    keeper depends on whether its exec had left the keeper (the host may have it) and whether
    the command only reads."""
    dead = SlowKeeper(str(tmp_path / "dead"), link=False, issued=issued)
    fresh = SlowKeeper(str(tmp_path / "fresh"), answer_after=1)
    renewed: list[int] = []

    def renew() -> str:
        renewed.append(1)
        return str(tmp_path / "fresh")

    transport = relay.RelayTransport(str(tmp_path / "dead"), 0.3, renew)
    with contextlib.ExitStack() as stack:
        if not runs_again:
            stack.enter_context(pytest.raises(paramiko.SSHException,
                                              match="may have started on the host"))
        with relay.repeatable() if reads_only else contextlib.nullcontext():
            transport.open({"op": "exec", "command": "python train.py", "env": {}})
    assert [r["op"] for r in dead.requests] == ["exec", "probe"]
    asked = dead.requests[1]
    assert asked["id"] == dead.requests[0]["id"]  # about this very request
    if runs_again:
        [again] = fresh.execs()  # sent again there, once, and answered
        assert again["id"] != asked["id"] and renewed == [1]
    else:
        assert fresh.requests == [] and renewed == []  # never sent twice
    dead.close()
    fresh.close()


def test_a_request_withdrawn_on_a_live_link_is_asked_again_once(tmp_path: Path) -> None:
    """The keeper was slow before the exec went out (a channel that took long to open), its link
    is fine: the request is withdrawn, so it is asked again, once, and then the command fails
    saying that nothing ran."""
    keeper = SlowKeeper(str(tmp_path / "k"), link=True, issued=False)
    transport = relay.RelayTransport(str(tmp_path / "k"), 0.5, lambda: str(tmp_path / "k"))
    with pytest.raises(paramiko.SSHException, match=r"twice; nothing was run"):
        transport.open({"op": "exec", "command": "python train.py", "env": {}})
    assert [r["op"] for r in keeper.requests] == ["exec", "probe", "exec", "probe"]
    assert len({r["id"] for r in keeper.requests}) == 2
    keeper.close()


def test_a_channel_that_runs_nothing_may_be_asked_again(slow: tuple[SlowKeeper, str]) -> None:
    keeper, path = slow
    transport = relay.RelayTransport(path, 0.5, lambda: path)
    with pytest.raises(paramiko.SSHException):
        transport.open({"op": "subsystem", "name": "sftp"})
    assert [r["op"] for r in keeper.requests] == ["subsystem", "subsystem"]  # harmless twice


def test_a_reader_that_does_not_read_holds_the_keeper_back(tmp_path: Path) -> None:
    """Flow control end to end: output for a paused reader stops being taken from the keeper
    after relay.BUFFERED (then the keeper stops reading the host's channel); reading again lets
    all of it through, in order."""
    path = str(tmp_path / "k")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    total, chunk = 64 << 20, bytes(range(256)) * 256  # 64 MiB in 64 KiB frames
    sent = [0]

    def keeper() -> None:
        conn, _ = listener.accept()
        relay.read_line(conn)
        conn.sendall(b'{"ok": true}\n')
        lock = threading.Lock()
        while sent[0] < total:
            relay.send_frame(conn, relay.STDOUT, chunk, lock)
            sent[0] += len(chunk)
        relay.send_frame(conn, relay.STATUS, b"0", lock)
        conn.close()

    threading.Thread(target=keeper, daemon=True).start()
    chan = relay.RelayChannel(relay.RelayTransport(path, 5, lambda: path))
    chan.exec_command("cat big")
    time.sleep(1.5)  # the reader is paused
    held = sent[0]
    assert held < relay.BUFFERED + (8 << 20), f"{held >> 20} MiB taken for a paused reader"
    got = bytearray()
    while data := chan.recv(1 << 20):
        got += data
    assert len(got) == total and got[:len(chunk)] == chunk and chan.recv_exit_status() == 0
    listener.close()


def test_a_keeper_that_freezes_under_a_command_loses_it_within_its_heartbeats(
        tmp_path: Path) -> None:
    """The keeper offers heartbeats, sends some output and a beat, then says nothing (SIGSTOP,
    a wedged thread): the command's channel is lost after MISSED beats, not waited on for ever;
    a keeper that offers none (an older one) is waited for as before."""
    path = str(tmp_path / "k")  # (the keeper offers a beat every 0.2 s)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(2)
    held: list[socket.socket] = []

    def keeper(offer: float) -> None:
        conn, _ = listener.accept()
        held.append(conn)
        relay.read_line(conn)
        conn.sendall(json.dumps({"ok": True, "heartbeat": offer}).encode() + b"\n")
        lock = threading.Lock()
        relay.send_frame(conn, relay.STDOUT, b"epoch 1\n", lock)
        relay.send_frame(conn, relay.BEAT, b"", lock)
        # ... and then nothing, the socket held open

    threading.Thread(target=keeper, args=(0.2,), daemon=True).start()
    chan = relay.RelayChannel(relay.RelayTransport(path, 5, lambda: path))
    chan.exec_command("python train.py")
    started = time.monotonic()
    assert chan.recv(100) == b"epoch 1\n"
    assert chan.recv_exit_status() == -1  # lost: no status came
    assert time.monotonic() - started < 0.2 * relay.MISSED + 2
    threading.Thread(target=keeper, args=(0,), daemon=True).start()
    old = relay.RelayChannel(relay.RelayTransport(path, 5, lambda: path))
    old.exec_command("python train.py")
    assert old.recv(100) == b"epoch 1\n"
    time.sleep(0.2 * relay.MISSED + 1)
    assert not old.exit_status_ready()  # still waited for
    old.close()
    for c in held:
        c.close()
    listener.close()


def test_ctrl_c_while_the_transport_is_busy_with_its_sockets_closes_it(tmp_path: Path) -> None:
    """The executor's Ctrl-C handler calls close() in the main thread, which may be inside the
    transport's own bookkeeping (a channel being opened or forgotten) at that moment: close()
    must not wait for a lock its own thread holds (it hung the command for good)."""
    script = textwrap.dedent("""
        import os, signal, sys, threading, time
        from provision.remote.relay import RelayTransport
        r = RelayTransport("/nonexistent", 1, lambda: "/x")
        signal.signal(signal.SIGINT, lambda *_: r.close())
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        with r._lock:  # as _track and forget hold it
            time.sleep(0.5)
        print("closed" if not r.active else "open")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.stdout.strip() == "closed", r.stderr
