"""autostop loses nothing, and stops only what is idle as its renter means it (sandbox hosts, the
loopback platform API and cloud metadata): a --save bound for the disk the stop deletes is
refused; a platform id that is not the host's is refused; a symlinked --save is copied as its
content and checked; a --save that is missing holds the stop and says why; a job started
during a long save keeps the machine up; a process holding a GPU, a MIG GPU's process, a busy
CPU, a tmux pane, an SSH login are busy; a preemption notice interrupts our job, which writes
its checkpoint, and runs the hook; the spend cap warns, then stops. Every data-losing path has
an assertion that no stop call was made."""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from tests.conftest import Hosts, gpu_provision
from tests.sandbox import harness
from tests.sandbox.metadata_api import MetadataApi, Webhook
from tests.sandbox.platform_api import Instance, PlatformApi
from tests.sandbox.remote import ssh

pytestmark = pytest.mark.sandbox

IDLE, INTERVAL = 2, 0.3
JOBS = "/root/.gpu-provision/jobs"


@pytest.fixture(scope="module")
def host(hosts: Hosts) -> Iterator[harness.HostInfo]:
    """An AutoDL-like container with a RunPod-like /workspace volume and AutoDL's file storage."""
    info = hosts.fresh("autodl", dirs=["/root/autodl-tmp", "/root/autodl-pub", "/root/autodl-fs",
                                       "/workspace"])
    ssh(info, "ln -sf /usr/local/lib/gpu-sandbox/standin.py /usr/bin/shutdown")
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
    yield
    gpu_provision("-H", host.inventory, "autostop", "--cancel", home=gp_home, cwd=tmp_path)
    ssh(host, "sed -i '/^RUNPOD_\\|^CONTAINER_\\|^VAST_\\|^LAMBDA_/d' /etc/environment; "
              f"for f in {JOBS}/*/pid; do [ -f \"$f\" ] && kill -- -$(cat \"$f\") 2>/dev/null; done; "
              f"rm -rf {JOBS} /workspace/.gpu-provision /workspace/autostop-saved "
              "/root/autodl-fs/.gpu-provision /root/.gpu-provision/autostop* "
              "/root/.gpu-provision/notify.sh /root/.gpu-provision/env; "
              "tmux kill-server 2>/dev/null; true")
    if TOUCHED:  # only a test that changed what the GPUs show puts them back
        gpu(host, util="0 %", mem="3 MiB", processes=[])
        TOUCHED.clear()


TOUCHED: list[bool] = []


def gpu(info: harness.HostInfo, util: str, mem: str, processes: list[dict[str, Any]]) -> None:
    """What the nvidia-smi stand-in reports from now on for every GPU: utilisation as nvidia-smi
    prints it (``[N/A]`` on a MIG GPU), memory, and the processes --query-compute-apps lists."""
    TOUCHED.append(True)
    code = ("import json, os; p = '/var/lib/gpu-sandbox/state.json'; d = json.load(open(p)); "
            f"[r.update({{'utilization.gpu': {util!r}, 'memory.used': {mem!r}}}) "
            f"for r in d['gpu']['rows']]; d['processes'] = {processes!r}; "
            "json.dump(d, open(p + '.t', 'w')); os.replace(p + '.t', p)")
    deadline = time.monotonic() + 20
    while True:  # the stand-in rewrites its state on each call: until ours holds
        ssh(info, f"python3 -c {shlex.quote(code)}")
        out = ssh(info, "nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader")[1]
        if all(line.strip() == f"{util}, {mem}" for line in out.strip().splitlines()):
            return
        assert time.monotonic() < deadline, out


def state(info: harness.HostInfo, where: str) -> dict[str, Any]:
    rc, out = ssh(info, f"cat {where}/state.json 2>/dev/null")
    try:
        return json.loads(out) if rc == 0 else {}  # type: ignore[no-any-return]
    except ValueError:
        return {}


def log(info: harness.HostInfo, where: str) -> str:
    return ssh(info, f"cat {where}/autostop.log")[1]


def busy_with(info: harness.HostInfo, where: str, reason: str) -> None:
    """The watchdog reports ``reason`` over twice the idle period, and never fires meanwhile."""
    deadline, first = time.monotonic() + 60, None
    while True:
        s = state(info, where)
        if reason in s.get("busy", ""):
            first = first if first is not None else s["at"]
            if s["at"] - first >= 2 * IDLE:
                return
        assert not s.get("fired_at"), s
        assert time.monotonic() < deadline, (reason, s)
        time.sleep(0.2)


