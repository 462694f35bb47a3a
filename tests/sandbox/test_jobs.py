"""Jobs on sandbox hosts with a real env: one CPU-only host bootstrapped once (the real CPU torch
wheel from the local mirror), and hosts given a copy of its home (a second one for a 2-host
torchrun, a stand-in H200 for GPUs and watch, a fresh one to reboot)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from provision.store import run_id
from tests.conftest import Hosts, gpu_provision
from tests.sandbox import harness
from tests.sandbox.proxy import TcpProxy

pytestmark = pytest.mark.sandbox
ENV = "/root/miniconda3/envs/torch"
HOSTILE = ["; rm -rf /", "it's", "a b", "x\ny", "$(reboot)", "`id`"]


def clone_home(src: harness.HostInfo, dst: harness.HostInfo) -> None:
    """``dst`` gets ``src``'s bootstrapped env (hard links: nothing here writes into it) and the
    record of it (expected.json), as a bootstrap would have left them."""
    a, b = src.path("/root"), dst.path("/root")
    subprocess.run(["cp", "-al", str(a / "miniconda3"), str(b / "miniconda3")], check=True)
    (b / ".gpu-provision").mkdir(exist_ok=True)
    shutil.copy(a / ".gpu-provision" / "expected.json", b / ".gpu-provision" / "expected.json")


@pytest.fixture(scope="module")
def trained(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.HostInfo]:
    """A CPU-only host bootstrapped once for every job test."""
    info = hosts.fresh("cpu-only")
    home = tmp_path_factory.mktemp("boot-home")
    r = gpu_provision("-H", info.inventory, "bootstrap", home=home,
                      cwd=tmp_path_factory.mktemp("boot"), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    yield info
    harness.stop(info.id)


@pytest.fixture(scope="module")
def second(hosts: Hosts, trained: harness.HostInfo) -> Iterator[harness.HostInfo]:
    info = hosts.fresh("cpu-only")
    clone_home(trained, info)
    yield info
    harness.stop(info.id)


@pytest.fixture(scope="module")
def gpu_host(hosts: Hosts, trained: harness.HostInfo) -> Iterator[harness.HostInfo]:
    """The H200 stand-in (nvidia-smi replays a real H200's captures) with the CPU env."""
    info = hosts.fresh("h200")
    clone_home(trained, info)
    yield info
    harness.stop(info.id)


class Gp:
    """The real program, in one working folder (its logs/ and reports/) and one known_hosts."""

    def __init__(self, home: Path, cwd: Path):
        self.home, self.cwd = home, cwd

    def __call__(self, *args: str, env: dict[str, str] | None = None,
                 timeout: int = 300) -> subprocess.CompletedProcess[str]:
        return gpu_provision(*args, home=self.home, cwd=self.cwd, env=env, timeout=timeout)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        # faulthandler: a reader that hangs prints where each of its threads stood (rest_of)
        env = dict(os.environ, GPU_PROVISION_HOME=str(self.home), COLUMNS="200",
                   GPU_PROVISION_WORKDIR=str(self.cwd),
                   PYTHONFAULTHANDLER="1")
        return subprocess.Popen([sys.executable, "-m", "provision", *args], cwd=self.cwd, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def ok(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        r = self(*args, **kw)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r

    def start(self, inv: str, *args: str, **kw: Any) -> str:
        """`run --json ...`: the job's id."""
        r = self.ok("-H", inv, "run", "--json", *args, **kw)
        return str(json.loads(r.stdout)["id"])

    def jobs(self, inv: str) -> dict[str, dict[str, Any]]:
        return {j["id"]: j for j in json.loads(self.ok("-H", inv, "jobs", "--json", "--all").stdout)}


@pytest.fixture()
def gp(gp_home: Path, tmp_path: Path) -> Gp:
    return Gp(gp_home, tmp_path)


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return got


def test_run_returns_at_once_in_one_execution(trained: harness.HostInfo, gp: Gp,
                                              tmp_path: Path) -> None:
    """The command's words arrive as argv, in the env, with the pushed token (masked in what we
    print), the validation's fix and CUDA_VISIBLE_DEVICES; run is one remote execution."""
    token = "s3cr3t-token-value"
    inv = trained.inventory_with(tmp_path / "box.yaml", push_env=["GP_JOB_TOKEN"])
    gp.ok("-H", inv, "bootstrap", env={"GP_JOB_TOKEN": token})  # pushes the token
    # the last validation named a fix: run applies it (this re-run changed nothing but the
    # token, so it saved no report of its own: the newest one is this)
    reports = tmp_path / "reports" / "box"
    reports.mkdir(parents=True, exist_ok=True)
    fix = {"name": "nccl all-reduce", "status": "warn", "reason": "hung with peer-to-peer on",
           "env": {"NCCL_P2P_DISABLE": "1"}}
    (reports / f"validate-{run_id(time.time() + 3600)}.json").write_text(
        json.dumps({"verdict": "WARN", "checks": [fix]}))
    script = ("import os, sys; print(repr(sys.argv[1:])); print(sys.prefix); "
              "print([os.environ.get(k) for k in ('CUDA_VISIBLE_DEVICES', 'PYTHONUNBUFFERED', "
              "'NCCL_P2P_DISABLE', 'GP_JOB_TOKEN')]); print(os.getcwd())")
    before = len(trained.sessions())
    r = gp.ok("-H", inv, "run", "--name", "argv", "--workdir", "/tmp", "--no-code", "--",
              "python", "-c", script, *HOSTILE, env={"GP_JOB_TOKEN": token})
    assert len(trained.sessions()) - before == 1, "run with --no-code is ONE remote execution"
    assert "box: applying NCCL_P2P_DISABLE=1 (nccl all-reduce: hung with peer-to-peer on)" in r.stderr
    assert "box: started job argv-" in r.stdout and "follow it: gpu-provision -H " in r.stdout
    job = r.stdout.split("started job ")[1].split()[0]
    logs = gp("-H", inv, "logs", job, "-f", env={"GP_JOB_TOKEN": token})
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines() == [repr(HOSTILE).replace("\\n", "\\n"), ENV,
                                        "['', '1', '1', '********']", "/tmp"]
    assert token not in logs.stdout + logs.stderr
    # on the host the job had the real value
    log = trained.path(f"/root/.gpu-provision/jobs/{job}/log").read_text()
    assert f"'{token}'" in log
    j = gp.jobs(inv)[job]
    assert (j["state"], j["exit_code"], j["name"], j["command"][3:]) == \
        ("exited 0", 0, "argv", HOSTILE)
    assert j["log_size"] == len(log.encode()) and j["last_line"] == "/tmp"


def test_run_without_a_command_runs_the_recipes_job(trained: harness.HostInfo, gp: Gp,
                                                    tmp_path: Path) -> None:
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "trainer.yaml").write_text(
        'python: "3.11"\nenv_name: torch\ntorch: "2.13"\ndomain_libraries: false\n'
        "job: [python, -c, \"print('from the recipe')\"]\n")
    inv = trained.inventory_with(tmp_path / "box.yaml", recipe="trainer")
    job = gp.start(inv)
    assert job.startswith("python-")  # named after the program (no script file)
    r = gp("-H", inv, "logs", job, "-f")
    assert (r.returncode, r.stdout) == (0, "from the recipe\n")
    (tmp_path / "recipes" / "plain.yaml").write_text('python: "3.11"\n')
    r = gp("-H", trained.inventory_with(tmp_path / "p.yaml", recipe="plain"), "run")
    assert r.returncode == 2  # a command line that cannot work, as docs/commands.md's exit codes say
    assert "no command: give one after -- (gpu-provision -H HOST run -- python train.py), or " \
        "set job: [python, train.py] in recipe 'plain'" in r.stderr


COUNTER = ("import os, sys, time\ni = 0\nwhile not os.path.exists(sys.argv[1]):\n"
           "    print(f'line {i}', flush=True); i += 1; time.sleep(0.02)\n"
           "print('done'); sys.exit(5)\n")


def lines_of(proc: subprocess.Popen[str], n: int) -> list[str]:
    """Read ``n`` lines of a running reader's output (it keeps running)."""
    assert proc.stdout is not None
    got = [proc.stdout.readline().rstrip("\n") for _ in range(n)]
    assert all(got), got
    return got


def rest_of(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Its output to the end, through the same buffered files ``lines_of`` read from
    (communicate() would skip what they hold already)."""
    assert proc.stdout is not None and proc.stderr is not None
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack, then it ends
        proc.wait(timeout=30)
        pytest.fail(f"{proc.args} did not end in 60 s; where it stood:\n"
                    f"{proc.stdout.read()[-3000:]}\n{proc.stderr.read()[-12000:]}")
    return proc.stdout.read(), proc.stderr.read()


def test_job_survives_a_cut_link_and_a_killed_laptop_and_logs_resume(
        trained: harness.HostInfo, gp: Gp, tmp_path: Path) -> None:
    proxy = TcpProxy((trained.host, trained.port))
    stop = f"/tmp/stop-{tmp_path.name}"
    try:
        inv = trained.inventory_with(tmp_path / "far.yaml", host="127.0.0.1", port=proxy.port)
        job = gp.start(inv, "--name", "counter", "--", "python", "-c", COUNTER, stop)

        # the link is cut under a reader: it says so and how to resume; the job goes on
        first = gp.popen("-H", inv, "logs", job, "-f")
        a = lines_of(first, 40)
        proxy.cut()
        out, err = rest_of(first)
        assert first.returncode == 1, err
        assert "the connection dropped" in err and "run the same command again to resume" in err
        a += out.splitlines()

        # the laptop's reader is killed outright
        second = gp.popen("-H", inv, "logs", job, "-f")
        b = lines_of(second, 40)
        second.send_signal(signal.SIGKILL)
        b += rest_of(second)[0].splitlines()
        assert gp.jobs(inv)[job]["state"] == "running"

        trained.path(stop).write_text("")
        last = gp("-H", inv, "logs", job, "-f")
        assert last.returncode == 5, last.stderr  # -f ends with the job's exit code
        c = last.stdout.splitlines()
    finally:
        proxy.close()
    assert a[0] == "line 0" and c[-1] == "done"
    # after the cut: exactly where it stopped (the host's count; nothing lost or repeated)
    assert b[0] == f"line {int(a[-1].split()[1]) + 1}"
    # after the kill: a line printed in the instant the process died may come again, none is lost
    if c[0] == b[-1]:
        c = c[1:]
    seen = a + b + c
    assert seen == [f"line {i}" for i in range(len(seen) - 1)] + ["done"]


def test_a_second_job_on_the_same_gpus_is_refused_unless_share(gpu_host: harness.HostInfo,
                                                               gp: Gp) -> None:
    inv = gpu_host.inventory
    first = gp.start(inv, "--name", "holder", "--", "python", "-c",
                     "import os, time; print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True); "
                     "time.sleep(600)")
    try:
        again = gp("-H", inv, "run", "--name", "other", "--", "python", "-c", "print(1)")
        assert again.returncode == 1
        assert f"GPU 0 is in use by job {first} (running since " in again.stderr
        assert "add --share to run beside it" in again.stderr
        shared = gp.start(inv, "--share", "--gpus", "0", "--", "python", "-c",
                          "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")
        assert gp("-H", inv, "logs", shared, "-f").stdout == "0\n"
        nope = gp("-H", inv, "run", "--gpus", "3", "--", "python", "-c", "print(1)")
        assert nope.returncode == 1 and "GPU 3 asked for; the host has GPUs 0" in nope.stderr
        assert gp("-H", inv, "logs", first).stdout == "0\n"

        # nvidia-smi (the stand-in) shows the job's process holding GPU memory
        pid = gp.jobs(inv)[first]["pid"]
        harness.in_host(gpu_host, "python3", "-c", (
            "import json; p = '/var/lib/gpu-sandbox/state.json'; s = json.load(open(p)); "
            f"s['processes'] = [{{'pid': {pid}, 'name': 'python', 'used_memory': 18330}}]; "
            "json.dump(s, open(p, 'w'))"))
        assert gp.jobs(inv)[first]["gpu_memory_mib"] == 18330

        watch_once(gpu_host, gp, first)
        watch_live_is_one_execution(gpu_host, gp)
    finally:
        gp("-H", inv, "kill", first, "--grace", "2")


def watch_once(info: harness.HostInfo, gp: Gp, job: str) -> None:
    r = gp.ok("-H", info.inventory, "watch", "--once", "--json")
    [h] = json.loads(r.stdout)["hosts"]
    # the captured H200 row (tests/fixtures/nvidia-smi/query-gpu-full-h200-590.48.01.csv)
    assert h["gpus"] == [{"index": 0, "utilization_pct": 0.0, "memory_used_mib": 0.0,
                          "memory_total_mib": 143771.0, "temperature_c": 28.0, "power_w": 77.71,
                          "power_limit_w": 700.0, "sm_clock_mhz": 345.0, "sm_clock_max_mhz": 1980.0,
                          "clock_reasons": ["idle"], "throttled": []}]
    j = {x["id"]: x for x in h["jobs"]}[job]
    assert (j["state"], j["gpus"], j["gpu_memory_mib"]) == ("running", [0], 18330)
    assert h["disks"][0]["path"] == "/root" and h["memory"]["total_gb"] > 0
    assert isinstance(h["alerts"], list)


def watch_live_is_one_execution(info: harness.HostInfo, gp: Gp) -> None:
    before = len(info.sessions())
    r = gp.ok("-H", info.inventory, "watch", "--samples", "3", "--interval", "1")
    assert len(info.sessions()) - before == 1, "watch is ONE remote execution for its life"
    assert "watch: " + Path(info.inventory).stem in r.stdout and "143771" not in r.stdout
    assert "140.4 GiB" in r.stdout and "idle" in r.stdout
    # the same afresh (the run above went through the kept connection, the default)
    fresh = gp.ok("-H", info.inventory, "--no-keep", "watch", "--samples", "2", "--interval", "1")
    assert "watch: " + Path(info.inventory).stem in fresh.stdout and "140.4 GiB" in fresh.stdout
    # its sampler and nvidia-smi -l are gone with it
    merged = str(Path(info.root) / "merged")

    def sampler_left() -> list[str]:
        left = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and os.readlink(d / "root") == merged and \
                        b"nvidia-smi" in (d / "cmdline").read_bytes():
                    left.append(d.name)
            except OSError:
                continue
        return left
    wait_for(lambda: not sampler_left(), "the sampler's nvidia-smi -l outlived the watch", 30)


def test_a_job_killed_by_the_oom_killer_is_reported_so(trained: harness.HostInfo, gp: Gp,
                                                       tmp_path: Path) -> None:
    """The kernel's real OOM killer, in a memory cgroup the job joins (a rented box's limit)."""
    v1 = Path("/sys/fs/cgroup/memory")
    cg = (v1 if v1.is_dir() else Path("/sys/fs/cgroup")) / f"gpu-sandbox-oom-{tmp_path.name}"
    try:
        cg.mkdir()
        (cg / ("memory.limit_in_bytes" if v1.is_dir() else "memory.max")).write_text("64M\n")
        if (cg / "memory.swappiness").exists():
            (cg / "memory.swappiness").write_text("0\n")
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    try:
        job = gp.start(trained.inventory, "--name", "hog", "--", "bash", "-c",
                       f'echo $$ > {cg}/cgroup.procs && exec python -c '
                       '"print(\'allocating\', flush=True); x = b\'x\' * (512 << 20)"')
        r = gp("-H", trained.inventory, "logs", job, "-f")
        assert r.returncode == 137 and r.stdout.startswith("allocating")
        j = gp.jobs(trained.inventory)[job]
        assert j["state"] == "killed by OOM", j
        assert "Killed process" in j["evidence"] and "out of memory" in j["evidence"].lower()
    finally:
        wait_for(lambda: not (cg / "cgroup.procs").read_text().strip(), "the hog lingers", 30)
        cg.rmdir()


def test_a_job_on_a_host_that_rebooted_is_lost_in_a_reboot(hosts: Hosts, trained: harness.HostInfo,
                                                           gp: Gp) -> None:
    info = hosts.fresh("cpu-only")
    try:
        clone_home(trained, info)
        job = gp.start(info.inventory, "--name", "sleeper", "--", "sleep", "600")
        assert gp.jobs(info.inventory)[job]["state"] == "running"
        boots = info.state().get("boots", 0)
        harness.in_host(info, "reboot", check=False)
        wait_for(lambda: info.state().get("boots", 0) > boots, "the host did not reboot")
        harness._wait_ssh(info.host, info.port)
        j = gp.jobs(info.inventory)[job]
        assert (j["state"], j["exit_code"], j["duration_s"]) == ("lost in a reboot", None, None)
        r = gp("-H", info.inventory, "logs", job, "-f")
        assert r.returncode == 255
        assert "the job ended without an exit code (lost in a reboot" in r.stderr
    finally:
        harness.stop(info.id)


def test_bootstrap_and_validate_run_while_a_job_runs(trained: harness.HostInfo, gp: Gp) -> None:
    inv = trained.inventory
    job = gp.start(inv, "--name", "busy", "--", "python", "-c",
                   "import time\nwhile True: time.sleep(0.5)")
    try:
        boot = gp.ok("-H", inv, "bootstrap")  # the job holds no lock bootstrap waits for
        assert "torch: nothing to do" in boot.stdout
        v = gp.ok("-H", inv, "validate")
        assert "verdict: PASS" in v.stdout
        # a change to the env under the job waits for it, and says how to go on
        more = trained.inventory_with(gp.cwd / "more.yaml", packages=["tqdm"])
        held = gp("-H", more, "bootstrap")
        assert held.returncode != 0
        assert f"job {job} (pid " in held.stdout + held.stderr
        assert "the packages change would break it under way" in held.stdout + held.stderr
        assert f"kill {job}`" in held.stdout + held.stderr
        assert gp.jobs(inv)[job]["state"] == "running"
    finally:
        k = gp("-H", inv, "kill", job, "--json")
    [report] = json.loads(k.stdout)
    assert report["was_running"] and report["steps"][0]["signal"] == "SIGINT"
    assert report["steps"][-1]["ended"] and report["exit"]["rc"] == 130
    assert gp.jobs(inv)[job]["state"] == "killed (SIGINT)"


def test_a_job_never_starts_under_a_provisioning_step(trained: harness.HostInfo, gp: Gp,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Bootstrap's steps hold the host lock exclusively, `run` holds it shared while it starts
    a job: a run during an install (here a step that sleeps) is refused with the step's name,
    and goes through once the step has ended."""
    monkeypatch.setenv("GPU_PROVISION_HOME", str(gp.home))
    holder = harness.hold_host_lock(trained, "torch-hold")
    r = gp("-H", trained.inventory, "run", "--name", "early", "--", "python", "-c", "pass")
    holder.join()
    assert r.returncode != 0
    assert "a provisioning step holds this host" in r.stderr + r.stdout
    assert "step torch-hold" in r.stderr + r.stdout
    assert "early" not in gp.jobs(trained.inventory)
    job = gp.start(trained.inventory, "--name", "after", "--", "python", "-c", "pass")
    assert job in gp.jobs(trained.inventory)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# each rank's line in one write: a job's Python is unbuffered (PYTHONUNBUFFERED=1), where print
# writes the text and its newline apart, and two ranks of a host share one log
DDP = """import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
os.write(1, f"rank {rank} of {world}: sum {t.item():.0f}\\n".encode())
dist.destroy_process_group()
"""


def test_two_hosts_torchrun_with_gloo(trained: harness.HostInfo, second: harness.HostInfo,
                                      gp: Gp) -> None:
    for info in (trained, second):
        info.path("/root/ddp.py").write_text(DDP)
    both = f"{trained.inventory},{second.inventory}"
    a, b = Path(trained.inventory).stem, Path(second.inventory).stem
    r = gp.ok("run", "--hosts", both, "--nproc-per-node", "2", "--master-port", str(free_port()),
              "--no-code", "--", "ddp.py")
    assert f"rendezvous on {trained.host}:" in r.stderr and "interface lo" in r.stderr
    assert f"$ torchrun --nnodes=2 --node-rank=1 --nproc-per-node=2 --master-addr={trained.host}" \
        in r.stdout
    job = r.stdout.split("started job ")[1].split()[0]
    logs = gp("logs", job, "--hosts", both, "-f", timeout=300)
    assert logs.returncode == 0, logs.stdout[-2000:] + logs.stderr[-2000:]
    ranks = sorted(ln for ln in logs.stdout.splitlines() if ": rank " in ln)
    # sorted both ways: which host is cpu-only-1 depends on the order the hosts were started in
    assert ranks == sorted([f"{a}: rank 0 of 4: sum 6", f"{a}: rank 1 of 4: sum 6",
                            f"{b}: rank 2 of 4: sum 6", f"{b}: rank 3 of 4: sum 6"])
    listed = json.loads(gp.ok("jobs", "--hosts", both, "--json").stdout)
    mine = [(j["host"], j["rank"], j["nnodes"], j["state"]) for j in listed if j["id"] == job]
    assert mine == [(a, 0, 2, "exited 0"), (b, 1, 2, "exited 0")]
    # -H a,b: watch is one view of both (one call, not one per host)
    view = json.loads(gp.ok("-H", both, "watch", "--once", "--json").stdout)
    assert [h["host"] for h in view["hosts"]] == [a, b]
    assert {j["id"] for h in view["hosts"] for j in h["jobs"]} >= {job}


def test_a_job_on_each_host_followed_and_stopped_together(trained: harness.HostInfo,
                                                          second: harness.HostInfo, gp: Gp) -> None:
    """-H a,b run starts one job on each; Ctrl-C on a reader of both ends it at once (the jobs go
    on); kill --hosts stops both."""
    both = f"{trained.inventory},{second.inventory}"
    gp.ok("-H", both, "run", "--name", "twin", "--", "python", "-c",
          "import time; print('up', flush=True); time.sleep(600)")
    reader = gp.popen("logs", "twin", "--hosts", both, "-f")
    assert sorted(lines_of(reader, 2)) == sorted(f"{Path(i.inventory).stem}: up"
                                                 for i in (trained, second))
    reader.send_signal(signal.SIGINT)
    out, err = rest_of(reader)
    assert reader.returncode == 130 and "stopped following; the job goes on" in err
    assert all(j["state"] == "running" for j in json.loads(
        gp.ok("jobs", "--hosts", both, "--json").stdout) if j["name"] == "twin")
    killed = json.loads(gp.ok("kill", "twin", "--hosts", both, "--json", "--grace", "5").stdout)
    assert [(k["steps"][0]["signal"], k["steps"][0]["ended"]) for k in killed] == \
        [("SIGINT", True), ("SIGINT", True)]


def test_no_env_no_job(hosts: Hosts, gp: Gp) -> None:
    """A host that was never bootstrapped: refused, one line, nothing written there."""
    info = hosts.get("cpu-only")
    r = gp("-H", info.inventory, "run", "--", "python", "-c", "1")
    assert r.returncode == 1
    assert "no bootstrapped env on this host" in r.stderr and "run bootstrap first" in r.stderr
    assert not info.path("/root/.gpu-provision/jobs").exists()


def test_validations_all_reduce_measures_and_bounds_a_hang(trained: harness.HostInfo) -> None:
    """gpu/validate_gpu.py's multi-GPU measuring code, run with gloo on the CPU (the same spawn,
    timing and time limit NCCL gets on GPUs): a correct sum with a bandwidth; a run that does not
    answer in time is ended with every worker it started."""
    code = ("import importlib.util, json; "
            "s = importlib.util.spec_from_file_location('vg', '/root/.gpu-provision/validate_gpu.py'); "
            "vg = importlib.util.module_from_spec(s); s.loader.exec_module(vg); "
            "print(json.dumps([vg._allreduce(2, {}, 'gloo', 4, 3, 180), "
            "vg._allreduce(2, {'GP_MARK': 'hang'}, 'gloo', 4, 3, 0.3)]))")
    r = harness.in_host(trained, f"{ENV}/bin/python", "-c", code)
    done, hung = json.loads(r.stdout.splitlines()[-1])
    assert done["ok"] and done["busbw_gbs"] > 0 and done["error"] is None, done
    assert (hung["ok"], hung["timeout"], hung["error"]) == (False, True, "no answer within 0.3s")

    def marked() -> list[str]:
        left = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and b"GP_MARK=hang" in (d / "environ").read_bytes():
                    left.append(d.name)
            except OSError:
                continue
        return left
    wait_for(lambda: not marked(), "a worker of the hung run outlived it", 30)


STUBBORN = ("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGTERM, lambda *a: print('TERM ignored', flush=True))\n"
            "print('up', flush=True)\nwhile True: time.sleep(0.2)\n")


def test_kill_escalates_to_sigkill_for_a_job_that_ignores_the_others(trained: harness.HostInfo,
                                                                     gp: Gp) -> None:
    inv = trained.inventory
    job = gp.start(inv, "--name", "stubborn", "--", "python", "-c", STUBBORN)
    wait_for(lambda: "up" in gp.ok("-H", inv, "logs", job, "--all").stdout, "it never started")
    k = gp.ok("-H", inv, "kill", job, "--grace", "1")
    # each signal waited out the grace (the seconds are the host's clock: more under load)
    m = re.search(rf"job {re.escape(job)}: SIGINT: still running after (\d+)s; SIGTERM: still running after "
                  r"(\d+)s; SIGKILL: ended after (\d+)s \(exit code 137\)", k.stdout)
    assert m, k.stdout
    sigint, sigterm, sigkill = (int(x) for x in m.groups())
    assert 1 <= sigint and sigint + 1 <= sigterm <= sigkill, k.stdout
    j = gp.jobs(inv)[job]
    assert (j["state"], j["exit_code"], j["last_line"]) == ("killed (SIGKILL)", 137, "TERM ignored")
    again = gp.ok("-H", inv, "kill", job)
    assert again.stdout.strip() == f"{Path(inv).stem}: job {job} was not running"


@pytest.mark.parametrize("launcher", ["setsid", "tmux"])
def test_a_job_sees_sigint_whatever_started_it(trained: harness.HostInfo, gp: Gp,
                                               launcher: str) -> None:
    """`kill`'s first signal (and a preemption's) is SIGINT: a Python job raises
    KeyboardInterrupt and saves. The setsid launcher starts the supervisor in the background,
    where bash starts it with SIGINT ignored: the job must not inherit that."""
    inv = trained.inventory
    code = ("import signal, time\n"
            "print('handler', signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)\n"
            "try:\n    while True: time.sleep(0.1)\n"
            "except KeyboardInterrupt:\n    print('saved on SIGINT', flush=True)\n")
    job = gp.start(inv, "--name", f"int-{launcher}", "--launcher", launcher, "--", "python", "-c", code)
    wait_for(lambda: "handler" in gp.ok("-H", inv, "logs", job, "--all").stdout, "it never started")
    assert "handler True" in gp.ok("-H", inv, "logs", job, "--all").stdout
    k = gp.ok("-H", inv, "kill", job, "--grace", "5")
    assert f"job {job}: SIGINT: ended after" in k.stdout, k.stdout
    assert "saved on SIGINT" in gp.ok("-H", inv, "logs", job, "--all").stdout
