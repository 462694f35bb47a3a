"""Many hosts at once: parallel, per-host output, one failure never hides the others."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, Hosts, gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("program", ["gpu-provision", "fab"])
def test_three_hosts_and_a_dead_one(hosts: Hosts, gp_home: Path, program: str) -> None:
    infos = [hosts.get(p) for p in ("cpu-only", "rocky-9-h100", "debian-12")]
    dead = f"root@127.0.0.1:{closed_port()}"
    spec = ",".join([f"root@{i.host}:{i.port}" for i in infos] + [dead])
    key = infos[0].key
    if program == "fab":
        r = subprocess.run([str(Path(sys.executable).with_name("fab")), "-i", key, "-H", spec,
                            "plan", "--json"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, env=dict(os.environ, GPU_PROVISION_HOME=str(gp_home),
                                                 COLUMNS="200"))
    else:
        r = gpu_provision("-i", key, "-H", spec, "plan", "--json", home=gp_home)
    assert r.returncode == 1  # one host failed
    # --json: stdout holds one JSON line per host (the dead one's an error object); the people's
    # part, each host's error and the summary, is on stderr
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert sorted(d["host"] for d in docs if "decisions" in d) == sorted(
        f"root@{i.host}:{i.port}" for i in infos)  # every live host's plan was printed
    [error] = [d for d in docs if "error" in d]
    assert error["host"] == dead and error["exit_code"] == 1
    assert "connection refused" in error["error"]
    assert f"{dead}: error: connection refused: " in r.stderr
    summary = r.stderr[r.stderr.index("summary: 4 hosts"):]
    by_host = {d["host"]: d for d in docs if "decisions" in d}
    driver = {h: next(x for x in p["decisions"] if x["step"] == "driver") for h, p in by_host.items()}
    assert driver[f"root@{infos[0].host}:{infos[0].port}"]["reason"] == \
        "no NVIDIA GPU on the PCI bus: CPU-only host"
    assert [driver[f"root@{i.host}:{i.port}"]["action"] for i in infos] == ["none"] * 3
    assert [by_host[f"root@{i.host}:{i.port}"]["torch"]["cuda"] for i in infos] == \
        ["cpu", "cu130", "cu126"]
    lines = [ln for ln in summary.splitlines() if "root@" in ln]
    for i in infos:
        assert any(f"root@{i.host}:{i.port}" in ln and "│ ok" in ln for ln in lines), summary
    assert any(dead in ln and "failed" in ln for ln in lines), summary


def test_inventory_group(hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    infos = [hosts.get(p) for p in ("cpu-only", "debian-12")]
    group = tmp_path / "farm.yaml"
    group.write_text("group:\n" + "".join(f"  - {i.inventory}\n" for i in infos))
    r = gpu_provision("-H", str(group), "facts", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "summary: 2 hosts" in r.stdout
    assert "Ubuntu 24.04" in r.stdout and "Debian GNU/Linux 12" in r.stdout


def test_bootstrap_three_hosts_one_broken(hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    """Two CPU hosts provision in parallel; the third (a corrupted Miniconda) fails alone and the
    summary shows its step and last output lines."""
    good = [hosts.fresh("cpu-only") for _ in range(2)]
    bad = hosts.fresh("cpu-only")
    try:
        broken_path = bad.inventory_with(tmp_path / "broken.yaml", miniconda_sha256="f" * 64)
        group = tmp_path / "three.yaml"
        group.write_text(yaml.safe_dump({"group": [good[0].inventory, good[1].inventory,
                                                   broken_path]}))
        r = gpu_provision("-H", str(group), "bootstrap", home=gp_home, cwd=tmp_path, timeout=900)
        assert r.returncode == 1
        summary = r.stdout[r.stdout.index("summary: 3 hosts"):]
        rows = re.split(r"\n│ (?=\S)", summary)[1:]  # a row's first line names its host
        # hosts are named as the user wrote them: each inventory's name, not root@<its path>
        assert sorted(row.split()[0] for row in rows) == sorted([good[0].id, good[1].id, "broken"])
        assert "root@" not in summary
        ok = [row for row in rows if "ok PASS" in row]
        failed = [row for row in rows if "failed:" in row]
        assert len(ok) == 2 and len(failed) == 1, summary
        assert failed[0].startswith("broken "), summary
        assert "step 'conda' failed with exit code 3" in failed[0].replace("\n", " ").replace("│", "")
        assert "sha256mismatch" in "".join(failed[0].replace("│", "").split()), summary
        assert all("torch" in row for row in ok)  # per-step durations: conda, env, torch, ...
        assert not bad.path("/root/miniconda3").exists()
    finally:
        for h in (*good, bad):
            harness.stop(h.id)
