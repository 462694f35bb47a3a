"""sync up / down on sandbox hosts: a 200 MB folder whose link is cut mid-transfer resumes and
sends only what had not arrived (rsync and SFTP), hostile file names arrive intact (also from a
laptop with no ssh or rsync), and `sync down --watch` pulls each checkpoint exactly once and never
half-written."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provision.config.inventory import resolve_target
from provision.setup.session import open_executor
from provision.store import Store
from provision.sync.link import measure_link
from tests.conftest import Hosts, Link, gpu_provision
from tests.sandbox import harness
from tests.sandbox.proxy import TcpProxy
from tests.sandbox.remote import ssh

pytestmark = pytest.mark.sandbox
RSYNC = shutil.which("rsync") is not None and shutil.which("ssh") is not None
needs_rsync = pytest.mark.skipif(not RSYNC, reason="no rsync and ssh here (make system-deps)")

MB = 1_000_000
HOSTILE = ["with space.bin", "it's \"quoted\".txt", "$(touch pwned).txt", "-leading-dash",
           "back\\slash `tick`;semi", "new\nline.txt", "ünïcode ✓.txt"]


def tree(path: Path) -> dict[str, str]:
    """relative path -> sha256 of every regular file below ``path``."""
    out = {}
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[p.relative_to(path).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def bytes_below(path: Path) -> int:
    """Every byte below ``path``, hidden partial files included."""
    total = 0
    for top, _, names in os.walk(path):
        for n in names:
            try:
                total += (Path(top) / n).lstat().st_size
            except FileNotFoundError:
                pass
    return total


@pytest.fixture(scope="module")
def host(hosts: Hosts) -> harness.HostInfo:
    return hosts.get("cpu-only")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 MB in four files of 50 MB plus a few small ones, random (rsync cannot shortcut it)."""
    root = tmp_path_factory.mktemp("data") / "dataset"
    (root / "shards").mkdir(parents=True)
    for i in range(4):
        with (root / "shards" / f"shard-{i}.bin").open("wb") as f:
            for _ in range(50):
                f.write(os.urandom(MB))
    (root / "labels.csv").write_text("id,label\n" + "".join(f"{i},{i % 7}\n" for i in range(1000)))
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("a dataset\n")
    return root


