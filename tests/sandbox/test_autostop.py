"""autostop on sandbox hosts: the watchdog waits while a job of ours runs or a GPU is busy
(utilisation or memory), then saves the named checkpoint folder to persistent storage and calls
the platform's stop (the `shutdown` stand-in on AutoDL, the vast.ai API stand-in with the pushed
key, which it never writes down); --status tells, --cancel removes it; a stop that would keep
nothing is refused on the host; `cost` reads it all."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Hosts, gpu_provision
from tests.sandbox import harness
from tests.sandbox.remote import ssh

pytestmark = pytest.mark.sandbox

IDLE, INTERVAL = 2, 0.3  # seconds: the idle period and the sampling interval for these tests


@pytest.fixture(scope="module")
def host(hosts: Hosts) -> Iterator[harness.HostInfo]:
    """An AutoDL-like container with its file storage (/root/autodl-fs) mounted."""
    info = hosts.fresh("autodl", dirs=["/root/autodl-tmp", "/root/autodl-pub", "/root/autodl-fs"])
    yield info
    harness.stop(info.id)


def set_gpu(info: harness.HostInfo, util: int, mem: int) -> None:
    """What the nvidia-smi stand-in reports for every GPU from now on (retried until it does: the
    stand-in rewrites its state on each call)."""
    code = ("import json, os; p = '/var/lib/gpu-sandbox/state.json'; d = json.load(open(p)); "
            f"[r.update({{'utilization.gpu': '{util} %', 'memory.used': '{mem} MiB'}}) "
            "for r in d['gpu']['rows']]; json.dump(d, open(p + '.t', 'w')); os.replace(p + '.t', p)")
    want = f"{util} %, {mem} MiB"
    deadline = time.monotonic() + 20
    while True:
        ssh(info, f"python3 -c {shlex.quote(code)}")
        out = ssh(info, "nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader")[1]
        if all(line.strip() == want for line in out.strip().splitlines()):
            return
        assert time.monotonic() < deadline, out


def state(info: harness.HostInfo) -> dict[str, Any]:
    p = info.path("/root/.gpu-provision/autostop/state.json")
    try:
        return json.loads(p.read_text())  # type: ignore[no-any-return]
    except (FileNotFoundError, ValueError):
        return {}


def busy_for_longer_than_idle(info: harness.HostInfo, reason: str) -> None:
    """Wait until the watchdog has reported ``reason`` over a span of twice the idle period."""
    deadline, first = time.monotonic() + 60, None
    while True:
        s = state(info)
        if s.get("busy", "").startswith(reason):
            first = first if first is not None else s["at"]
            if s["at"] - first >= 2 * IDLE:
                return
        assert not s.get("fired_at"), s
        assert time.monotonic() < deadline, s
        time.sleep(0.1)


def calls_since(info: harness.HostInfo, n: int, tool: str) -> list[dict[str, Any]]:
    return [c for c in info.calls()[n:] if c["tool"] == tool]


def test_waits_for_jobs_and_busy_gpus_then_saves_and_stops(host: harness.HostInfo, gp_home: Path,
                                                            tmp_path: Path) -> None:
    ssh(host, "mkdir -p /root/autodl-tmp/ckpt/sub && head -c 300000 /dev/urandom > "
              "/root/autodl-tmp/ckpt/ep1.pt && echo meta > '/root/autodl-tmp/ckpt/sub/a b.json'")
    set_gpu(host, 90, 20000)
    ssh(host, "mkdir -p ~/.gpu-provision/jobs/train; setsid bash -c 'echo $$ > "
              "~/.gpu-provision/jobs/train/pid; exec sleep 600' > /dev/null 2>&1 < /dev/null &")
    n = len(host.calls())
    r = gpu_provision("-H", host.inventory, "autostop", "--idle", f"{IDLE}s", "--interval",
                      f"{INTERVAL}s", "--save", "/root/autodl-tmp/ckpt", "--json",
                      home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    view = json.loads(r.stdout)
    assert view["set"] and view["alive"] and view["supervisor"] == "setsid"
    assert view["config"]["action"] == "stop" and view["config"]["action_text"] == "shutdown"
    assert view["config"]["save_to"] == "/root/autodl-fs/autostop-saved"
    assert "15 days" in view["config"]["keeps"]  # what the stop keeps, from the profile

    busy_for_longer_than_idle(host, "job train (pid ")
    ssh(host, "kill $(cat ~/.gpu-provision/jobs/train/pid)")
    busy_for_longer_than_idle(host, "GPU 0 is 90% busy")
    set_gpu(host, 0, 20000)  # nothing computes, but a process holds 20 GB of the GPU
    busy_for_longer_than_idle(host, "GPU 0 holds 20000 MiB")
    assert calls_since(host, n, "shutdown") == []

    set_gpu(host, 0, 3)
    deadline = time.monotonic() + 60
    while not calls_since(host, n, "shutdown"):
        assert time.monotonic() < deadline, host.path("/root/.gpu-provision/logs/autostop.log") \
            .read_text()
        time.sleep(0.1)
    assert calls_since(host, n, "shutdown")[0]["argv"] == []  # AutoDL's documented form
    # (read over SSH: the data dirs are mounts of their own inside the host's /root)
    assert ssh(host, "cd /root/autodl-fs/autostop-saved/ckpt && cmp ep1.pt "
                     "/root/autodl-tmp/ckpt/ep1.pt && cat 'sub/a b.json'") == (0, "meta\n")
    log = host.path("/root/.gpu-provision/logs/autostop.log").read_text()
    assert log.index("saving /root/autodl-tmp/ckpt") < log.index("ran shutdown: exit 0")

    after = gpu_provision("-H", host.inventory, "autostop", "--status", "--json", home=gp_home,
                          cwd=tmp_path)
    v = json.loads(after.stdout)
    assert v.get("fired") and not v["alive"] and v["state_text"] == "fired: ran shutdown (exit 0)", \
        after.stdout + after.stderr


def test_vast_api_stop_with_the_pushed_key_never_written_down(host: harness.HostInfo,
                                                              gp_home: Path,
                                                              tmp_path: Path) -> None:
    key = "vk-0123456789abcdef-secret"
    # the host as vast.ai makes it: its id in the environment, and the API reachable (stand-in)
    ssh(host, "echo 'CONTAINER_ID=4242' >> /etc/environment && "
              "ln -sf /usr/local/lib/gpu-sandbox/standin.py /usr/local/bin/curl")
    set_gpu(host, 0, 3)
    inv = host.inventory_with(tmp_path / "vast-box.yaml", platform="vast",
                              push_env=["VAST_API_KEY"])
    n = len(host.calls())
    r = gpu_provision("-H", inv, "autostop", "--idle", f"{IDLE}s", "--interval", f"{INTERVAL}s",
                      "--json", home=gp_home, cwd=tmp_path, env={"VAST_API_KEY": key})
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["config"]["bills"].startswith("the disk")
    deadline = time.monotonic() + 60
    while not calls_since(host, n, "platform-api"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    call = calls_since(host, n, "platform-api")[0]
    assert call["argv"] == ["PUT", "https://console.vast.ai/api/v0/instances/4242/",
                            f"Bearer {key}", '{"state": "stopped"}']
    deadline = time.monotonic() + 30
    while not state(host).get("fired_at"):
        assert time.monotonic() < deadline, state(host)
        time.sleep(0.1)
    log = host.path("/root/.gpu-provision/logs/autostop.log").read_text()
    assert 'HTTP 200 {"success": true}' in log
    # the key is on the host only in the 0600 env file push_env writes
    env_file = host.path("/root/.gpu-provision/env")
    assert key in env_file.read_text() and env_file.stat().st_mode & 0o077 == 0
    for p in [*host.path("/root/.gpu-provision").rglob("*"), *(tmp_path / "logs").rglob("*")]:
        if p.is_file() and p != env_file:
            assert key not in p.read_text(errors="replace"), p
    assert key not in r.stdout + r.stderr
    status = gpu_provision("-H", inv, "autostop", "--status", home=gp_home, cwd=tmp_path,
                           env={"VAST_API_KEY": key})
    assert "fired: PUT https://console.vast.ai/api/v0/instances/4242/: HTTP 200" in status.stdout
    assert key not in status.stdout + status.stderr

    # later, from a shell without the key (and another push_env name unset here): the key on
    # the host serves, and the host's env file is left whole
    pushed = env_file.read_text()
    inv2 = host.inventory_with(tmp_path / "vast-box-2.yaml", platform="vast",
                               push_env=["VAST_API_KEY", "WANDB_API_KEY"])
    again = gpu_provision("-H", inv2, "autostop", "--idle", "1h", "--json", home=gp_home,
                          cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["alive"] and env_file.read_text() == pushed
    gpu_provision("-H", inv2, "autostop", "--cancel", home=gp_home, cwd=tmp_path)


def test_after_job_arms_only_once_that_job_has_run_and_ended(host: harness.HostInfo,
                                                             gp_home: Path,
                                                             tmp_path: Path) -> None:
    set_gpu(host, 0, 3)
    ssh(host, "rm -rf ~/.gpu-provision/jobs")
    n = len(host.calls())
    r = gpu_provision("-H", host.inventory, "autostop", "--idle", f"{IDLE}s", "--interval",
                      f"{INTERVAL}s", "--after-job", "finetune", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    busy_for_longer_than_idle(host, "job finetune has not run yet")  # idle, but not armed
    # a job as `run --name finetune` makes it: its folder is its id, its name inside
    jd = "~/.gpu-provision/jobs/finetune-1201-093000"
    ssh(host, f"mkdir -p {jd}; echo finetune > {jd}/name; setsid bash -c 'echo $$ > "
              f"{jd}/pid; exec sleep 600' > /dev/null 2>&1 < /dev/null &")
    busy_for_longer_than_idle(host, "job finetune-1201-093000 (pid ")
    assert calls_since(host, n, "shutdown") == []
    ssh(host, f"kill $(cat {jd}/pid)")
    deadline = time.monotonic() + 60
    while not calls_since(host, n, "shutdown"):
        assert time.monotonic() < deadline, state(host)
        time.sleep(0.1)
    log = host.path("/root/.gpu-provision/logs/autostop.log").read_text()
    assert "job finetune has ended" in log


def test_status_cancel_replace_and_refusals(host: harness.HostInfo, gp_home: Path,
                                            tmp_path: Path) -> None:
    def pids() -> list[int]:
        out = ssh(host, "pgrep -f autostop/[w]atchdog.sh || true")[1]  # [w]: not this shell
        return [int(x) for x in out.split()]

    for _ in range(2):  # a second autostop replaces the first: one watchdog at a time
        r = gpu_provision("-H", host.inventory, "autostop", "--idle", "1h", "--json",
                          home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
    view = json.loads(r.stdout)
    assert view["alive"] and pids() == [view["state"]["pid"]]
    assert view["config"]["idle_text"] == "1h"

    r = gpu_provision("-H", host.inventory, "autostop", "--cancel", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0 and f"autostop: {host.id}: removed" in r.stdout
    deadline = time.monotonic() + 10
    while pids():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert not host.path("/root/.gpu-provision/autostop").exists()
    r = gpu_provision("-H", host.inventory, "autostop", "--status", home=gp_home, cwd=tmp_path)
    assert f"autostop: {host.id}: not set" in r.stdout
    r = gpu_provision("-H", host.inventory, "autostop", "--cancel", home=gp_home, cwd=tmp_path)
    assert f"autostop: {host.id}: was not set" in r.stdout

    # RunPod's stop clears all but /workspace; without a /workspace volume it would keep nothing
    runpod = host.inventory_with(tmp_path / "pod.yaml", platform="runpod")
    r = gpu_provision("-H", runpod, "autostop", "--save", "/root/ckpt", home=gp_home, cwd=tmp_path)
    assert r.returncode == 1
    assert "error: pod: autostop not set: " in r.stderr  # every problem, in one line
    assert "/workspace does not exist: this stop would keep nothing" in r.stderr
    assert "no API key on the host: none of RUNPOD_API_KEY is set" in r.stderr
    assert "no instance id on the host: none of RUNPOD_POD_ID is set" in r.stderr
    assert not host.path("/root/.gpu-provision/autostop").exists() and pids() == []
    # ... and without --save it is refused before anything reaches the host
    r = gpu_provision("-H", runpod, "autostop", home=gp_home, cwd=tmp_path)
    assert r.returncode == 1 and "Name what to keep with --save DIR" in r.stderr


def test_cost_since_start_idle_and_autostop(host: harness.HostInfo, gp_home: Path,
                                            tmp_path: Path) -> None:
    inv = host.inventory_with(tmp_path / "priced.yaml", price_per_hour=0.8, currency="USD")
    set_gpu(host, 0, 3)
    r = gpu_provision("-H", inv, "cost", "--json", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    row = json.loads(r.stdout)
    btime = next(int(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines()
                 if x.startswith("btime"))
    assert row["since"] >= btime  # the later of the kernel's boot and PID 1's start
    # cost is price x the unrounded hours, to the cent; "hours" is shown to 0.001
    assert abs(row["cost"] - 0.8 * row["hours"]) <= 0.005 + 0.8 * 0.0005 and row["busy"] is None
    assert row["autostop"] == {"set": False}
    assert row["autostop_text"] == "not set: each idle hour costs 0.80 USD"

    r = gpu_provision("-H", inv, "autostop", "--idle", "1h", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    row = json.loads(gpu_provision("-H", inv, "cost", "--json", home=gp_home,
                                   cwd=tmp_path).stdout)
    assert row["autostop"]["set"] and row["autostop"]["saves_per_hour"] == 0.8
    assert row["autostop_text"].startswith("stop after 1h idle, in ")
    gpu_provision("-H", inv, "autostop", "--cancel", home=gp_home, cwd=tmp_path)
