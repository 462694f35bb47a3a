"""The apply engine without a host: plans from captured facts, a fake executor that records each
remote execution and answers it the way the step runtime does (log, then one result line)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from provision.doctor.match import explain
from provision.errors import ConnectionLost, ProvisionError, RemoteError, SSHError
from provision.ops.step import Step, Upload
from provision.remote.command import Command
from provision.remote.connection import TIMEOUT
from provision.remote.executor import Result
from provision.remote.runtime import HEARTBEAT, LOCKED, MARKER, REFUSED
from provision.setup import engine as bootstrap
from provision.setup.engine import Reconnect, apply
from provision.setup.plan import Plan
from provision.store import Store
from tests.cases import CASES, case_plan, plan_for, raw

PLAN = CASES / "plan"


@dataclass
class Answer:
    """How the host answers one remote execution of a step."""

    result: Any = None  # what the body wrote to $RESULT
    log: str = ""
    exit: int = 0
    stderr: str = ""


@dataclass
class FakeConn:
    closed: bool = False

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeExecutor:
    """Records what would run; answers each step from ``answers`` (step name -> Answer, or a
    list taken in order). Anything not scripted (the reboot command) exits 0 silently."""

    answers: dict[str, Answer | list[Answer]] = field(default_factory=dict)
    host: str = "box"
    log_dir: Path | None = None
    secrets: tuple[str, ...] = ()
    executions: int = 0
    calls: list[tuple[str, str, str | None]] = field(default_factory=list)  # step, command, stdin
    puts: list[tuple[Path, str]] = field(default_factory=list)
    conn: FakeConn = field(default_factory=FakeConn)

    def run(self, command: Command, step: str, check: bool = True, timeout: int | None = None,
            on_out: Callable[[str], None] | None = None,
            on_err: Callable[[str], None] | None = None, stdin: str | None = None,
            what: str | None = None, reads_only: bool = False) -> Result:
        self.executions += 1
        self.calls.append((step, command.render(), stdin))
        scripted = self.answers.get(step)
        answer = (scripted.pop(0) if isinstance(scripted, list) else scripted) or Answer()
        if answer.exit == -1:  # a channel closed without an exit status: as the real executor
            raise ConnectionLost(self.host, what or repr(step))
        tail = f"\n{MARKER} " + json.dumps({"exit": answer.exit, "size": len(answer.log),
                                            "result": answer.result}) + "\n"
        stdout = answer.log + tail
        for line in stdout.splitlines():  # as the channel delivers it, result line and all
            if on_out:
                on_out(line)
        if on_err:
            on_err(f"{HEARTBEAT}{step} 2")
        return Result(step, command.display(), stdout, answer.stderr, answer.exit, 0.1)

    def put(self, local: Path, remote: str, progress: object = None, step: str = "") -> None:
        self.puts.append((local, remote))


def plan_of(name: str) -> Plan:
    return case_plan(PLAN / f"{name}.yaml")[1]


def console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200, color_system=None, force_terminal=False), buf


def torch_settles(name: str) -> Reconnect:
    """The torch step settles: the engine re-reads the facts, here those captured after a real
    bootstrap of the same host, before its validation wrote a verdict."""
    facts = raw("cpu-only-bootstrapped")["probes"]["journal"]["out"]
    journal = "\n".join(ln for ln in facts.splitlines() if '"validate"' not in ln
                        and '"verdict"' not in ln)
    after = plan_for({"facts": "cpu-only-bootstrapped", "probes": {"journal": journal},
                      **{k: v for k, v in case_plan(PLAN / f"{name}.yaml")[0].items()
                         if k in ("inventory", "cli", "push")}}, name)
    return Reconnect(lambda: pytest.fail("no reconnect without a reboot"), lambda ex: after)


TORCH_OK = Answer(result={"version": "2.13.0+cpu", "cuda": None}, log="Successfully installed torch")
PASS = Answer(result={"schema": 2, "verdict": "PASS", "mode": "cpu", "checks": []})


def test_a_fresh_cpu_host_runs_each_step_once_and_saves_the_report(tmp_path: Path) -> None:
    ex = FakeExecutor({"torch": TORCH_OK, "validate": PASS})
    out, buf = console()
    applied = apply(ex, plan_of("cpu-fresh"), again=torch_settles("cpu-fresh"),
                    store=Store(tmp_path), console=out)  # type: ignore[arg-type]
    assert [c[0] for c in ex.calls] == ["conda", "env", "torch", "validate"]
    assert [(s.name, s.result) for s in applied.steps] == [
        ("conda", "ok"), ("env", "ok"), ("torch", "ok"), ("packages", "skipped"), ("validate", "ok")]
    assert applied.verdict == "PASS" and applied.executions == 4
    assert applied.report_path is not None and applied.report_path.parent == tmp_path / "reports" / "cpu-fresh"
    assert json.loads(applied.report_path.read_text())["host"] == "cpu-fresh"
    text = buf.getvalue()
    assert "box: torch: install torch 2.13.0+cpu ..." in text
    # the heartbeat shows the log's last line, never the runtime's result line
    assert "box: torch running 2s: Successfully installed torch" in text and MARKER not in text
    assert "cpu-fresh: packages: nothing to do - recipe pytorch adds no packages" in text
    # each step ran detached under the host's lock, journaled with its inputs
    torch_script = next(cmd for step, cmd, _ in ex.calls if step == "torch")
    plan = plan_of("cpu-fresh")
    inputs = next(s.inputs for s in plan.steps if s.name == "torch")
    assert f"step=torch; inputs={inputs}; lock=\"$state/locks/\"host\n" in torch_script
    assert "setsid bash -c" in torch_script


def test_a_provisioned_host_costs_no_execution_and_keeps_its_verdict(tmp_path: Path) -> None:
    ex = FakeExecutor()
    out, _ = console()
    applied = apply(ex, plan_of("cpu-bootstrapped-noop"), store=Store(tmp_path), console=out)  # type: ignore[arg-type]
    assert ex.calls == [] and applied.executions == 0
    assert applied.verdict == "PASS" and applied.report is None
    assert {s.result for s in applied.steps} == {"skipped"}


def test_the_build_installed_must_be_the_one_chosen(tmp_path: Path) -> None:
    ex = FakeExecutor({"torch": Answer(result={"version": "2.14.1+cu130", "cuda": "13.0",
                                               "index": "http://127.0.0.1:8080/pytorch/cpu"})})
    out, _ = console()
    with pytest.raises(ProvisionError, match=r"installed torch 2\.14\.1\+cu130 \(CUDA 13\.0\) is "
                       r"none of the builds the rule allows \(torch 2\.13\.0\+cpu\); the index "
                       r"http://127\.0\.0\.1:8080/pytorch/cpu served another build"):
        apply(ex, plan_of("cpu-fresh"), again=torch_settles("cpu-fresh"),
              store=Store(tmp_path), console=out)  # type: ignore[arg-type]
    assert [c[0] for c in ex.calls] == ["conda", "env", "torch"]  # nothing after it


def test_a_failed_step_names_the_step_the_output_and_the_known_fix(tmp_path: Path) -> None:
    log = "Collecting torch\nERROR: Could not install packages due to an OSError: [Errno 28] No space left on device"
    ex = FakeExecutor({"torch": Answer(exit=1, log=log)}, log_dir=tmp_path / "logs")
    out, _ = console()
    with pytest.raises(RemoteError) as err:
        apply(ex, plan_of("cpu-fresh"), again=torch_settles("cpu-fresh"),
              store=Store(tmp_path), console=out)  # type: ignore[arg-type]
    # the engine reports; the known fix is added where the error is shown (doctor.explain)
    assert "disk space" not in str(err.value)
    msg = str(explain(err.value))
    assert msg.startswith("box: step 'torch' failed with exit code 1; last output:")
    assert "No space left on device" in msg
    assert "fix: pip ran out of disk space" in msg and "TMPDIR=" in msg
    assert f"the full log is in {tmp_path / 'logs'}/torch.log and on the host in " \
        "~/.gpu-provision/logs/torch.log" in msg


def test_a_held_lock_and_a_lost_link_are_one_line_each(tmp_path: Path) -> None:
    out, _ = console()
    held = FakeExecutor({"conda": Answer(exit=LOCKED, stderr=f"{REFUSED}another run holds the "
                                         "lock on this host: me@laptop pid 7 step torch since x\n")})
    with pytest.raises(ProvisionError, match=r"^box: another run holds the lock on this host: "
                       r"me@laptop pid 7 step torch since x - wait for it to finish \(or stop it: "
                       r"gpu-provision -H box cancel\), then run bootstrap again$"):
        apply(held, plan_of("cpu-fresh"), again=torch_settles("cpu-fresh"),
              store=Store(tmp_path), console=out)  # type: ignore[arg-type]
    lost = FakeExecutor({"env": Answer(exit=-1)})
    with pytest.raises(ProvisionError, match=r"^box: the connection was lost during step 'env' "):
        apply(lost, plan_of("cpu-fresh"), again=torch_settles("cpu-fresh"),
              store=Store(tmp_path), console=out)  # type: ignore[arg-type]


def test_the_driver_step_reboots_reconnects_confirms_and_holds(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bootstrap.time, "sleep", lambda s: None)
    before = plan_of("ubuntu2004-nodriver-nouveau")
    after_facts = plan_for({"facts": "ubuntu-20.04-nodriver-driver"}, "box")
    first = FakeExecutor({"driver": Answer(result={"reboot": True}, log="NEEDS_REBOOT")})
    second = FakeExecutor({"torch": Answer(result={"version": "2.14.1+cu130", "cuda": "13.0"}),
                           "validate": Answer(result={"verdict": "FAIL", "checks": []})})
    tries: list[str] = []

    def connect() -> FakeExecutor:
        tries.append("connect")
        if len(tries) < 3:  # the host is still down for a while
            raise SSHError("box", TIMEOUT, "no answer")
        return second

    replans: list[FakeExecutor] = []
    # after the torch step settles: the env holds the build it installed
    with_torch = plan_for({"facts": "ubuntu-20.04-nodriver-driver", "probes": {"envs": (
        "/root/miniconda3|/root/miniconda3|python3.11|\n/root/miniconda3|/root/miniconda3/envs/"
        "torch|python3.11|__version__=2.14.1+cu130 cuda:Optional[str]=13.0 ")}}, "box")

    def replan(ex: FakeExecutor) -> Plan:
        replans.append(ex)
        return after_facts if len(replans) == 1 else with_torch

    out, buf = console()
    applied = apply(first, before, again=Reconnect(connect, replan), store=Store(tmp_path),  # type: ignore[arg-type]
                    console=out)
    assert first.conn.closed and tries == ["connect"] * 3 and replans == [second, second]
    assert [c[0] for c in first.calls] == ["driver", "reboot"]
    assert [c[0] for c in second.calls] == ["driver-hold", "conda", "env", "torch", "validate"]
    hold = second.calls[0][1]
    # every package of the branch that loaded (580 here), found by its version
    assert "apt-mark hold" in hold and "-v b=580." in hold
    assert [s.name for s in applied.steps][:3] == ["driver", "reboot", "driver-hold"]
    text = buf.getvalue()
    assert "box: rebooting (the module cannot load without it) ..." in text
    assert "waiting for the host to come back (timeout)" in text
    assert "box: driver 580.126.20 loaded (CUDA <= 13.0)" in text
    assert applied.executions == 2 + 5


def test_a_driver_that_still_does_not_answer_stops_the_run(tmp_path: Path) -> None:
    before = plan_of("ubuntu2004-nodriver-nouveau")
    ex = FakeExecutor({"driver": Answer(result={"reboot": False}, log="DRIVER_LOADED")})
    out, _ = console()
    with pytest.raises(ProvisionError, match=r"^box: after the driver step nvidia-smi reports: no "
                       r"NVIDIA driver installed \(nvidia-smi not found\); see logs/ and "):
        apply(ex, before, again=Reconnect(lambda: ex, lambda e: before), store=Store(tmp_path),  # type: ignore[arg-type]
              console=out)
    assert [c[0] for c in ex.calls] == ["driver"]


def test_only_runs_the_named_steps(tmp_path: Path) -> None:
    ex = FakeExecutor({"validate": PASS})
    out, _ = console()
    applied = apply(ex, plan_of("cpu-bootstrapped-validate-again"), only={"validate"},  # type: ignore[arg-type]
                    store=Store(tmp_path), console=out)
    assert [c[0] for c in ex.calls] == ["validate"] and applied.verdict == "PASS"


def test_secret_input_goes_on_stdin_in_the_foreground(tmp_path: Path) -> None:
    ex = FakeExecutor({"torch": TORCH_OK, "validate": PASS})
    out, _ = console()
    apply(ex, plan_of("cpu-fresh-push-tokens"), again=torch_settles("cpu-fresh-push-tokens"),
          store=Store(tmp_path), console=out)  # type: ignore[arg-type]
    step, command, stdin = ex.calls[0]
    assert step == "secrets" and stdin == "export HF_TOKEN=hf_x\nexport WANDB_API_KEY=w\n"
    assert "hf_x" not in command and "setsid" not in command  # never in argv, not detached


def test_uploads_go_before_the_body(tmp_path: Path) -> None:
    payload = tmp_path / "model.bin"
    payload.write_bytes(b"x")
    plan = plan_of("cpu-bootstrapped-noop")
    extra = Step("extra", "a file the body needs", action="use the file", body="true",
                 uploads=(Upload(payload, "~/model.bin"),))
    ex = FakeExecutor()
    out, _ = console()
    apply(ex, replace(plan, steps=(*plan.steps, extra)), store=Store(tmp_path), console=out)  # type: ignore[arg-type]
    assert ex.puts == [(payload, "~/model.bin")] and [c[0] for c in ex.calls] == ["extra"]


def test_a_blocked_plan_runs_nothing(tmp_path: Path) -> None:
    ex = FakeExecutor()
    out, _ = console()
    with pytest.raises(ProvisionError, match=r"^rtx4090-gpu-lost: the GPU is not usable: a GPU has "
                       r"fallen off the bus"):
        apply(ex, plan_of("rtx4090-gpu-lost"), store=Store(tmp_path), console=out)  # type: ignore[arg-type]
    assert ex.calls == []
