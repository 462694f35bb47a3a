"""`bootstrap` end to end on a CPU-only sandbox host: real conda test installer from the mirror,
a conda env, the real torch wheel through pip, validation; then the lock, the re-run and a bad
sha256."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import Hosts, gpu_provision
from tests.sandbox import harness
from tests.sandbox.harness import wait_until
from tests.sandbox.mirror import TAMPERED, Gate
from tests.sandbox.proxy import TcpProxy
from tests.sandbox.test_hands import Running

# the installer the mirror serves, and what arrives when it is altered on the way
INSTALLER = (harness.HERE / "miniconda_installer.sh").read_bytes()
GENUINE = hashlib.sha256(INSTALLER).hexdigest()
ALTERED = hashlib.sha256(INSTALLER + TAMPERED).hexdigest()

pytestmark = pytest.mark.sandbox


def test_bootstrap_lock_and_rerun(hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    info = hosts.fresh("cpu-only")
    gate = Gate(info.id)  # the torch download waits there: the step holds the lock until opened
    try:
        # named as the host's own inventory: its logs and reports keep the host's name
        # the install waits at the gate: mirrors.timeout long enough that it is not given up
        inv = info.inventory_with_mirrors(tmp_path / "gated" / Path(info.inventory).name,
                                          {"pytorch": gate.url, "timeout": 120})
        owner = info.path("/root/.gpu-provision/locks/host.owner")
        first = subprocess.Popen([sys.executable, "-m", "provision", "-H", inv,
                                  "bootstrap"], cwd=tmp_path, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 env={**os.environ,
                                      "GPU_PROVISION_HOME": str(gp_home), "COLUMNS": "200",
                                      "GPU_PROVISION_WORKDIR": str(tmp_path)})
        wait_until(lambda: owner.exists() and "step torch" in owner.read_text()
                   and gate.holding(), "the torch step never started downloading", first)
        # a second bootstrap follows the very step that runs (its log, its end) ...
        second = Running([sys.executable, "-m", "provision", "-H", inv, "bootstrap"],
                         {**os.environ, "GPU_PROVISION_HOME": str(gp_home), "COLUMNS": "200",
                          "GPU_PROVISION_WORKDIR": str(tmp_path)}, tmp_path)
        second.wait_line(r"re-attaching to torch \(pid \d+\), still running: root@")
        # ... while a step of another kind is refused at once, the holder named, once
        started = time.monotonic()
        other = gpu_provision("-H", inv, "validate", home=gp_home, cwd=tmp_path)
        assert other.returncode == 1 and time.monotonic() - started < 30
        assert other.stderr.count("another run holds the lock on this host") == 1, other.stderr
        assert "step torch since" in other.stderr and "pid" in other.stderr
        assert "gpu-provision -H " in other.stderr and " cancel)" in other.stderr

        gate.open()
        out, err = first.communicate(timeout=600)
        assert first.returncode == 0, out + err
        assert "verdict: PASS" in out
        assert second.proc.wait(600) == 0, second.err
        assert any("verdict: PASS" in ln for ln in second.out)
        reports = list((tmp_path / "reports" / info.id).glob("validate-*.json"))
        assert len(reports) == 2  # each run's verdict
        for path in reports:
            report = json.loads(path.read_text())
            assert (report["verdict"], report["mode"], report["torch"]) == \
                ("PASS", "cpu", "2.13.0+cpu")
        logs = [p.read_text() for p in (tmp_path / "logs" / info.id).glob("*/torch.log")]
        assert len(logs) == 2  # the run that installed, and the one that followed it
        assert all(" + torch==2.13.0+cpu\n" in t for t in logs)  # uv's list, seen by both
        host_log = info.path("/root/.gpu-provision/logs/torch.log").read_text()
        assert host_log.count(" + torch==2.13.0+cpu\n") == 1  # one install
        refused = [p.read_text() for p in (tmp_path / "logs" / info.id).glob("*/validate.log")]
        assert sum("another run holds the lock on this host: root@" in t for t in refused) == 1
        # the installer was checked against the sha256 the mirror's index publishes
        conda_logs = [p.read_text() for p in (tmp_path / "logs" / info.id).glob("*/conda.log")]
        assert sum(f"sha256 ok: {GENUINE}\n" in t for t in conda_logs) == 1
        steps = {p.stem: json.loads(p.read_text())
                 for p in info.path("/root/.gpu-provision/steps").glob("*.json")}
        assert {k: v["result"] for k, v in steps.items()} == {
            "conda": "ok", "env": "ok", "torch": "ok", "validate": "ok", "verdict": "PASS"}

        # a second bootstrap changes nothing and needs one remote execution: the facts show that
        # nothing validation checked has changed since it passed
        torch_dir = info.path("/root/miniconda3/envs/torch/lib/python3.11/site-packages/torch")
        stamp = torch_dir.stat().st_mtime_ns
        before = len(info.sessions())
        again = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert len(info.sessions()) - before == 1
        for step in ("conda", "env", "torch"):
            assert f"{step}: nothing to do" in again.stdout
        assert "validate: nothing to do - PASS 0 min ago on this boot, and nothing it checked " \
            "has changed (`validate` measures again)" in again.stdout
        assert torch_dir.stat().st_mtime_ns == stamp
        for step in ("conda", "env", "torch", "verdict"):
            entry = json.loads(info.path(f"/root/.gpu-provision/steps/{step}.json").read_text())
            assert entry == steps[step]

        # once something it checks changes (here: a reboot, so a new boot id) it runs again
        boots = info.state().get("boots", 0)
        harness.in_host(info, "reboot", check=False)  # a reboot may kill its caller
        deadline = time.monotonic() + 60
        while info.state().get("boots", 0) == boots:
            assert time.monotonic() < deadline, "the host did not reboot"
            time.sleep(0.1)
        harness._wait_ssh(info.host, info.port)
        before = len(info.sessions())
        rebooted = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path)
        assert rebooted.returncode == 0, rebooted.stderr
        assert len(info.sessions()) - before == 2 and "verdict: PASS" in rebooted.stdout
    finally:
        gate.open()
        harness.stop(info.id)


def test_bad_miniconda_sha256_installs_nothing(hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    info = hosts.fresh("cpu-only")
    try:
        path = info.inventory_with(tmp_path / "bad-sha.yaml", miniconda_sha256="0" * 64)
        r = gpu_provision("-H", path, "bootstrap", home=gp_home, cwd=tmp_path)
        assert r.returncode == 1
        assert "step 'conda' failed with exit code 3" in r.stderr
        assert "sha256 mismatch" in r.stderr and "nothing installed" in r.stderr
        assert not info.path("/root/miniconda3").exists()
        entry = json.loads(info.path("/root/.gpu-provision/steps/conda.json").read_text())
        assert (entry["result"], entry["exit"]) == ("failed", 3)
    finally:
        harness.stop(info.id)


def test_tampered_miniconda_is_refused_by_the_published_sha256(hosts: Hosts, gp_home: Path,
                                                              tmp_path: Path) -> None:
    """No sha256 in the inventory: the one to check comes from the mirror's index page, which
    lists the genuine installer's, while the installer itself was altered on the way (a man in
    the middle, a broken CDN edge). Bootstrap refuses it and installs nothing."""
    info = hosts.fresh("cpu-only")
    try:
        assert "miniconda_sha256" not in yaml.safe_load(Path(info.inventory).read_text())
        path = info.inventory_with_mirrors(tmp_path / "tampered.yaml",
                                           {"miniconda": info.mirror["miniconda_tampered"]})
        r = gpu_provision("-H", path, "bootstrap", home=gp_home, cwd=tmp_path)
        assert r.returncode == 1
        assert "step 'conda' failed with exit code 3" in r.stderr
        assert "sha256 mismatch" in r.stderr and "nothing installed" in r.stderr
        [log] = [p.read_text() for p in (tmp_path / "logs").rglob("conda.log")]
        assert (f"downloading {info.mirror['miniconda_tampered']}/Miniconda3-latest-Linux-x86_64.sh"
                in log)
        assert (f"sha256 mismatch for Miniconda3-latest-Linux-x86_64.sh: expected {GENUINE}, got "
                f"{ALTERED}; nothing installed") in log
        assert "sha256 ok" not in log
        assert not info.path("/root/miniconda3").exists()
        entry = json.loads(info.path("/root/.gpu-provision/steps/conda.json").read_text())
        assert (entry["result"], entry["exit"]) == ("failed", 3)
        # the steps after it did not run
        assert sorted(p.stem for p in info.path("/root/.gpu-provision/steps").glob("*.json")) == \
            ["conda"]
    finally:
        harness.stop(info.id)


def test_dropped_connection_during_pip_then_reattach(hosts: Hosts, gp_home: Path,
                                                      tmp_path: Path) -> None:
    """The link dies during the torch install: the install goes on, detached, on the host; the
    next bootstrap re-attaches to it and finishes."""
    info = hosts.fresh("cpu-only")
    proxy = TcpProxy((info.host, info.port))
    gate = Gate(info.id)  # the install stays mid-download until the next run has re-attached
    try:
        path = info.inventory_with_mirrors(tmp_path / "via-proxy.yaml", {"pytorch": gate.url},
                                           host="127.0.0.1", port=proxy.port)
        env = {**os.environ, "GPU_PROVISION_HOME": str(gp_home), "COLUMNS": "200",
               "GPU_PROVISION_WORKDIR": str(tmp_path)}
        first = subprocess.Popen([sys.executable, "-m", "provision", "-H", path, "bootstrap"],
                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env)
        pidf = info.path("/root/.gpu-provision/steps/torch.pid")
        wait_until(lambda: pidf.exists() and gate.holding(), "the torch download never began",
                   first)
        proxy.cut()
        out, err = first.communicate(timeout=60)
        assert first.returncode != 0  # the laptop lost the host mid-step ...
        assert "the connection was lost during step 'torch'" in err
        pid = int(pidf.read_text().split()[0])
        assert Path(f"/proc/{pid}").exists()  # ... but the install goes on, detached

        # the cut run's waiter on the host ends at its next heartbeat; the next run takes its
        # place, and only then may the download finish
        wait_until(lambda: not info.step_waited_on("torch"), "the cut run's waiter never ended")
        again = subprocess.Popen([sys.executable, "-m", "provision", "-H", path, "bootstrap"],
                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env)
        wait_until(lambda: info.step_waited_on("torch"), "the next run never re-attached", again)
        gate.open()
        out, err = again.communicate(timeout=600)
        assert again.returncode == 0, out + err
        logs = "".join(p.read_text() for p in (tmp_path / "logs").rglob("torch.log"))
        assert "re-attaching to torch" in logs
        assert "verdict: PASS" in out
        entry = json.loads(info.path("/root/.gpu-provision/steps/torch.json").read_text())
        assert entry["result"] == "ok"
        # the re-attached install was not started again: one install in the host's log
        host_log = info.path("/root/.gpu-provision/logs/torch.log").read_text()
        assert host_log.count("installer: ") == 1 and host_log.count(" + torch==2.13.0+cpu") == 1
    finally:
        gate.open()
        proxy.close()
        harness.stop(info.id)
