"""A container whose home is a small disk and whose data disk has room, as AutoDL rents them:
real tmpfs disks of those sizes in the host's own mount namespace (profile small-disk-container,
tests/sandbox/hostd.py ``disks``). Without the data disk the plan is refused with the figures and
nothing is downloaded (exit 2); with it, the env goes there, and bootstrap puts it there for
real. On the way, Ctrl-C of that bootstrap during the torch step, a second bootstrap that
attaches to the step, and ``cancel``: the step's processes end on the host, the lock is free,
and the next bootstrap redoes the step. (A job started during a step is refused: test_jobs.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Hosts, gpu_provision
from tests.sandbox import harness
from tests.sandbox.mirror import Gate
from tests.sandbox.test_hands import Running

pytestmark = pytest.mark.sandbox

PROFILE = "small-disk-container"
DATA = "/root/autodl-tmp"
STATE = "/root/.gpu-provision"


def _in(info: harness.HostInfo, *argv: str) -> subprocess.CompletedProcess[str]:
    return harness.in_host(info, *argv, check=False)


def _session(pid: int) -> list[int]:
    """Processes of the session ``pid`` leads (the sandbox hosts share this machine's pids)."""
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and int((p / "stat").read_text().rsplit(")", 1)[1].split()[3]) == pid:
                out.append(int(p.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _waited_on(info: harness.HostInfo, step: str) -> bool:
    """A run follows ``step`` (holds its waiter: step.sh.j2), read in the host's own view."""
    return _in(info, "flock", "-n", "-x", f"{STATE}/steps/{step}.waiter", "true").returncode == 1


def test_the_plan_fits_the_disk_and_ctrl_c_and_cancel_stop_the_step(
        hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    info = hosts.fresh(PROFILE)
    gate = Gate(f"{info.id}-disk")
    # the install waits at the gate: mirrors.timeout long enough that it is not given up
    inv = info.inventory_with_mirrors(tmp_path / "gated" / Path(info.inventory).name,
                                      {"pytorch": gate.url, "timeout": 120})
    env = {**os.environ, "GPU_PROVISION_HOME": str(gp_home), "COLUMNS": "200",
           "GPU_PROVISION_WORKDIR": str(tmp_path)}
    try:
        # no data disk: the home's 200 MB cannot hold Miniconda and torch, /opt (16 MB) neither,
        # and / and /tmp are no place for an env: refused with the figures, nothing changed
        _in(info, "umount", DATA)
        plan = gpu_provision("-H", inv, "plan", home=gp_home, cwd=tmp_path)
        assert plan.returncode == 2, plan.stdout + plan.stderr
        blocked = [ln for ln in plan.stdout.splitlines() if ln.startswith("blocked:")]
        assert len(blocked) == 1 and blocked[0].startswith(
            "blocked: not enough disk for this plan: /root (200.0 MiB free) needs ")
        assert "torch 2.13.0+cpu 667.6 MiB" in blocked[0]
        assert "no data disk or other writable mount has room for it either" in blocked[0]
        assert "set env_dir: DIR in the inventory" in blocked[0]
        assert not plan.stderr.strip() or "error" not in plan.stderr  # said once, not again
        boot = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path)
        assert boot.returncode == 2, boot.stdout + boot.stderr
        assert boot.stderr.count("not enough disk for this plan") == 1
        assert _in(info, "ls", "-A", f"{STATE}/steps").stdout == ""  # no step ran
        assert _in(info, "test", "-e", "/root/miniconda3").returncode == 1

        # the data disk back (3 GB): the env, its Miniconda and the caches go there
        _in(info, "mount", "-t", "tmpfs", "-o", "size=3g", "disk", DATA)
        p = json.loads(gpu_provision("-H", inv, "plan", "--json", home=gp_home,
                                     cwd=tmp_path).stdout)
        assert p["blocked"] is None
        acts = {d["step"]: (d["action"], d["reason"]) for d in p["decisions"]}
        assert acts["disk"][0] == f"put the env in {DATA}"
        assert acts["disk"][1].startswith("/root (200.0 MiB free) needs ")
        assert f"`env_dir: {DATA}` in the inventory keeps them there" in acts["disk"][1]
        assert acts["conda"][0] == f"install Miniconda at {DATA}/miniconda3"
        assert {d["mount"]: d["fits"] for d in p["space"]["disks"]} == {DATA: True}

        # bootstrap, held in the torch step by the gate; a second one follows the same step
        first = Running([sys.executable, "-m", "provision", "-H", inv, "bootstrap"], env,
                        tmp_path, session=True)
        harness.wait_until(lambda: gate.holding() and _waited_on(info, "torch"),
                           "the torch download never began", first.proc)
        second = Running([sys.executable, "-m", "provision", "-H", inv, "bootstrap"], env,
                         tmp_path)
        second.wait_line(r"re-attaching to torch \(pid \d+\), still running: ", timeout=90)
        pid = int(_in(info, "cut", "-d", " ", "-f1", f"{STATE}/steps/torch.pid").stdout)
        assert len(_session(pid)) >= 2  # the step's wrapper and its install

        # Ctrl-C (SIGINT to the program's process group): the step goes on, and it says how to
        # stop it; it ends 130 once the grace for a second Ctrl-C has passed
        os.killpg(os.getpgid(first.proc.pid), signal.SIGINT)
        assert first.proc.wait(60) == 130, first.err
        said = [ln for ln in first.err if "interrupted while waiting" in ln]
        assert len(said) == 1, first.out + first.err  # once
        assert not any("interrupted" in ln for ln in first.out)
        assert said[0] == f"{info.id}: " + (
            "interrupted while waiting for step 'torch'; it goes on, detached, on the host (log "
            "~/.gpu-provision/logs/torch.log). Ctrl-C again within 3s stops it there, later "
            f"`gpu-provision -H {Path(inv).stem} cancel` does; run bootstrap again to re-attach "
            "and finish")
        assert _session(pid) and second.proc.poll() is None  # it goes on, followed by the second

        stop = gpu_provision("-H", inv, "cancel", "--json", home=gp_home, cwd=tmp_path)
        assert stop.returncode == 0, stop.stderr
        [row] = json.loads(stop.stdout)["stopped"]
        assert (row["step"], row["pid"], row["stopped"], row["left"], row["lock"]) == \
            ("torch", pid, True, 0, "free")
        assert not _session(pid)  # the wrapper, uv and whatever they started: all gone
        assert _in(info, "flock", "-n", f"{STATE}/locks/host", "true").returncode == 0
        entry = json.loads(_in(info, "cat", f"{STATE}/steps/torch.json").stdout)
        assert (entry["result"], entry["exit"]) == ("cancelled", 130)
        assert second.proc.wait(60) == 130, second.err
        assert any("step 'torch' was stopped on the host: " in ln and
                   ln.endswith("the next bootstrap redoes it") for ln in second.err), second.err

        # the next bootstrap starts the step again; two Ctrl-C a moment apart stop it at once
        again = Running([sys.executable, "-m", "provision", "-H", inv, "bootstrap"], env,
                        tmp_path, session=True)

        def restarted() -> int:
            now = _in(info, "cut", "-d", " ", "-f1", f"{STATE}/steps/torch.pid").stdout.strip()
            return int(now) if now.isdigit() and int(now) != pid and _session(int(now)) else 0
        harness.wait_until(lambda: restarted() and _waited_on(info, "torch"),
                           "the torch step never started again", again.proc)
        pid = restarted()
        os.killpg(os.getpgid(again.proc.pid), signal.SIGINT)
        again.wait_line(r"Ctrl-C again within 3s stops it there")
        os.killpg(os.getpgid(again.proc.pid), signal.SIGINT)
        assert again.proc.wait(60) == 130, again.err
        assert again.err[-1] == (f"error: {info.id}: stopped step 'torch' on the host (pid {pid}, "
                                 "its session of " + again.err[-1].split("its session of ")[1])
        assert again.err[-1].endswith("the lock is free); the next bootstrap redoes it (the "
                                      "second Ctrl-C)")
        assert not _session(pid)

        # the next bootstrap redoes the step, on the data disk
        gate.open()
        third = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, timeout=600)
        assert third.returncode == 0, third.stdout + third.stderr
        assert ("torch: redo: install torch 2.13.0+cpu (interrupted on the host before it "
                "finished (a reboot or a kill)) ...") in third.stdout
        assert "verdict: " in third.stdout
        env_dir = f"{DATA}/miniconda3/envs/torch"
        assert _in(info, f"{env_dir}/bin/python", "-c", "import torch").returncode == 0
        log = _in(info, "cat", f"{STATE}/logs/torch.log").stdout
        assert "torch==2.13.0: the wheel is 191 MB (the Content-Length of a HEAD of " in log
        assert f"room for torch 2.13.0+cpu and its download: about 892 MB needed in {env_dir}" \
            in log
        # what it unpacked and cached lies on the data disk; the home holds our small state
        used = {ln.split()[-1]: int(ln.split()[2]) for ln in
                _in(info, "df", "-Pk", "/root", DATA).stdout.splitlines()[1:]}
        assert used["/root"] < 80 * 1024 and used[DATA] > 600 * 1024, used
        assert _in(info, "test", "-d", f"{DATA}/.cache/gpu-provision/uv").returncode == 0
    finally:
        gate.open()
        harness.stop(info.id)