def run_cut(inventory: str, home: Path, cwd: Path, args: list[str], dest: Path,
            at_bytes: int, proxy: TcpProxy) -> subprocess.CompletedProcess[str]:
    """Start a sync, cut the link once ``at_bytes`` have landed under ``dest`` on the host."""
    env = {**os.environ, "GPU_PROVISION_HOME": str(home), "COLUMNS": "200",
           "GPU_PROVISION_WORKDIR": str(cwd)}
    proc = subprocess.Popen([sys.executable, "-m", "provision", "-H", inventory, *args],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    deadline = time.monotonic() + 120
    while bytes_below(dest) < at_bytes:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the transfer did not get going"
        time.sleep(0.02)
    proxy.cut()
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("transport", [pytest.param("rsync", marks=needs_rsync), "sftp"])
def test_cut_mid_transfer_resumes_and_sends_only_the_rest(host: harness.HostInfo, folder: Path,
                                                          gp_home: Path, tmp_path: Path,
                                                          transport: str) -> None:
    dest = f"/root/cut-{transport}"
    landed = host.path(dest)
    # a little delay per chunk keeps loopback from finishing before the cut
    proxy = TcpProxy((host.host, host.port), delay_ms=2)
    try:
        inv = host.inventory_with(tmp_path / "via-proxy.yaml", host="127.0.0.1", port=proxy.port)
        args = ["sync", "up", str(folder), "--dest", dest, "--transport", transport, "--json"]
        first = run_cut(inv, gp_home, tmp_path, args, landed, 110 * MB, proxy)
        assert first.returncode != 0
        assert "the connection was lost" in first.stderr or "connection lost" in first.stderr, \
            first.stderr
        assert "run the same command again" in first.stderr or "run the task again" in \
            first.stderr, first.stderr
        arrived = bytes_below(landed)
        total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        assert 100 * MB < arrived < total  # cut mid-way, what had arrived is still there

        again = gpu_provision("-H", inv, *args, home=gp_home, cwd=tmp_path)
        assert again.returncode == 0, again.stdout + again.stderr
        report = json.loads(again.stdout)
        assert report["transport"] == transport
        # nothing that had arrived crosses the link again (a block of slack for rsync's delta)
        assert report["sent_bytes"] <= total - arrived + 256 * 1024, report
        assert report["resumed_bytes"] > 0  # the cut file continued from where it stopped
        assert tree(landed) == tree(folder)  # every file arrived whole, nothing left over
        again2 = gpu_provision("-H", inv, *args, home=gp_home, cwd=tmp_path)
        assert json.loads(again2.stdout)["files"] == 0  # a third run has nothing to send
        # the link's speed is kept for compare: from the run that moved data, not the empty one
        [link] = [json.loads(p.read_text()) for p in (tmp_path / "reports").rglob("link-*.json")]
        assert link["direction"] == "up" and link["bytes"] == report["sent_bytes"]
        assert link["mbs"] == report["mbs"] > 0
    finally:
        proxy.close()
        ssh(host, f"rm -rf {dest}")


def test_hostile_names_round_trip_with_and_without_local_rsync(host: harness.HostInfo,
                                                                gp_home: Path,
                                                                tmp_path: Path) -> None:
    src = tmp_path / "weird dir $(x)"
    (src / "-sub dir").mkdir(parents=True)
    for i, name in enumerate(HOSTILE):
        (src / name).write_bytes(f"{i} {name}\n".encode())
        (src / "-sub dir" / name).write_bytes(os.urandom(1000 + i))
    no_tools = tmp_path / "bin"  # a laptop without ssh and rsync: only Python is there
    no_tools.mkdir()
    cases = [("auto", {}, "rsync" if RSYNC else "sftp"), ("auto", {"PATH": str(no_tools)}, "sftp")]
    for n, (transport, env, used) in enumerate(cases):
        dest = f"/root/hostile {n} '$(y)'"
        up = gpu_provision("-H", host.inventory, "sync", "up", str(src), "--dest", dest,
                           "--transport", transport, "--json", home=gp_home, cwd=tmp_path,
                           env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert json.loads(up.stdout)["transport"] == used
        assert tree(host.path(dest)) == tree(src)
        back = tmp_path / f"back-{n}"
        down = gpu_provision("-H", host.inventory, "sync", "down", dest, "--dest", str(back),
                             "--json", home=gp_home, cwd=tmp_path, env=env)
        assert down.returncode == 0, down.stdout + down.stderr
        assert json.loads(down.stdout)["transport"] == used
        assert tree(back) == tree(src)
    # no name was ever run as a command, here or there
    assert not (tmp_path / "pwned").exists() and not host.path("/root/pwned").exists()
    assert ssh(host, "ls /root")[1].count("pwned") == 0


def test_bench_link_probe_both_ways(host: harness.HostInfo, gp_home: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_PROVISION_HOME", str(gp_home))
    target = resolve_target(host.inventory)
    ex = open_executor(target, Store(gp_home), "link", lambda _: None)
    try:
        ssh(host, "mkdir -p ~/.gpu-provision")
        link = measure_link(ex, size=4 << 20)
    finally:
        ex.conn.close()
    assert link["up_mbs"] > 0 and link["down_mbs"] > 0 and link["bytes"] == 4 << 20
    assert ssh(host, "ls -A ~/.gpu-provision | grep -c link-probe || true")[1].strip() == "0"


WRITER = r"""
set -e
mkdir -p ~/.gpu-provision/jobs/train /root/run/ckpt
echo $$ > ~/.gpu-provision/jobs/train/pid
cd /root/run/ckpt
# ep1: written in two halves with a pause, the file held open all along
exec 3> ep1.pt; head -c 3000000 /dev/zero | tr '\0' 'a' >&3
while [ ! -e /root/run/go-on ]; do sleep 0.1; done
head -c 3000000 /dev/zero | tr '\0' 'b' >&3; exec 3>&-
# ep2: written under a temporary name, then renamed into place
head -c 2000000 /dev/zero | tr '\0' 'c' > .ep2.pt.tmp; mv .ep2.pt.tmp ep2.pt
echo log > train.log
rm -f ~/.gpu-provision/jobs/train/pid
"""


def test_watch_pulls_each_checkpoint_once_and_never_half_written(host: harness.HostInfo,
                                                                 gp_home: Path,
                                                                 tmp_path: Path,
                                                                 link: Link) -> None:
    ssh(host, "rm -rf /root/run /root/.gpu-provision/jobs")
    assert ssh(host, f"mkdir -p /root/run && cat > /root/run/writer.sh <<'EOF'\n{WRITER}\nEOF\n"
                     "setsid nohup bash /root/run/writer.sh > /root/run/writer.out 2>&1 &")[0] == 0
    env = {**os.environ, "GPU_PROVISION_HOME": str(gp_home), "COLUMNS": "200", **link.env}
    watch = subprocess.Popen([sys.executable, "-m", "provision", "-H", host.inventory, "sync",
                              "down", "/root/run", "--dest", str(tmp_path / "run"), "--watch",
                              "ckpt/*.pt", "--settle", "1", "--until-idle", "3s", "--json"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        # the half-written ep1 sits still for longer than --settle, held open: not pulled
        logs = host.path("/root/.gpu-provision/logs")
        deadline = time.monotonic() + 60
        while "held open for writing: ckpt/ep1.pt" not in "".join(
                p.read_text() for p in logs.glob("sync-watch-*.log")):
            assert watch.poll() is None, watch.communicate()
            assert time.monotonic() < deadline, "the watcher never saw the half-written file"
            time.sleep(0.05)
        assert not (tmp_path / "run" / "ckpt" / "ep1.pt").exists()
        ssh(host, "touch /root/run/go-on")
        out, err = watch.communicate(timeout=120)
    finally:
        if watch.poll() is None:
            watch.kill()
        # the host is shared: the stand-in job's folder must not look like a job to later tests
        ssh(host, "rm -rf /root/.gpu-provision/jobs")
    assert watch.returncode == 0, out + err
    report = json.loads(out)
    pulled = [p["path"] for p in report["pulled"]]
    assert sorted(pulled) == ["ckpt/ep1.pt", "ckpt/ep2.pt"]  # each once; train.log not matched
    full = {"ckpt/ep1.pt": b"a" * 3_000_000 + b"b" * 3_000_000, "ckpt/ep2.pt": b"c" * 2_000_000}
    for p in report["pulled"]:
        assert p["sha256"] == hashlib.sha256(full[p["path"]]).hexdigest()  # the whole file
        assert (tmp_path / "run" / p["path"]).read_bytes() == full[p["path"]]
    assert sorted(os.listdir(tmp_path / "run" / "ckpt")) == ["ep1.pt", "ep2.pt"]  # no part left
    assert "no job of ours runs: done" in "".join(p.read_text() for p in logs.glob("sync-watch-*"))
    assert link.went_through_a_keeper()