def job(info: harness.HostInfo, name: str, body: str = "while :; do sleep 0.2; done") -> None:
    """A job of ours as `run` leaves it (its folder, its pid file: the session's leader)."""
    jd = f"{JOBS}/{name}"
    ssh(info, f"mkdir -p {jd}; echo {name} > {jd}/name; setsid bash -c "
              f"{shlex.quote(f'echo $$ > {jd}/pid; {body}')} > /dev/null 2>&1 < /dev/null &")
    harness.wait_until(lambda: ssh(info, f"test -s {jd}/pid")[0] == 0, f"job {name}")


def autostop(info: harness.HostInfo, inv: str, gp_home: Path, tmp_path: Path, *args: str,
             idle: str = f"{IDLE}s") -> Any:
    return gpu_provision("-H", inv, "autostop", "--idle", idle, "--interval", f"{INTERVAL}s",
                         *args, home=gp_home, cwd=tmp_path)


def stops(api: PlatformApi, instance: str) -> list[Any]:
    return [c for c in api.calls_for(instance) if c.method != "GET"]


def pod(info: harness.HostInfo, api: PlatformApi, pid: str, **kw: Any) -> Instance:
    key = f"rpa_{pid}"
    ssh(info, "sed -i '/^RUNPOD_/d' /etc/environment; "
              f"echo RUNPOD_POD_ID={pid} >> /etc/environment; "
              f"echo RUNPOD_API_KEY={key} >> /etc/environment")
    return api.add(Instance("runpod", pid, key, **kw))


def test_a_save_bound_for_the_disk_the_stop_deletes_or_another_instance_is_refused(
        host: harness.HostInfo, api: PlatformApi, gp_home: Path, tmp_path: Path) -> None:
    inv = host.inventory_with(tmp_path / "pod.yaml", platform="runpod")
    ssh(host, "mkdir -p /root/ckpt && echo w > /root/ckpt/w.pt")
    pod(host, api, "podkeep")
    # RunPod's terminate deletes the volume disk at /workspace: without a network volume
    # (RUNPOD_VOLUME_ID) a copy there is lost with it
    r = autostop(host, inv, gp_home, tmp_path, "--action", "terminate", "--save", "/root/ckpt")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "autostop not set: --save: /workspace is kept by the terminate only where the " \
        "platform attached it" in r.stderr and "RUNPOD_VOLUME_ID is not set" in r.stderr
    # a --save-to on the container disk is refused before anything reaches the host
    r = autostop(host, inv, gp_home, tmp_path, "--save", "/root/ckpt", "--save-to", "/root/keep")
    assert r.returncode == 1 and "its stop keeps /workspace (the volume disk, or a network " \
        "volume): a separate mount at /workspace" in r.stderr
    # an --instance-id that is not the pod's own: its pod-scoped key would stop another pod
    r = autostop(host, inv, gp_home, tmp_path, "--save", "/root/ckpt", "--instance-id", "other")
    assert r.returncode == 1 and "--instance-id other is not this machine: the platform says " \
        "it is podkeep (RUNPOD_POD_ID)" in r.stderr
    # a locked pod cannot be stopped (getPod's `locked`)
    api.instances[("runpod", "podkeep")].locked = True
    r = autostop(host, inv, gp_home, tmp_path, "--save", "/root/ckpt")
    assert r.returncode == 1 and "instance podkeep is locked" in r.stderr
    assert stops(api, "podkeep") == [] and stops(api, "other") == []
    assert ssh(host, "ls /workspace/.gpu-provision /root/.gpu-provision/autostop")[0] != 0
    # with a network volume attached, the terminate keeps /workspace: set, and it says where
    api.instances[("runpod", "podkeep")].locked = False
    ssh(host, "echo RUNPOD_VOLUME_ID=vol123 >> /etc/environment")
    r = autostop(host, inv, gp_home, tmp_path, "--action", "terminate", "--save", "/root/ckpt",
                 "--json", idle="1h")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["config"]["keep_base"] == "/workspace"

    # vast.ai: the ids the platform set must agree (a stale /etc/environment)
    vast = host.inventory_with(tmp_path / "vast.yaml", platform="vast")
    ssh(host, "echo CONTAINER_ID=4242 >> /etc/environment; "
              "echo VAST_CONTAINERLABEL=C.999 >> /etc/environment; "
              "echo CONTAINER_API_KEY=vk >> /etc/environment")
    r = autostop(host, vast, gp_home, tmp_path)
    assert r.returncode == 1 and "CONTAINER_ID says this instance is 4242, VAST_CONTAINERLABEL " \
        "says 999: they must agree" in r.stderr


