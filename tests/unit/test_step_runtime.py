"""The step script (templates/remote/step.sh.j2) and ``cancel`` (templates/remote/cancel.sh.j2)
run by real bash here, with a home of their own: a second run of the same step follows it to its
end, a run of other inputs is refused at once, and cancel ends the step's whole session, frees
the lock, leaves the pid file so the next run redoes it, and tells the followers why."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from provision.errors import Interrupted
from provision.remote import runtime
from provision.remote.runtime import (
    CANCELLED,
    LOCKED,
    MARKER,
    REFUSED,
    Watch,
    cancel_script,
    detached_script,
    run_detached,
    split_result,
    stopped_text,
)

# the body leaves a grandchild in a subshell of its own: a kill of the body's pid alone would
# leave it running, with the lock
BODY = "echo started; (sleep 307; echo never) & sleep 306; echo never"


def _bash(script: str, home: Path, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(["bash", "-c", script], env={**os.environ, "HOME": str(home)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]


def _sleeps() -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "cmdline").read_bytes() in (b"sleep\x00306\x00",
                                                                     b"sleep\x00307\x00"):
                out.append(int(p.name))
        except OSError:
            continue
    return out


def _wait(cond: object, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_follow_refuse_and_cancel(tmp_path: Path) -> None:
    state = tmp_path / ".gpu-provision"
    first = _bash(detached_script("torch", BODY, inputs="abc"), tmp_path)
    try:
        _wait(lambda: len(_sleeps()) == 2 and (state / "steps/torch.pid").exists(),
              "the body never started")
        second = _bash(detached_script("torch", BODY, inputs="abc"), tmp_path)
        _wait(lambda: (state / "logs/torch.log").exists(), "no log")
        started = time.monotonic()
        other = subprocess.run(["bash", "-c", detached_script("torch", "true", inputs="xyz")],
                               env={**os.environ, "HOME": str(tmp_path)}, capture_output=True,
                               text=True, timeout=30)
        assert time.monotonic() - started < 2  # at once: the running step is another's
        assert other.returncode == LOCKED
        [said] = [ln for ln in other.stderr.splitlines() if ln.startswith(REFUSED)]
        assert said.startswith(f"{REFUSED}another run holds the lock on this host: ")
        assert said.endswith("step torch since " + said.split(" since ")[1].split(" ")[0] +
                             " (it runs step torch with other inputs than this run's)")

        stop = subprocess.run(["bash", "-c", cancel_script()], env={**os.environ,
                              "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=60)
        assert stop.returncode == 0, stop.stderr
        [row] = [json.loads(ln) for ln in stop.stdout.splitlines()]
        assert row["stopped"] and row["left"] == 0 and row["lock"] == "free"
        assert row["processes"] >= 3  # the wrapper, the body, its subshell and the sleeps
        assert not _sleeps()  # the whole session ended, the grandchild too
        assert stopped_text([row]).startswith("stopped step 'torch' on the host (pid ")

        errs = []
        for run in (first, second):  # each follower ends with the step, and says why
            out, err = run.communicate(timeout=30)
            assert run.returncode == CANCELLED, err
            log, line = split_result(out)
            assert line is not None and line["exit"] == CANCELLED and log.startswith("started")
            assert any(ln.startswith(f"{REFUSED}stopped on the host: ") for ln in err.splitlines())
            errs.append(err)
        assert "gpu-provision: re-attaching to torch (pid " in errs[1]  # it followed the first
        # marked for the next run: a pid file without an exit code; the journal says so
        assert (state / "steps/torch.pid").exists() and not (state / "steps/torch.rc").exists()
        entry = json.loads((state / "steps/torch.json").read_text())
        assert (entry["result"], entry["exit"], entry["inputs"]) == ("cancelled", 130, "abc")
        # the lock is free: the next run of the step starts at once
        again = subprocess.run(["bash", "-c", detached_script("torch", "echo again", inputs="abc")],
                               env={**os.environ, "HOME": str(tmp_path)}, capture_output=True,
                               text=True, timeout=30)
        assert again.returncode == 0 and f"again\n\n{MARKER} " in again.stdout
        assert not (state / "steps/torch.cancelled").exists()
        # nothing running: cancel says so, and changes nothing
        idle = subprocess.run(["bash", "-c", cancel_script()], env={**os.environ,
                              "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=30)
        assert (idle.returncode, idle.stdout) == (0, "")
        assert stopped_text([]) == "no step of ours is running on the host"
    finally:
        for p in _sleeps():
            os.kill(p, 9)
        if first.poll() is None:
            first.kill()


class _Host:
    """An executor whose step is interrupted by Ctrl-C while it is followed; ``query`` answers
    the cancel script as the host does (one JSON line per step stopped)."""

    host = "box"
    log_dir = None
    secrets: tuple[str, ...] = ()
    executions = 0

    def __init__(self) -> None:
        self.asked: list[str] = []

    def run(self, *_: object, **__: object) -> object:
        raise KeyboardInterrupt

    def query(self, name: str, script: str, parse: Any, **_: object) -> Any:
        self.asked.append(name)
        return parse('{"step": "torch", "pid": 41, "stopped": true, "processes": 4, "left": 0, '
                     '"lock": "free"}\n')


def test_one_ctrl_c_says_it_goes_on_and_a_second_stops_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    alerts: list[str] = []
    watch = Watch(lambda _: None, "torch", alert=alerts.append)
    monkeypatch.setattr(runtime.time, "sleep", lambda s: None)  # no second Ctrl-C in the grace
    ex = _Host()
    with pytest.raises(Interrupted) as once:
        run_detached(ex, "torch", "true", on_err=watch.err, again="bootstrap")  # type: ignore[arg-type]
    assert once.value.shown and once.value.exit_code == 130 and ex.asked == []
    assert alerts == [str(once.value).removeprefix("box: ")]
    assert "Ctrl-C again within 3s stops it there, later `gpu-provision -H box cancel` does" \
        in alerts[0]

    def second(_: float) -> None:
        raise KeyboardInterrupt
    monkeypatch.setattr(runtime.time, "sleep", second)
    with pytest.raises(Interrupted) as twice:
        run_detached(ex, "torch", "true", on_err=watch.err, again="bootstrap")  # type: ignore[arg-type]
    assert ex.asked == ["cancel"] and not twice.value.shown  # the error says what was done
    assert str(twice.value) == (
        "box: stopped step 'torch' on the host (pid 41, its session of 4 process(es) ended; the "
        "lock is free); the next bootstrap redoes it (the second Ctrl-C)")
    # a step that runs as root is never stopped midway: no grace, no cancel
    ex.asked.clear()
    with pytest.raises(Interrupted, match="a package manager is not stopped midway"):
        run_detached(ex, "driver", "true", on_err=watch.err, needs_root=True)  # type: ignore[arg-type]
    assert ex.asked == []


def test_a_step_stops_before_a_download_that_cannot_land(tmp_path: Path) -> None:
    """templates/setup/_space.sh.j2 under bash: room BYTES DIR WHAT against df of DIR (or the
    nearest folder above it that exists); the caches go under the env's disk when one is set."""
    from provision.remote.templating import render
    cache = tmp_path / "data" / ".cache" / "gpu-provision"
    part = render("setup/_space.sh.j2", space={"cache": str(cache), "bytes": 1, "download": 0,
                                               "ratio": 1.0, "what": "torch", "code": 28})
    free = int(subprocess.run(["df", "-Pk", str(tmp_path)], capture_output=True, text=True
                              ).stdout.splitlines()[1].split()[3]) * 1024
    fits = subprocess.run(["bash", "-c", part + f'room 1000 "{tmp_path}/not/yet" torch; '
                           'echo "$TMPDIR $PIP_CACHE_DIR $UV_CACHE_DIR"'],
                          capture_output=True, text=True, timeout=30)
    assert fits.returncode == 0, fits.stderr
    assert fits.stdout.splitlines()[0].startswith(
        f"room for torch: about 0 MB needed in {tmp_path}, ")
    assert fits.stdout.splitlines()[1] == f"{cache}/tmp {cache}/pip {cache}/uv"
    assert (cache / "uv").is_dir()
    short = subprocess.run(["bash", "-c", part + f'room {free * 10} "{tmp_path}" "torch 2.5"; '
                            "echo went on"], capture_output=True, text=True, timeout=30)
    assert short.returncode == 28 and "went on" not in short.stdout
    assert short.stderr.startswith(f"not enough room for torch 2.5: it needs about "
                                   f"{free * 10 // 1000000} MB in {tmp_path}, which has ")
    assert short.stderr.rstrip().endswith("MB free; nothing was downloaded")
