"""Faults mid-run on sandbox hosts: a mirror that answers 404 or hangs, a full disk, Ctrl-C on
the laptop and an unexpected reboot of the host. Each ends with the host consistent, the user told
what happened and what to run, and the next run finishing the job. (The dropped connection, the
bad sha256 and the concurrent run are in test_bootstrap.py.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Hosts, gpu_provision
from tests.sandbox import harness
from tests.sandbox.harness import wait_until
from tests.sandbox.mirror import Gate

pytestmark = pytest.mark.sandbox


@pytest.fixture
def hung_mirror() -> Iterator[str]:
    """A mirror that accepts the connection and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield f"http://127.0.0.1:{s.getsockname()[1]}/whl"
    s.close()


def alive(pid: int) -> bool:
    """Running (a killed process may linger as a zombie until its parent reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def journal(info: harness.HostInfo) -> dict[str, dict[str, object]]:
    return {p.stem: json.loads(p.read_text())
            for p in info.path("/root/.gpu-provision/steps").glob("*.json")}


def test_mirror_404_or_hang_moves_on_else_names_every_url(hosts: Hosts, gp_home: Path,
                                                          tmp_path: Path, hung_mirror: str) -> None:
    info = hosts.fresh("cpu-only")
    try:
        good = info.mirror
        missing = good["pytorch"].rsplit("/", 1)[0] + "/no-such-mirror"
        inv = info.inventory_with(tmp_path / "mirrors.yaml", mirrors={
            "miniconda": [hung_mirror, missing, good["miniconda"]],
            "pypi": good["pypi"],
            "conda_channels": [good["conda"]],
            "pytorch": [missing, hung_mirror],
            "timeout": 2})  # a hung mirror is passed over after mirrors.timeout seconds
        started = time.monotonic()
        r = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path)
        seconds = time.monotonic() - started
        out = r.stdout + r.stderr
        assert r.returncode == 1
        # Miniconda: the hung and the 404 mirrors are passed over, the third one is used
        log = "".join(p.read_text() for p in (tmp_path / "logs").rglob("conda.log"))
        assert f"mirror {hung_mirror} (miniconda) failed: no answer within 2s" in log
        assert f"mirror {missing} (miniconda) failed: HTTP 404" in log
        assert f"downloading {good['miniconda']}/Miniconda3-latest-Linux-x86_64.sh" in log
        # torch: neither index answers; the error names both and what to change
        assert "step 'torch' failed with exit code 4" in out
        assert (f"no pytorch mirror answered: {missing}/cpu (HTTP 404); {hung_mirror}/cpu "
                "(no answer within 2s);") in out
        assert "under mirrors.pytorch in the inventory" in out
        assert seconds < 120  # each hang is bounded
        # consistent: what finished is recorded as done, the failed step as failed, no lock held
        j = journal(info)
        assert {k: v["result"] for k, v in j.items()} == {"conda": "ok", "env": "ok",
                                                            "torch": "failed"}
        assert j["torch"]["exit"] == 4
        plan = gpu_provision("-H", inv, "plan", "--json", home=gp_home, cwd=tmp_path)
        assert plan.returncode == 0, plan.stderr
        p = json.loads(plan.stdout)
        assert p["changes"] == ["torch"]
        acts = {d["step"]: d["action"] for d in p["decisions"]}
        assert (acts["conda"], acts["env"]) == ("none", "none")
        assert acts["torch"].startswith("install torch ")
    finally:
        harness.stop(info.id)


def test_full_disk_is_refused_before_any_download_and_a_half_install_is_cleared(
        hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    """A disk that cannot hold Miniconda (a 6 MB tmpfs where it would go, and /opt as small:
    no other disk with room) is refused by the plan with the figures, before anything is
    downloaded; nothing is left half-made. (A disk that fills under a running step fails it with
    the kernel's ENOSPC, which doctor names: tests/fixtures/errors/cases.) Then what a killed
    install leaves (its conda.partial mark and a half-unpacked prefix) is cleared by the next."""
    info = hosts.fresh("cpu-only")
    try:
        for where in ("/root/miniconda3", "/opt"):
            harness.in_host(info, "mkdir", "-p", where)
            harness.in_host(info, "mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", where)
        r = gpu_provision("-H", info.inventory, "conda", home=gp_home, cwd=tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr  # blocked: nothing can go ahead
        [line] = [ln for ln in r.stderr.splitlines() if "not enough disk" in ln]  # said once
        assert line.startswith(f"error: {info.id}: not enough disk for this plan: "
                               "/root/miniconda3 (6.0 MiB free) needs ")
        assert "Miniconda 572.2 MiB" in line and "set env_dir: DIR in the inventory" in line
        assert "conda" not in journal(info)  # the step never ran
        assert harness.in_host(info, "ls", "-A", "/root/miniconda3").stdout == ""
        for where in ("/root/miniconda3", "/opt"):
            harness.in_host(info, "umount", where)

        # what an install killed midway leaves: its mark, and part of the prefix
        harness.in_host(info, "mkdir", "-p", "/root/.gpu-provision", "/root/miniconda3/pkgs")
        harness.in_host(info, "sh", "-c", "echo /root/miniconda3 > /root/.gpu-provision/"
                        "conda.partial; echo half > /root/miniconda3/pkgs/half-unpacked")
        again = gpu_provision("-H", info.inventory, "conda", home=gp_home, cwd=tmp_path)
        assert again.returncode == 0, again.stdout + again.stderr
        log = "".join(p.read_text() for p in (tmp_path / "logs").rglob("conda.log"))
        assert "an earlier Miniconda install at /root/miniconda3 did not finish: clearing it" in log
        assert journal(info)["conda"]["result"] == "ok"
        assert harness.in_host(info, "/root/miniconda3/bin/conda", "--version").returncode == 0
        assert harness.in_host(info, "test", "-e", "/root/miniconda3/pkgs/half-unpacked",
                               check=False).returncode == 1
        assert harness.in_host(info, "test", "-e", "/root/.gpu-provision/conda.partial",
                               check=False).returncode == 1
    finally:
        harness.stop(info.id)


def test_ctrl_c_then_reattach_then_a_reboot_then_resume(hosts: Hosts, gp_home: Path,
                                                        tmp_path: Path) -> None:
    """Ctrl-C here leaves the pip install running on the host and says how to re-attach; the
    next run re-attaches; the host then reboots under it; the run after that redoes the
    interrupted step from the journal and finishes."""
    info = hosts.fresh("cpu-only")
    gate = Gate(info.id)  # the install stays mid-download until the reboot has killed it
    inv = info.inventory_with_mirrors(tmp_path / "gated" / Path(info.inventory).name,
                                      {"pytorch": gate.url})
    env = {**os.environ, "GPU_PROVISION_HOME": str(gp_home), "COLUMNS": "200",
           "GPU_PROVISION_WORKDIR": str(tmp_path)}
    pidf = info.path("/root/.gpu-provision/steps/torch.pid")

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "provision", "-H", inv,
                                 "bootstrap"], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)

    try:
        first = start()
        wait_until(lambda: pidf.exists() and gate.holding(), "the torch download never began",
                 first)
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=30)
        assert first.returncode == 130, out + err
        assert "interrupted while waiting for step 'torch'; it goes on, detached, on the host" in err
        assert "run bootstrap again to re-attach" in err
        assert "Ctrl-C again within 3s stops it there, later `gpu-provision -H " in err + out
        pid = int(pidf.read_text().split()[0])
        assert alive(pid)  # pip goes on

        # the first run's waiter on the host ends at its next heartbeat; the second re-attaches
        wait_until(lambda: not info.step_waited_on("torch"), "the first run's waiter never ended")
        second = start()
        wait_until(lambda: info.step_waited_on("torch"), "the second run never re-attached", second)
        boots = info.state().get("boots", 0)
        harness.in_host(info, "reboot", check=False)  # unexpected; it may kill its caller
        wait_until(lambda: info.state().get("boots", 0) > boots, "the host did not reboot")
        out, err = second.communicate(timeout=60)
        assert second.returncode != 0
        assert "re-attaching to torch" in out
        assert "the connection was lost during step 'torch' (the network dropped, or the host " \
            "rebooted)" in err
        assert not alive(pid)  # the reboot killed the install

        harness._wait_ssh(info.host, info.port)  # the host is back
        facts = json.loads(gpu_provision("-H", inv, "facts", "--json", home=gp_home).stdout)
        assert facts["interrupted"] == ["torch"]
        gate.open()
        third = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path)
        assert third.returncode == 0, third.stdout + third.stderr
        assert ("torch: redo: install torch 2.13.0+cpu (interrupted on the host before it "
                "finished (a reboot or a kill)) ...") in third.stdout
        assert "verdict: PASS" in third.stdout
        j = journal(info)
        assert {k: v["result"] for k, v in j.items()} == {
            "conda": "ok", "env": "ok", "torch": "ok", "validate": "ok", "verdict": "PASS"}
        assert json.loads(gpu_provision("-H", inv, "facts", "--json",
                                        home=gp_home).stdout)["interrupted"] == []
    finally:
        gate.open()
        harness.stop(info.id)