def test_a_symlinked_save_is_copied_as_its_content_and_a_missing_one_holds_the_stop(
        host: harness.HostInfo, api: PlatformApi, gp_home: Path, tmp_path: Path) -> None:
    inv = host.inventory_with(tmp_path / "pod.yaml", platform="runpod", price_per_hour=0.5,
                              currency="USD")
    pod(host, api, "podmiss", mode="noop")
    ssh(host, "rm -rf /root/nosuch")
    r = autostop(host, inv, gp_home, tmp_path, "--save", "/root/nosuch", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "/root/nosuch does not exist yet" in r.stderr  # said at install
    where = json.loads(r.stdout)["dir"]
    harness.wait_until(lambda: "does not exist" in state(host, where).get("held", ""),
                       "the stop held", timeout=60)
    time.sleep(2 * IDLE)
    assert stops(api, "podmiss") == []  # RunPod's stop would clear the disk: never fired
    v = json.loads(gpu_provision("-H", inv, "autostop", "--status", "--json", home=gp_home,
                                 cwd=tmp_path).stdout)
    assert "did not fire: " in v["state_text"] and "/root/nosuch does not exist" in v["held"]
    row = json.loads(gpu_provision("-H", inv, "cost", "--json", home=gp_home,
                                   cwd=tmp_path).stdout)
    assert "/root/nosuch does not exist" in row["autostop_text"]
    gpu_provision("-H", inv, "autostop", "--cancel", home=gp_home, cwd=tmp_path)

    # ~/ckpt -> /root/scratch/ckpt, which holds a file and an absolute link to one elsewhere
    ssh(host, "rm -rf /root/scratch /root/ckpt /root/outside; mkdir -p /root/scratch/ckpt/sub; "
              "head -c 200000 /dev/urandom > /root/scratch/ckpt/ep1.pt; "
              "echo opt > /root/outside; ln -s /root/outside /root/scratch/ckpt/sub/optim.pt; "
              "ln -s /root/scratch/ckpt /root/ckpt")
    linked = pod(host, api, "podlink", mode="noop")
    r = autostop(host, inv, gp_home, tmp_path, "--save", "/root/ckpt", "--hook",
                 "echo pushed the code", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    where = json.loads(r.stdout)["dir"]
    harness.wait_until(lambda: stops(api, "podlink"), "the stop", timeout=60)
    name = ssh(host, "hostname")[1].strip()
    saved = f"/workspace/autostop-saved/{name}/ckpt"
    assert ssh(host, f"test -d {saved} && ! test -L {saved} && ! test -L {saved}/sub/optim.pt "
                     f"&& cmp {saved}/ep1.pt /root/scratch/ckpt/ep1.pt && "
                     f"cat {saved}/sub/optim.pt") == (0, "opt\n")
    text = log(host, where)
    assert "saved: 2 files, 200004 bytes, each checked (size and sha256) in " \
        f"/workspace/autostop-saved/{name}, flushed" in text
    # the hook first (its output in the log), then the checked save, then the stop
    assert text.index("hook: pushed the code") < text.index("saved: 2 files") < \
        text.index("POST https://api.runpod.io/v2/pods/podlink")
    assert state(host, where)["hook_result"].startswith("exit 0 after ")
    assert linked.stopped is False and api.violations == []


def test_a_volume_that_cannot_keep_the_copy_is_found_at_install_or_holds_the_stop(
        host: harness.HostInfo, api: PlatformApi, gp_home: Path, tmp_path: Path) -> None:
    """The kept volume is judged at install and again at the stop by what would lose the copy:
    mounted read-only (refused at install, nothing written), a save larger than its free space
    (said at install), a link on it leading back to the machine's own disk (the stop is held),
    a --save already on the volume whose files link off it (held). Another volume at its mount
    point, without the mark the install left, is still one the stop keeps: said, and saved to."""
    inv = host.inventory_with(tmp_path / "pod.yaml", platform="runpod")
    name = ssh(host, "hostname")[1].strip()
    ssh(host, "rm -rf /root/ckpt /root/elsewhere; mkdir -p /root/ckpt && echo w > /root/ckpt/w.pt")
    pod(host, api, "podvol", mode="noop")
    ssh(host, "mount -o remount,bind,ro /workspace")
    try:
        r = autostop(host, inv, gp_home, tmp_path, "--save", "/root/ckpt")
    finally:
        ssh(host, "mount -o remount,bind,rw /workspace")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "--save: /workspace on /workspace cannot be written here (read-only, or full?)" \
        in r.stderr
    assert ssh(host, "ls -A /workspace/.gpu-provision")[0] != 0  # nothing was left there

    ssh(host, "truncate -s 15T /root/ckpt/huge.pt")  # 15 TiB as the copy would read it
    job(host, "train")  # busy: nothing fires while the volume is changed under it
    r = autostop(host, inv, gp_home, tmp_path, "--save", "/root/ckpt", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"/root/ckpt holds 164926744\d{5} bytes and /workspace has \d+ free: "
                     r"the copy would not fit now, and the stop would be held", r.stderr), r.stderr
    where = json.loads(r.stdout)["dir"]
    token = ssh(host, f"cat {where}/keep_token")[1].strip()
    assert len(token) == 36 and ssh(host, "cat /workspace/.gpu-provision-volume")[1].strip() \
        == token
    # a second install (another pod on the volume) keeps the mark that is there
    assert autostop(host, inv, gp_home, tmp_path, "--save", "/root/ckpt").returncode == 0
    assert ssh(host, f"cat {where}/keep_token")[1].strip() == token
    # and the folder of this host's name holds another machine's save (a host name reused)
    theirs = f"/workspace/autostop-saved/{name}"
    ssh(host, f"mkdir -p {theirs}/ckpt && echo theirs > {theirs}/ckpt/w.pt && "
              f"echo ffffffffffffffffffffffffffffffff > {theirs}/.gpu-provision-owner")
    me = ssh(host, "head -c 8 /etc/machine-id")[1].strip()
    ssh(host, "rm /root/ckpt/huge.pt /workspace/.gpu-provision-volume; "
              f"kill -- -$(cat {JOBS}/train/pid)")  # as if another volume were mounted there
    harness.wait_until(lambda: stops(api, "podvol"), "the stop", timeout=60)
    text = log(host, where)
    assert "/workspace is not the volume autostop was set on (its mark .gpu-provision-volume " \
        "is missing or another's); it is storage the stop keeps, so the save goes there" in text
    assert f"{theirs} holds another machine's save (its .gpu-provision-owner): this one goes " \
        f"to {theirs}-{me}" in text
    assert ssh(host, f"cat {theirs}/ckpt/w.pt; cat {theirs}-{me}/ckpt/w.pt") == (0, "theirs\nw\n")
    gpu_provision("-H", inv, "autostop", "--cancel", home=gp_home, cwd=tmp_path)
    pod(host, api, "podvol2", mode="noop")

    # a --save on the volume already, whose weights link to the container disk
    ssh(host, "mkdir -p /workspace/run1 /root/weights && echo big > /root/weights/m.pt && "
              "ln -sfn /root/weights/m.pt /workspace/run1/m.pt")
    job(host, "train1")
    r = autostop(host, inv, gp_home, tmp_path, "--save", "/workspace/run1", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    where = json.loads(r.stdout)["dir"]
    ssh(host, f"kill -- -$(cat {JOBS}/train1/pid)")
    harness.wait_until(lambda: "/workspace/run1 is on /workspace but links to files off it, "
                       "which the stop deletes: /workspace/run1/m.pt -> /root/weights/m.pt" in
                       state(host, where).get("held", ""), "the stop held", timeout=60)
    assert stops(api, "podvol2") == []
    gpu_provision("-H", inv, "autostop", "--cancel", home=gp_home, cwd=tmp_path)

    job(host, "train2")
    r = autostop(host, inv, gp_home, tmp_path, "--save", "/root/ckpt", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    where = json.loads(r.stdout)["dir"]
    ssh(host, f"rm -rf /workspace/autostop-saved/{name}; "
              "mkdir -p /root/elsewhere /workspace/autostop-saved && "
              f"ln -sfn /root/elsewhere /workspace/autostop-saved/{name}; "
              f"kill -- -$(cat {JOBS}/train2/pid)")
    harness.wait_until(lambda: f"/workspace/autostop-saved/{name} leads off /workspace (to "
                       "/root/elsewhere)" in state(host, where).get("held", ""),
                       "the stop held", timeout=60)
    assert stops(api, "podvol2") == [] and ssh(host, "ls -A /root/elsewhere") == (0, "")
    ssh(host, "rm -rf /workspace/run1 /root/weights")


def test_a_job_started_during_a_long_save_keeps_the_machine_up(
        host: harness.HostInfo, api: PlatformApi, gp_home: Path, tmp_path: Path) -> None:
    inv = host.inventory_with(tmp_path / "pod.yaml", platform="runpod")
    pod(host, api, "podslow", mode="noop")
    ssh(host, "rm -rf /root/big && mkdir /root/big && head -c 1500000 /dev/urandom > /root/big/w")
    # the copy moves 300 KiB/s: about 5 s
    r = autostop(host, inv, gp_home, tmp_path, "--save", "/root/big", "--save-rate", "300",
                 "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    where = json.loads(r.stdout)["dir"]
    harness.wait_until(lambda: state(host, where).get("phase", "").startswith("saving"),
                       "the save", timeout=60)
    job(host, "late")  # the renter is back and starts a run while the copy goes on
    harness.wait_until(lambda: "work started during the save (job late" in
                       state(host, where).get("held", ""), "the stop held", timeout=60)
    assert stops(api, "podslow") == []
    busy_with(host, where, "job late (pid ")
    assert stops(api, "podslow") == []
    ssh(host, f"kill -- -$(cat {JOBS}/late/pid)")  # the run ends: now it stops (after a save)
    harness.wait_until(lambda: stops(api, "podslow"), "the stop", timeout=90)


def test_busy_as_the_renter_means_it(host: harness.HostInfo, gp_home: Path,
                                     tmp_path: Path) -> None:
    n = len(host.calls())
    r = autostop(host, host.inventory, gp_home, tmp_path, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    where = json.loads(r.stdout)["dir"]
    # a process holds a small CUDA context at 0%: busy whatever its utilisation
    gpu(host, "0 %", "300 MiB", [{"pid": 4242, "name": "python", "used_memory": 300}])
    busy_with(host, where, "a process (pid 4242) holds a GPU (300 MiB)")
    # a MIG GPU reports no utilisation ([N/A]): its instances' processes count
    gpu(host, "[N/A]", "120 MiB", [{"pid": 4343, "name": "python", "used_memory": 100}])
    busy_with(host, where, "a process (pid 4343) holds a GPU")
    gpu(host, "0 %", "3 MiB", [])
    # CPU-only work (tokenising, a download's unpacking) in this machine's processes
    ssh(host, "setsid sh -c 'echo $$ > /root/spin.pid; exec timeout 60 sh -c \"while :; do :; "
              "done\"' > /dev/null 2>&1 < /dev/null &")
    try:
        busy_with(host, where, "% of a CPU")
    finally:
        ssh(host, "kill -- -$(cat /root/spin.pid); true")
    # a run in a tmux pane that is not ours
    ssh(host, "tmux new-session -d -s mine 'sleep 120'")
    busy_with(host, where, "tmux session mine: sleep runs")
    ssh(host, "tmux kill-server; true")
    # a shell running a script: the pane's command is "bash" all the same
    ssh(host, "printf 'while :; do sleep 1; done\\n' > /root/train.sh; "
              "tmux new-session -d -s script 'bash /root/train.sh'")
    busy_with(host, where, "tmux session script: bash /root/train.sh runs")
    ssh(host, "tmux kill-server; true")
    # typed at a pane's prompt: a foreground job of its interactive shell
    ssh(host, "tmux new-session -d -s typed; sleep 0.5; "
              "tmux send-keys -t typed 'bash /root/train.sh' Enter")
    busy_with(host, where, "tmux session typed: a command runs in its shell")
    ssh(host, "tmux kill-server; true")
    # an SSH login with a terminal
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # a sandbox host
    client.connect(host.host, port=host.port, username=host.user, key_filename=host.key,
                   allow_agent=False, look_for_keys=False)
    try:
        # a VS Code server and its SSH connection (no terminal: the session is "root@notty")
        ssh(host, "setsid bash -c 'exec -a /root/.vscode-server/bin/c0de/node sleep 60' "
                  "> /dev/null 2>&1 < /dev/null & echo $! > /root/vscode.pid")
        client.exec_command("sleep 30")
        try:
            busy_with(host, where, "a VS Code server with an SSH connection runs")
        finally:
            ssh(host, "kill $(cat /root/vscode.pid); true")
        client.exec_command("sleep 60", get_pty=True)
        busy_with(host, where, "an SSH login is open (root@pts/")
        assert [c for c in host.calls()[n:] if c["tool"] == "shutdown"] == []
        # --wait-for jobs: a login does not hold the machine up
        r = autostop(host, host.inventory, gp_home, tmp_path, "--wait-for", "jobs")
        assert r.returncode == 0, r.stdout + r.stderr
        harness.wait_until(lambda: [c for c in host.calls()[n:] if c["tool"] == "shutdown"],
                           "the shutdown with a login open", timeout=60)
    finally:
        client.close()
    # --wait-for gpu: the GPUs alone; a job of ours that leaves them idle does not count
    m = len(host.calls())
    job(host, "cpu-only")
    r = autostop(host, host.inventory, gp_home, tmp_path, "--wait-for", "gpu")
    assert r.returncode == 0, r.stdout + r.stderr
    harness.wait_until(lambda: [c for c in host.calls()[m:] if c["tool"] == "shutdown"],
                       "the shutdown beside a job that does not use the GPUs", timeout=60)


def saves_on_sigint(path: str, takes: float = 0) -> str:
    """A training loop that writes its checkpoint to ``path`` on SIGINT (KeyboardInterrupt), as
    ours do. It sets the handler itself: started in the background by the test's shell (not by
    `run`, whose jobs see SIGINT: test_jobs), it would inherit SIGINT ignored."""
    return ("import signal, time\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "try:\n    while True: time.sleep(0.1)\n"
            "except KeyboardInterrupt:\n"
            f"    time.sleep({takes})\n"
            f"    open({path!r}, 'w').write('step 999\\n')\n")


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_preemption_notice_interrupts_our_job_which_checkpoints(
        host: harness.HostInfo, gp_home: Path, tmp_path: Path, cloud: str) -> None:
    md = MetadataApi()
    try:
        train = saves_on_sigint(f"/root/ckpt-{cloud}.txt")
        job(host, "train", f"exec python3 -c {shlex.quote(train)}")
        r = gpu_provision("-H", host.inventory, "autostop", "--action", "none", "--idle", "1h",
                          "--interval", f"{INTERVAL}s", "--preemption", cloud,
                          "--metadata-address", md.address, "--hook",
                          f"echo hooked > /root/hook-{cloud}.out", "--json",
                          home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        where = json.loads(r.stdout)["dir"]
        harness.wait_until(lambda: md.calls, "the watcher's first read", timeout=30)
        assert ssh(host, f"test -e /root/ckpt-{cloud}.txt")[0] != 0  # nothing before the notice
        md.preempt()
        harness.wait_until(lambda: ssh(host, f"cat /root/ckpt-{cloud}.txt")[1] == "step 999\n",
                           "the job's checkpoint", timeout=30)
        harness.wait_until(lambda: ssh(host, f"cat /root/hook-{cloud}.out")[1] == "hooked\n",
                           "the hook", timeout=30)
        text = log(host, where)
        assert "preemption notice: " in text and "SIGINT sent to our jobs: train" in text
        v = json.loads(gpu_provision("-H", host.inventory, "autostop", "--status", "--json",
                                     home=gp_home, cwd=tmp_path).stdout)
        assert v["state_text"].startswith("preemption notice: ")
        assert md.violations == []
    finally:
        md.close()


def test_a_gcp_preemption_whose_shutdown_comes_first_still_lets_our_job_checkpoint(
        host: harness.HostInfo, gp_home: Path, tmp_path: Path) -> None:
    """On GCP the notice is an ACPI soft off: the guest's shutdown starts with it, and the TERM
    reaches the watchdog (here: its whole process group, as a control-group kill does) before
    the watcher's held read returns. The watchdog asks once more, sends our job its SIGINT,
    waits for it to end, flushes, and only then lets the shutdown go on. (A job the shutdown's
    own SIGTERM reaches too, in a login's session under systemd, keeps its checkpoint only where
    it saves on SIGTERM as well: docs/autostop.md.)"""
    md = MetadataApi()
    try:
        train = saves_on_sigint("/root/ckpt-acpi.txt", takes=2)  # a checkpoint takes a while
        job(host, "train", f"exec python3 -c {shlex.quote(train)}")
        r = gpu_provision("-H", host.inventory, "autostop", "--action", "none", "--idle", "1h",
                          "--interval", "30s", "--preemption", "gcp",
                          "--metadata-address", md.address, "--json", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        where = json.loads(r.stdout)["dir"]
        harness.wait_until(lambda: md.calls, "the watcher's first read", timeout=30)
        pid = ssh(host, f"cat {shlex.quote(where)}/pid")[1].strip()
        assert pid.isdigit()
        md.late = 20
        md.preempt()
        code, out = ssh(host, f"kill -TERM -- -{pid}")
        assert code == 0, out
        harness.wait_until(lambda: ssh(host, "cat /root/ckpt-acpi.txt")[1] == "step 999\n",
                           "the job's checkpoint", timeout=30)
        harness.wait_until(lambda: ssh(host, f"kill -0 {pid}")[0] != 0,
                           "the watchdog's end once the job ended", timeout=30)
        text = log(host, where)
        assert "preemption notice: GCP preemption" in text
        assert "SIGINT sent to our jobs: train" in text
        assert "the machine is going down (preemption): our jobs ended" in text
        # nothing of the watchdog lives on holding its lock
        assert ssh(host, f"flock -n {shlex.quote(where)}/lock true")[0] == 0
    finally:
        md.close()


def test_the_spend_cap_warns_then_stops_a_busy_machine(host: harness.HostInfo, gp_home: Path,
                                                       tmp_path: Path) -> None:
    # since when the machine bills: the later of the kernel's boot and PID 1's start
    since = json.loads(gpu_provision("-H", host.inventory, "cost", "--json", home=gp_home,
                                     cwd=tmp_path).stdout)["since"]
    spent = 2.0 * (time.time() - since) / 3600
    n = len(host.calls())
    job(host, "long")
    warn = host.inventory_with(tmp_path / "cap90.yaml", price_per_hour=2.0, currency="USD",
                               max_spend=round(spent / 0.9, 4))
    r = autostop(host, warn, gp_home, tmp_path, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    where = json.loads(r.stdout)["dir"]
    harness.wait_until(lambda: "at 100% the stop runs" in log(host, where), "the 80% warning",
                       timeout=30)
    busy_with(host, where, "job long (pid ")
    assert [c for c in host.calls()[n:] if c["tool"] == "shutdown"] == []
    cap = host.inventory_with(tmp_path / "cap50.yaml", price_per_hour=2.0, currency="USD",
                              max_spend=round(spent * 0.5, 4))
    r = autostop(host, cap, gp_home, tmp_path, "--stop-wait", "2s", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    harness.wait_until(lambda: [c for c in host.calls()[n:] if c["tool"] == "shutdown"],
                       "the stop at the cap, though a job runs", timeout=30)
    assert "spent " in log(host, json.loads(r.stdout)["dir"])
    # the stand-in's machine stays up after an accepted shutdown: the cap, still spent, stops it
    # again (it fired once and then let the machine bill on, busy as it is)
    harness.wait_until(lambda: len([c for c in host.calls()[n:] if c["tool"] == "shutdown"]) >= 2,
                       "the cap's second stop", timeout=30)


def test_a_webhook_receives_a_jobs_end(host: harness.HostInfo, gp_home: Path,
                                        tmp_path: Path) -> None:
    # the env a bootstrap would have left: a venv over the host's python (the layout `run`
    # meets on an image with a system torch), recorded in expected.json; a pushed token
    ssh(host, "python3 -m venv --without-pip /root/venv-gp && mkdir -p /root/.gpu-provision && "
              "printf '{\\n \"env_prefix\": \"/root/venv-gp\",\\n \"conda_root\": "
              "\"/root/venv-gp\"\\n}\\n' > /root/.gpu-provision/expected.json && "
              "printf \"export HF_TOKEN='hf_SECRET0123456789'\\n\" > /root/.gpu-provision/env")
    hook = Webhook()
    try:
        inv = host.inventory_with(tmp_path / "told.yaml", notify=[hook.url])
        r = gpu_provision("-H", inv, "run", "--no-code", "--name", "nf", "--", "bash", "-c",
                          "echo step 1 done; echo token $HF_TOKEN; exit 3", home=gp_home,
                          cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        harness.wait_until(lambda: hook.bodies, "the webhook's message", timeout=60)
        got = hook.bodies[0]
        assert (got["event"], got["job"], got["exit"], got["title"]) == \
            ("job", "nf", 3, "job nf failed (exit 3)")
        assert got["host"] == "told" and got["job_id"].startswith("nf-")
        assert "step 1 done" in got["log_tail"] and "token ***" in got["log_tail"]
        assert "hf_SECRET0123456789" not in json.dumps(got)
        assert hook.headers[0]["Content-Type"] == "application/json"
        sent = ssh(host, "cat /root/.gpu-provision/notify.log")[1]
        assert "target 1 (webhook: HTTP 200)" in sent and "T0K3N" not in sent  # no URL logged
    finally:
        hook.close()


def test_lambda_finds_its_instance_by_its_address_and_checks_an_env_id(
        host: harness.HostInfo, api: PlatformApi, gp_home: Path, tmp_path: Path) -> None:
    key = "secret_lambda_addr"
    api.add(Instance("lambda", "aa11", key, ip="127.0.0.250"))  # another machine of the account
    mine = api.add(Instance("lambda", "bb22", key, ip=host.host, mode="noop"))
    inv = host.inventory_with(tmp_path / "lambda.yaml", platform="lambda",
                              push_env=["LAMBDA_API_KEY"])
    env = {"LAMBDA_API_KEY": key}
    # an id from the environment is looked up like one given: another machine's is refused
    ssh(host, "echo LAMBDA_INSTANCE_ID=aa11 >> /etc/environment")
    r = gpu_provision("-H", inv, "autostop", "--action", "terminate", "--idle", "1h",
                      home=gp_home, cwd=tmp_path, env=env)
    assert r.returncode == 1 and "instance aa11 (LAMBDA_INSTANCE_ID) is the machine at " \
        "127.0.0.250, not this host" in r.stderr
    # none given: the account's instance whose address is this host's, and the watchdog uses it
    ssh(host, "sed -i '/^LAMBDA_/d' /etc/environment")
    r = gpu_provision("-H", inv, "autostop", "--action", "terminate", "--idle", f"{IDLE}s",
                      "--interval", f"{INTERVAL}s", "--json", home=gp_home, cwd=tmp_path,
                      env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    harness.wait_until(lambda: stops(api, "bb22"), "the terminate", timeout=60)
    assert json.loads(stops(api, "bb22")[0].body) == {"instance_ids": ["bb22"]}
    assert stops(api, "aa11") == [] and mine.stopped is False and api.violations == []


def test_answers_a_retry_can_change(host: harness.HostInfo, api: PlatformApi, gp_home: Path,
                                    tmp_path: Path) -> None:
    inv = host.inventory_with(tmp_path / "pod.yaml", platform="runpod")
    ssh(host, "mkdir -p /root/ckpt && echo w > /root/ckpt/w.pt")
    # over the rate limit (429, Retry-After): curl asks again after it, and the stop goes through
    pod(host, api, "pod429x", mode="429")
    r = autostop(host, inv, gp_home, tmp_path, "--save", "/root/ckpt", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    where = json.loads(r.stdout)["dir"]
    harness.wait_until(lambda: state(host, where).get("stopping_since"), "the stop", timeout=60)
    assert [c.status for c in stops(api, "pod429x")] == [429, 200]
    # an action the pod's status does not allow now (409): shown, and tried again later
    pod(host, api, "pod409x", mode="409")
    r = autostop(host, inv, gp_home, tmp_path, "--save", "/root/ckpt", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    where = json.loads(r.stdout)["dir"]
    harness.wait_until(lambda: "HTTP 409" in state(host, where).get("last_failure", ""),
                       "the 409 shown", timeout=60)
    assert not state(host, where).get("dead") and api.violations == []
