"""autostop on sandbox hosts: the watchdog waits while a job of ours runs or a GPU is busy
(utilisation or memory), then saves the named checkpoint folder to persistent storage and calls
the platform's stop: AutoDL's /usr/bin/shutdown (the stand-in), or the platforms' APIs, which the
hosts reach with the real curl over TLS at a loopback server that checks every call
(platform_api.py). A stop that is accepted while the machine stays up is retried and shown; an
answer no retry can change (401, 404, 410) ends the watchdog; no data-losing stop fires while
the GPU check fails; Lambda's account-wide key only ever names this host's instance; --status
tells, --cancel removes it; `cost` reads it all."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Hosts, gpu_provision
from tests.sandbox import harness
from tests.sandbox.platform_api import Instance, PlatformApi, Stopper
from tests.sandbox.remote import ssh, wait_for_boot

pytestmark = pytest.mark.sandbox

IDLE, INTERVAL = 2, 0.3  # seconds: the idle period and the sampling interval for these tests
HOME_DIR = "/root/.gpu-provision/autostop"
# the failure a stop accepted while the machine stays up leaves (--stop-wait 2s; the samples
# come a little later on a busy machine)
STILL_UP = re.compile(r"still running ([2-9]|\d\d)s after the stop was accepted")


@pytest.fixture(scope="module")
def host(hosts: Hosts) -> Iterator[harness.HostInfo]:
    """An AutoDL-like container with its file storage (/root/autodl-fs) and a RunPod-like
    /workspace volume mounted."""
    info = hosts.fresh("autodl", dirs=["/root/autodl-tmp", "/root/autodl-pub", "/root/autodl-fs",
                                       "/workspace"])
    yield info
    harness.stop(info.id)


@pytest.fixture(scope="module")
def api(host: harness.HostInfo) -> Iterator[PlatformApi]:
    server = PlatformApi(harness.sandbox_dir() / "platform-api")
    server.attach(host)
    yield server
    server.close()


@pytest.fixture(autouse=True)
def clean(host: harness.HostInfo, gp_home: Path, tmp_path: Path) -> Iterator[None]:
    """Each test starts with no watchdog, idle GPUs, a working nvidia-smi, no platform env."""
    yield
    gpu_provision("-H", host.inventory, "autostop", "--cancel", home=gp_home, cwd=tmp_path)
    ssh(host, "sed -i '/^RUNPOD_\\|^CONTAINER_\\|^LAMBDA_/d' /etc/environment; "
              "rm -rf /root/.gpu-provision/autostop* /workspace/.gpu-provision "
              "/root/autodl-fs/.gpu-provision /root/onstart.sh")
    set_gpu(host, 0, 3, failure=None)


def set_gpu(info: harness.HostInfo, util: int, mem: int, failure: str | None = None) -> None:
    """What the nvidia-smi stand-in reports for every GPU from now on; ``failure``: it fails as
    a driver/library mismatch does (the captured answer) (retried until it does: the stand-in
    rewrites its state on each call)."""
    fixture = "fail-nvml-mismatch-570.124.txt"
    if failure:
        text = (harness.FIXTURES / "nvidia-smi" / fixture).read_text()
        ssh(info, f"printf %s {shlex.quote(text)} > /var/lib/gpu-sandbox/fixtures/{fixture}")
    code = ("import json, os; p = '/var/lib/gpu-sandbox/state.json'; d = json.load(open(p)); "
            f"[r.update({{'utilization.gpu': '{util} %', 'memory.used': '{mem} MiB'}}) "
            f"for r in d['gpu']['rows']]; d['failure'] = {failure!r}; "
            f"d['failure_fixture'] = {fixture!r}; "
            "json.dump(d, open(p + '.t', 'w')); os.replace(p + '.t', p)")
    want = f"{util} %, {mem} MiB"
    deadline = time.monotonic() + 20
    while True:
        ssh(info, f"python3 -c {shlex.quote(code)}")
        rc, out = ssh(info, "nvidia-smi --query-gpu=utilization.gpu,memory.used "
                            "--format=csv,noheader")
        if (rc != 0 and "mismatch" in out) if failure else \
                all(line.strip() == want for line in out.strip().splitlines()):
            return
        assert time.monotonic() < deadline, out


def state(info: harness.HostInfo, where: str = HOME_DIR) -> dict[str, Any]:
    rc, out = ssh(info, f"cat {where}/state.json 2>/dev/null")
    try:
        return json.loads(out) if rc == 0 else {}  # type: ignore[no-any-return]
    except ValueError:
        return {}


def log(info: harness.HostInfo, where: str = HOME_DIR) -> str:
    return ssh(info, f"cat {where}/autostop.log")[1]


def wait_for(cond: Any, what: str, timeout: float = 60) -> None:
    harness.wait_until(cond, what, timeout=timeout)


def busy_for_longer_than_idle(info: harness.HostInfo, reason: str,
                              where: str = HOME_DIR) -> None:
    """Wait until the watchdog has reported ``reason`` over a span of twice the idle period."""
    deadline, first = time.monotonic() + 60, None
    while True:
        s = state(info, where)
        if s.get("busy", "").startswith(reason):
            first = first if first is not None else s["at"]
            if s["at"] - first >= 2 * IDLE:
                return
        assert not s.get("fired_at"), s
        assert time.monotonic() < deadline, s
        time.sleep(0.2)


def calls_since(info: harness.HostInfo, n: int, tool: str) -> list[dict[str, Any]]:
    return [c for c in info.calls()[n:] if c["tool"] == tool]


def status(info: harness.HostInfo, inv: str, gp_home: Path, tmp_path: Path) -> dict[str, Any]:
    r = gpu_provision("-H", inv, "autostop", "--status", "--json", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def stops(api: PlatformApi, instance: str) -> list[Any]:
    """The calls that stop or delete ``instance`` (the install's lookups left out)."""
    return [c for c in api.calls_for(instance) if c.method != "GET"]


def pod_env(info: harness.HostInfo, **env: str) -> None:
    """The environment the platform gives the container (/etc/environment here)."""
    ssh(info, "".join(f"echo {k}={shlex.quote(v)} >> /etc/environment; " for k, v in env.items()))


def test_waits_for_jobs_and_busy_gpus_then_saves_and_stops(host: harness.HostInfo, gp_home: Path,
                                                            tmp_path: Path) -> None:
    # AutoDL's own /usr/bin/shutdown is checked for at install: a container without it is refused
    ssh(host, "rm -f /usr/bin/shutdown")
    r = gpu_provision("-H", host.inventory, "autostop", "--idle", "1h", home=gp_home, cwd=tmp_path)
    assert r.returncode == 1 and "the host has no /usr/bin/shutdown command" in r.stderr
    ssh(host, "ln -sf /usr/local/lib/gpu-sandbox/standin.py /usr/bin/shutdown")

    ssh(host, "mkdir -p /root/autodl-tmp/ckpt/sub && head -c 300000 /dev/urandom > "
              "/root/autodl-tmp/ckpt/ep1.pt && echo meta > '/root/autodl-tmp/ckpt/sub/a b.json'")
    set_gpu(host, 90, 20000)
    ssh(host, "mkdir -p ~/.gpu-provision/jobs/train; setsid bash -c 'echo $$ > "
              "~/.gpu-provision/jobs/train/pid; exec sleep 600' > /dev/null 2>&1 < /dev/null &")
    n = len(host.calls())
    r = gpu_provision("-H", host.inventory, "autostop", "--idle", f"{IDLE}s", "--interval",
                      f"{INTERVAL}s", "--stop-wait", "2s", "--save", "/root/autodl-tmp/ckpt",
                      "--json", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    view = json.loads(r.stdout)
    assert view["set"] and view["alive"] and view["supervisor"] == "setsid"
    assert view["config"]["action"] == "stop" and view["config"]["action_text"] == \
        "/usr/bin/shutdown"
    name = ssh(host, "hostname")[1].strip()  # the copy goes to a folder of this machine's
    assert view["config"]["save_to"] == f"/root/autodl-fs/autostop-saved/{name}"
    assert "15 days" in view["config"]["keeps"]  # what the stop keeps, from the profile
    where = view["dir"]  # on AutoDL's file storage, under this host's name
    assert where == f"/root/autodl-fs/.gpu-provision/hosts/{name}/autostop"

    busy_for_longer_than_idle(host, "job train (pid ", where)
    ssh(host, "kill $(cat ~/.gpu-provision/jobs/train/pid)")
    busy_for_longer_than_idle(host, "GPU 0 is 90% busy", where)
    set_gpu(host, 0, 20000)  # nothing computes, but a process holds 20 GB of the GPU
    busy_for_longer_than_idle(host, "GPU 0 holds 20000 MiB", where)
    assert calls_since(host, n, "shutdown") == []

    set_gpu(host, 0, 3)
    wait_for(lambda: calls_since(host, n, "shutdown"), "the shutdown")
    assert calls_since(host, n, "shutdown")[0]["argv"] == []  # AutoDL's documented form
    assert ssh(host, f"cd /root/autodl-fs/autostop-saved/{name}/ckpt && cmp ep1.pt "
                     "/root/autodl-tmp/ckpt/ep1.pt && cat 'sub/a b.json'") == (0, "meta\n")
    text = log(host, where)
    assert text.index("saving /root/autodl-tmp/ckpt") < text.index("ran /usr/bin/shutdown: exit 0")

    # the stand-in's machine stays up: each accepted shutdown has failed 2s later, is tried
    # again, and after three the watchdog gives up and says so
    wait_for(lambda: state(host, where).get("gave_up"), "the watchdog to give up")
    assert len(calls_since(host, n, "shutdown")) == 3
    v = status(host, host.inventory, gp_home, tmp_path)
    assert not v["alive"] and v["state_text"].startswith(
        "failed: 3 stops were accepted and the machine kept running")
    assert STILL_UP.search(v["last_failure"]), v["last_failure"]
    row = json.loads(gpu_provision("-H", host.inventory, "cost", "--json", home=gp_home,
                                   cwd=tmp_path).stdout)
    assert "last failure: " in row["autostop_text"]
    assert any("autostop will not stop this machine" in w for w in row["warnings"])


def test_runpod_stop_through_api_v2_and_a_resumed_pod_says_fired(
        host: harness.HostInfo, api: PlatformApi, gp_home: Path, tmp_path: Path) -> None:
    key = "rpa_0123456789ABCDEF"
    pod_env(host, RUNPOD_POD_ID="pod7x", RUNPOD_API_KEY=key)
    pod = api.add(Instance("runpod", "pod7x", key, on_stop=Stopper(host)))
    ssh(host, "mkdir -p /root/ckpt && echo weights > /root/ckpt/w.pt")
    inv = host.inventory_with(tmp_path / "pod.yaml", platform="runpod")
    boots = host.state().get("boots", 0)
    r = gpu_provision("-H", inv, "autostop", "--idle", f"{IDLE}s", "--interval", f"{INTERVAL}s",
                      "--save", "/root/ckpt", "--json", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    view = json.loads(r.stdout)
    name = ssh(host, "hostname")[1].strip()
    assert view["dir"] == f"/workspace/.gpu-provision/hosts/{name}/autostop"
    assert "(Edit Pod, Container" in view["reboot_text"]  # RunPod runs only its start command
    assert f"bash {view['dir']}/rearm.sh" in view["reboot_text"]

    wait_for_boot(host, boots + 1, timeout=60)  # the platform stopped the pod; it is resumed
    assert pod.stopped and api.violations == []
    calls = api.calls_for("pod7x")  # the install asks for the pod (getPod), then the stop
    assert [(c.method, c.host, c.path, json.loads(c.body or "null")) for c in calls] == \
        [("GET", "api.runpod.io", "/v2/pods/pod7x", None),
         ("POST", "api.runpod.io", "/v2/pods/pod7x/action", {"action": "stop"})]
    assert {c.headers["Authorization"] for c in calls} == {f"Bearer {key}"}
    assert ssh(host, f"cat /workspace/autostop-saved/{name}/ckpt/w.pt") == (0, "weights\n")
    v = status(host, inv, gp_home, tmp_path)  # the state was on /workspace
    assert v["fired"] and not v["alive"]
    # what fired, and that nothing watches the resumed pod (N16)
    assert v["state_text"] == "fired: POST https://api.runpod.io/v2/pods/pod7x/action: HTTP " \
        "200; not watching since the machine was started again (run autostop again)"


@pytest.mark.parametrize("mode,said", [
    ("401", "the platform refused the API key for POST https://api.runpod.io/v2/pods/pod401"
            "/action (HTTP 401): {\"title\": \"Unauthorized\""),
    ("404", "answered HTTP 404 (no such instance, or this API address is gone)"),
    ("410", "answered HTTP 410 Gone: the platform retired this API")])
def test_an_answer_no_retry_can_change_ends_the_watchdog(
        host: harness.HostInfo, api: PlatformApi, gp_home: Path, tmp_path: Path, mode: str,
        said: str) -> None:
    key = "rpa_k"
    pod_env(host, RUNPOD_POD_ID=f"pod{mode}", RUNPOD_API_KEY=key)
    ssh(host, "mkdir -p /root/ckpt && echo w > /root/ckpt/w.pt")
    api.add(Instance("runpod", f"pod{mode}", key, mode=mode))
    inv = host.inventory_with(tmp_path / "pod.yaml", platform="runpod")
    r = gpu_provision("-H", inv, "autostop", "--idle", f"{IDLE}s", "--interval", f"{INTERVAL}s",
                      "--save", "/root/ckpt", "--json", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    where = json.loads(r.stdout)["dir"]
    wait_for(lambda: state(host, where).get("dead"), "the watchdog to stop watching")
    time.sleep(3 * IDLE)
    assert len(stops(api, f"pod{mode}")) == 1 and api.violations == []
    v = status(host, inv, gp_home, tmp_path)
    assert not v["alive"] and said in v["state_text"], v["state_text"]
    # started again (a container restart), it does not call the dead address again
    ssh(host, f"bash {where}/rearm.sh; sleep {3 * IDLE}")
    assert len(stops(api, f"pod{mode}")) == 1
    assert "not started: " in log(host, where)


def test_an_accepted_stop_that_does_nothing_is_retried_and_shown(
        host: harness.HostInfo, api: PlatformApi, gp_home: Path, tmp_path: Path) -> None:
    key = "rpa_noop"
    pod_env(host, RUNPOD_POD_ID="podnoop", RUNPOD_API_KEY=key)
    ssh(host, "mkdir -p /root/ckpt && echo w > /root/ckpt/w.pt")
    api.add(Instance("runpod", "podnoop", key, mode="noop"))
    inv = host.inventory_with(tmp_path / "pod.yaml", platform="runpod",
                              price_per_hour=0.5, currency="USD")
    r = gpu_provision("-H", inv, "autostop", "--idle", f"{IDLE}s", "--interval", f"{INTERVAL}s",
                      "--stop-wait", "2s", "--save", "/root/ckpt", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for(lambda: len(stops(api, "podnoop")) >= 2, "a second stop")
    v = status(host, inv, gp_home, tmp_path)
    assert STILL_UP.search(v["last_failure"]) and v["last_failure"].endswith(
        "after the stop was accepted (POST https://api.runpod.io/v2/pods/podnoop/action: "
        "HTTP 200)"), v["last_failure"]
    out = gpu_provision("-H", inv, "autostop", "--status", home=gp_home, cwd=tmp_path).stdout
    assert "last failure" in out
    row = json.loads(gpu_provision("-H", inv, "cost", "--json", home=gp_home,
                                   cwd=tmp_path).stdout)
    assert STILL_UP.search(row["autostop"]["last_failure"])
    assert api.violations == []


def test_no_data_losing_stop_while_the_gpu_check_fails(
        host: harness.HostInfo, api: PlatformApi, gp_home: Path, tmp_path: Path) -> None:
    key = "rpa_gpu"
    pod_env(host, RUNPOD_POD_ID="podgpu", RUNPOD_API_KEY=key)
    ssh(host, "mkdir -p /root/ckpt && echo w > /root/ckpt/w.pt")
    api.add(Instance("runpod", "podgpu", key))
    inv = host.inventory_with(tmp_path / "pod.yaml", platform="runpod")
    args = ("-H", inv, "autostop", "--idle", f"{IDLE}s", "--interval", f"{INTERVAL}s", "--save",
            "/root/ckpt", "--json")
    set_gpu(host, 0, 3, failure="nvml_mismatch")
    r = gpu_provision(*args, home=gp_home, cwd=tmp_path)  # the install refuses
    assert r.returncode == 1 and "the GPU check fails here (nvidia-smi exit 18: Failed to " \
        "initialize NVML: Driver/library version mismatch" in r.stderr
    assert "runpod's stop loses the container disk" in r.stderr

    set_gpu(host, 90, 20000)  # a training run: busy from the start
    r = gpu_provision(*args, home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    where = json.loads(r.stdout)["dir"]
    set_gpu(host, 0, 3, failure="nvml_mismatch")  # the driver breaks under the running job
    busy_for_longer_than_idle(host, "the GPU check fails: Failed to initialize NVML", where)
    busy_for_longer_than_idle(host, "the GPU check fails: ", where)
    assert stops(api, "podgpu") == []


def test_lambda_terminates_only_this_hosts_instance(
        host: harness.HostInfo, api: PlatformApi, gp_home: Path, tmp_path: Path) -> None:
    key = "secret_lambda_k"
    api.add(Instance("lambda", "0a1b2c", key, ip="127.0.0.251"))  # another machine
    mine = api.add(Instance("lambda", "9f8e7d", key, ip=host.host, mode="noop"))
    inv = host.inventory_with(tmp_path / "lambda-box.yaml", platform="lambda",
                              push_env=["LAMBDA_API_KEY"])
    base = ("-H", inv, "autostop", "--action", "terminate", "--idle", f"{IDLE}s", "--interval",
            f"{INTERVAL}s")
    env = {"LAMBDA_API_KEY": key}
    r = gpu_provision(*base, "--instance-id", "0a1b2c", home=gp_home, cwd=tmp_path, env=env)
    assert r.returncode == 1
    assert "instance 0a1b2c (--instance-id) is the machine at 127.0.0.251, not this host" \
        in r.stderr
    r = gpu_provision(*base, "--instance-id", "nosuch", home=gp_home, cwd=tmp_path, env=env)
    assert r.returncode == 1 and "the platform has no instance nosuch in this account " \
        "(HTTP 404)" in r.stderr
    # one id never serves two hosts
    other = host.inventory_with(tmp_path / "lambda-box-2.yaml", platform="lambda")
    r = gpu_provision("-H", f"{inv},{other}", "autostop", "--action", "terminate",
                      "--instance-id", "9f8e7d", home=gp_home, cwd=tmp_path, env=env)
    assert r.returncode == 2 and "--instance-id names one machine" in r.stderr

    r = gpu_provision(*base, "--instance-id", "9f8e7d", "--json", home=gp_home, cwd=tmp_path,
                      env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for(lambda: any(c.path.endswith("/terminate") for c in api.calls_for("9f8e7d")),
             "the terminate")
    terminate = [c for c in api.calls_for("9f8e7d") if c.path.endswith("/terminate")][0]
    assert json.loads(terminate.body) == {"instance_ids": ["9f8e7d"]}
    assert not any(c.path.endswith("/terminate") for c in api.calls_for("0a1b2c"))
    assert api.violations == [] and mine.stopped is False  # noop: accepted, nothing done


def test_vast_uses_the_instance_key_only_and_rearms_at_container_start(
        host: harness.HostInfo, api: PlatformApi, gp_home: Path, tmp_path: Path) -> None:
    inv = host.inventory_with(tmp_path / "vast-box.yaml", platform="vast")
    pod_env(host, CONTAINER_ID="4242")
    r = gpu_provision("-H", inv, "autostop", "--idle", "1h", home=gp_home, cwd=tmp_path,
                      env={"VAST_API_KEY": "account-wide"})
    assert r.returncode == 1 and "none of CONTAINER_API_KEY is set" in r.stderr
    assert "An account-wide key on the host could destroy every instance" in r.stderr
    assert "push_env" not in r.stderr and "VAST_API_KEY" not in r.stderr

    key = "vk-0123456789abcdef-secret"
    pod_env(host, CONTAINER_API_KEY=key)
    api.add(Instance("vast", "4242", key))
    # the renter's own onstart (often a job in the foreground): our line goes before it
    ssh(host, "printf '#!/bin/bash\\necho user-start >> /root/onstart.log\\n' > /root/onstart.sh")
    r = gpu_provision("-H", inv, "autostop", "--idle", "8s", "--interval", f"{INTERVAL}s",
                      "--json", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    view = json.loads(r.stdout)
    assert view["reboot_text"].endswith("started again at each container start by "
                                        "/root/onstart.sh")
    lines = ssh(host, "cat /root/onstart.sh")[1].splitlines()
    assert lines[0] == "#!/bin/bash" and "gpu-provision autostop" in lines[1] \
        and f"bash {view['dir']}/rearm.sh &" in lines[1] \
        and lines[2] == "echo user-start >> /root/onstart.log"
    # the container restarts: every process ends; vast.ai's launch runs /root/onstart.sh
    boots = host.state().get("boots", 0)
    Stopper(host)()
    wait_for_boot(host, boots + 1, timeout=60)
    assert not status(host, inv, gp_home, tmp_path)["alive"]
    ssh(host, "bash /root/onstart.sh")
    wait_for(lambda: status(host, inv, gp_home, tmp_path)["alive"], "the watchdog re-armed")
    wait_for(lambda: stops(api, "4242"), "the stop")
    call = stops(api, "4242")[0]
    assert (call.method, call.path, json.loads(call.body)) == \
        ("PUT", "/api/v0/instances/4242/", {"state": "stopped"})
    assert call.headers["Authorization"] == f"Bearer {key}" and api.violations == []
    for p in host.path("/root/.gpu-provision").rglob("*"):
        if p.is_file():
            assert key not in p.read_text(errors="replace"), p
    # --cancel takes our line out of onstart.sh
    gpu_provision("-H", inv, "autostop", "--cancel", home=gp_home, cwd=tmp_path)
    assert "gpu-provision autostop" not in ssh(host, "cat /root/onstart.sh")[1]


def test_after_job_arms_only_once_that_job_has_run_and_ended(host: harness.HostInfo,
                                                             gp_home: Path,
                                                             tmp_path: Path) -> None:
    ssh(host, "rm -rf ~/.gpu-provision/jobs; "
              "ln -sf /usr/local/lib/gpu-sandbox/standin.py /usr/bin/shutdown")
    n = len(host.calls())
    r = gpu_provision("-H", host.inventory, "autostop", "--idle", f"{IDLE}s", "--interval",
                      f"{INTERVAL}s", "--after-job", "finetune", "--json", home=gp_home,
                      cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    where = json.loads(r.stdout)["dir"]
    busy_for_longer_than_idle(host, "job finetune has not run yet", where)  # idle, not armed
    # a job as `run --name finetune` makes it: its folder is its id, its name inside
    jd = "~/.gpu-provision/jobs/finetune-1201-093000"
    ssh(host, f"mkdir -p {jd}; echo finetune > {jd}/name; setsid bash -c 'echo $$ > "
              f"{jd}/pid; exec sleep 600' > /dev/null 2>&1 < /dev/null &")
    busy_for_longer_than_idle(host, "job finetune-1201-093000 (pid ", where)
    assert calls_since(host, n, "shutdown") == []
    ssh(host, f"kill $(cat {jd}/pid)")
    wait_for(lambda: calls_since(host, n, "shutdown"), "the shutdown")
    assert "job finetune has ended" in log(host, where)


def test_status_cancel_replace_and_refusals(host: harness.HostInfo, gp_home: Path,
                                            tmp_path: Path) -> None:
    def pids() -> list[int]:
        """This host's watchdogs (the machine's process table is shared by every sandbox host:
        the processes whose root is this host's view)."""
        found = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and os.readlink(d / "root") == str(Path(host.root) / "merged") \
                        and b"autostop/watchdog.sh" in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                continue
        return found

    ssh(host, "ln -sf /usr/local/lib/gpu-sandbox/standin.py /usr/bin/shutdown")
    for _ in range(2):  # a second autostop replaces the first: one watchdog at a time
        r = gpu_provision("-H", host.inventory, "autostop", "--idle", "1h", "--json",
                          home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
    view = json.loads(r.stdout)
    assert view["alive"] and pids() == [view["state"]["pid"]]
    assert view["config"]["idle_text"] == "1h"
    # afresh (--no-keep) it reads the same watchdog as through the kept connection (the default)
    for how in ([], ["--no-keep"]):
        seen = gpu_provision("-H", host.inventory, *how, "autostop", "--status", "--json",
                             home=gp_home, cwd=tmp_path)
        assert seen.returncode == 0, seen.stderr
        got = json.loads(seen.stdout)
        assert (got["alive"], got["state"]["pid"], got["config"]) == \
            (True, view["state"]["pid"], view["config"])

    r = gpu_provision("-H", host.inventory, "autostop", "--cancel", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0 and f"autostop: {host.id}: removed" in r.stdout
    wait_for(lambda: not pids(), "the watchdog to end", timeout=10)
    assert ssh(host, f"test -e {view['dir']}")[0] != 0
    r = gpu_provision("-H", host.inventory, "autostop", "--status", home=gp_home, cwd=tmp_path)
    assert f"autostop: {host.id}: not set" in r.stdout
    r = gpu_provision("-H", host.inventory, "autostop", "--cancel", home=gp_home, cwd=tmp_path)
    assert f"autostop: {host.id}: was not set" in r.stdout

    # RunPod's stop needs the pod's id and key on the host; every problem is said in one line
    runpod = host.inventory_with(tmp_path / "pod.yaml", platform="runpod")
    r = gpu_provision("-H", runpod, "autostop", "--save", "/root/ckpt", home=gp_home,
                      cwd=tmp_path)
    assert r.returncode == 1
    assert "error: pod: autostop not set: " in r.stderr
    assert "no API key on the host: none of RUNPOD_API_KEY is set" in r.stderr
    assert "no instance id on the host: none of RUNPOD_POD_ID is set" in r.stderr
    assert pids() == []
    # ... and without --save it is refused before anything reaches the host
    r = gpu_provision("-H", runpod, "autostop", home=gp_home, cwd=tmp_path)
    assert r.returncode == 1 and "Name what to keep with --save DIR" in r.stderr


def test_cost_since_start_idle_and_autostop(host: harness.HostInfo, gp_home: Path,
                                            tmp_path: Path) -> None:
    inv = host.inventory_with(tmp_path / "priced.yaml", price_per_hour=0.8, currency="USD")
    ssh(host, "ln -sf /usr/local/lib/gpu-sandbox/standin.py /usr/bin/shutdown")
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


def test_a_vm_whose_cloud_bills_a_shutdown_is_refused_and_cost_promises_only_what_it_knows(
        host: harness.HostInfo, hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    azure = hosts.fresh("ubuntu-22.04-rtx4090", dmi="dmi/azure.yaml")  # its DMI, as Azure's
    try:
        inv = azure.inventory_with(tmp_path / "azure-vm.yaml", platform="generic-vm")
        r = gpu_provision("-H", inv, "autostop", "--idle", "1h", home=gp_home, cwd=tmp_path)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "autostop not set: Azure: a shutdown from inside leaves an Azure VM 'Stopped'" \
            in r.stderr and "az vm deallocate" in r.stderr
        assert ssh(azure, "test -e /root/.gpu-provision/autostop")[0] != 0  # nothing installed
    finally:
        harness.stop(azure.id)
    # a VM whose cloud the DMI does not name: set, and cost does not promise the saving
    inv = host.inventory_with(tmp_path / "some-vm.yaml", platform="generic-vm",
                              price_per_hour=1.5, currency="EUR")
    r = gpu_provision("-H", inv, "autostop", "--idle", "1h", "--json", home=gp_home,
                      cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert any("the cloud is not known" in n for n in json.loads(r.stdout)["config"]["notes"])
    row = json.loads(gpu_provision("-H", inv, "cost", "--json", home=gp_home,
                                   cwd=tmp_path).stdout)
    assert row["autostop"]["saves_per_hour"] is None
    assert row["autostop_text"].endswith("; saves 1.50 EUR/h only if the provider stops billing "
                                         "a powered-off machine (not known here)")


def test_the_idle_clock_is_the_uptime_not_the_wall_clock(host: harness.HostInfo, gp_home: Path,
                                                          tmp_path: Path) -> None:
    ssh(host, "ln -sf /usr/local/lib/gpu-sandbox/standin.py /usr/bin/shutdown")
    n = len(host.calls())
    r = gpu_provision("-H", host.inventory, "autostop", "--idle", "1h", "--interval",
                      f"{INTERVAL}s", "--json", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    where = json.loads(r.stdout)["dir"]
    # the wall clock steps two hours ahead (an NTP correction on a machine that booted with a
    # wrong clock): `date +%s` says so from now on, in this host only
    ssh(host, "printf '%s\\n' '#!/bin/bash' 'if [ \"$1\" = +%s ]; then echo $(( $(/bin/date +%s) "
              "+ 7200 )); else exec /bin/date \"$@\"; fi' > /usr/local/bin/date; "
              "chmod +x /usr/local/bin/date")
    try:
        wait_for(lambda: state(host, where).get("at", 0) > time.time() + 3600, "a stepped sample")
        time.sleep(5 * INTERVAL)
        s = state(host, where)
        assert s["idle_for"] < 60 and not s["fired_at"], s
        assert calls_since(host, n, "shutdown") == []
    finally:
        ssh(host, "rm -f /usr/local/bin/date")
