"""Jobs, without a host: the spec, the state rules, torchrun and the rendezvous from captured
facts, the rendered host scripts (the NCCL path's exact commands), the reader's position and
the watch alerts."""

from __future__ import annotations

import csv
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from provision.errors import ProvisionError
from provision.facts.host import Disk
from provision.jobs import remote
from provision.jobs.distributed import Node, nproc_for, rendezvous, torchrun_argv
from provision.jobs.monitor import GpuSample, Monitor, Sample, parse_gpu_rows, parse_sample
from provision.jobs.reader import Position, Reader, load
from provision.jobs.spec import (
    JobSpec,
    check_ref,
    command_after_dashes,
    command_of,
    default_name,
    new_id,
    parse_gpus,
)
from provision.jobs.state import JobState, parse_records
from provision.remote.runtime import MARKER, follow_script
from tests.cases import captured

FIX = Path(__file__).resolve().parent.parent / "fixtures"
HOSTILE = ("; rm -rf /", "it's", "a b", "x\ny", "$(reboot)", "`id`", "--flag=\"q\"")


# -- the spec ----------------------------------------------------------------------------------

def test_gpus_names_and_ids() -> None:
    assert parse_gpus(None) is None and parse_gpus("all") is None
    assert parse_gpus("0,1, 3") == (0, 1, 3)
    for bad in ("0,x", "1;2", "0,0", "-1"):
        with pytest.raises(ProvisionError, match="--gpus"):
            parse_gpus(bad)
    assert default_name(["python", "train.py", "--lr", "1e-3"]) == "train"
    assert default_name(["bash", "scripts/run all.sh"]) == "run-all"
    assert default_name(["/opt/bin/./"]) == "job" and default_name(["torchrun", "x"]) == "torchrun"
    assert new_id("train", at=0).startswith("train-") and len(new_id("train")) == len("train-1201-143055")
    assert check_ref("train-1201-143055") == "train-1201-143055"
    with pytest.raises(ProvisionError, match="is not a job id or name"):
        check_ref("../etc")


def test_the_command_after_dashes_else_the_recipes_job() -> None:
    assert command_of(["python", "x.py"], ["python", "y.py"], "r") == ("python", "x.py")
    assert command_of([], ["python", "y.py"], "r") == ("python", "y.py")
    with pytest.raises(ProvisionError, match="set job: \\[python, train.py\\] in recipe 'pytorch'"):
        command_of([], [], "pytorch")
    assert command_after_dashes(["gp", "-H", "h", "run", "--", "python", "-c", "x", "--", "y"]) == \
        ("python", "-c", "x", "--", "y")
    assert command_after_dashes(["gp", "-H", "h", "run"]) == ()


def test_a_spec_refuses_what_cannot_run() -> None:
    with pytest.raises(ProvisionError, match="a job needs a command"):
        JobSpec("j", "j", ())
    with pytest.raises(ProvisionError, match="NUL"):
        JobSpec("j", "j", ("a\x00b",))
    with pytest.raises(ProvisionError, match="'A-B' is not an environment variable name"):
        JobSpec("j", "j", ("x",), env={"A-B": "1"})


# -- the state rules ---------------------------------------------------------------------------

BOOT, OTHER_BOOT = "b0000000-0000-0000-0000-000000000001", "b0000000-0000-0000-0000-000000000002"


def record(job: str, *lines: str, spec: dict | None = None) -> str:
    s = json.dumps(spec or {"name": job.rsplit("-", 2)[0], "argv": ["python", "t.py"], "rank": 0,
                            "nnodes": 1})
    return "\n".join([f"job {job}", f"spec {s}", "started 1000", f"boot {BOOT}",
                      "launcher setsid", *lines, "log 120 /root/.gpu-provision/jobs/x/log",
                      "last step 9 loss 0.1", "end"])


def states(*records: str, apps: str = "") -> dict[str, JobState]:
    text = "\n".join(["now 2000", f"host-boot {BOOT}", *([apps] if apps else []), *records])
    return {j.id: j for j in parse_records(text, "box").jobs}


def test_states_by_their_rules() -> None:
    got = states(
        record("run-1", "gpus 0,1", "wrapper 10 alive", "pid 11"),
        record("ok-1", "wrapper 20 dead", "pid 21", 'exit {"rc": 0, "ended": 1500}'),
        record("bad-1", "wrapper 30 dead", "pid 31", 'exit {"rc": 3, "ended": 1500}'),
        record("oom-1", "wrapper 40 dead", "pid 41", 'exit {"rc": 137, "ended": 1500}',
               "oom [ 1234.5] Memory cgroup out of memory: Killed process 41 (python3)"),
        record("sigkill-1", "wrapper 50 dead", "pid 51", 'exit {"rc": 137, "ended": 1500}'),
        record("killed-1", "wrapper 60 dead", "pid 61", 'exit {"rc": 143, "ended": 1500}',
               "killed SIGTERM 1490"),
        record("caught-1", "wrapper 65 dead", "pid 66", 'exit {"rc": 0, "ended": 1500}',
               "killed SIGINT 1490"),
        record("lost-1", "wrapper 70 dead", "pid 71").replace(f"boot {BOOT}", f"boot {OTHER_BOOT}"),
        record("gone-1", "wrapper 80 dead", "pid 81"),
        record("oomw-1", "wrapper 90 dead", "pid 91", "oom Out of memory: Killed process 90 (bash)"),
    )
    labels = {k: v.label for k, v in got.items()}
    assert labels == {
        "run-1": "running", "ok-1": "exited 0", "bad-1": "exited 3", "oom-1": "killed by OOM",
        "sigkill-1": "exited 137 (SIGKILL)", "killed-1": "killed (SIGTERM)", "caught-1": "exited 0",
        "lost-1": "lost in a reboot",
        "gone-1": "ended without an exit code (its supervisor was killed)",
        "oomw-1": "killed by OOM"}
    assert got["run-1"].duration(2000) == 1000 and got["ok-1"].duration(2000) == 500
    assert got["run-1"].gpus == (0, 1) and got["ok-1"].last_line == "step 9 loss 0.1"
    assert {k for k, v in got.items() if v.failed} == {"bad-1", "oom-1", "sigkill-1", "lost-1",
                                                      "gone-1", "oomw-1"}
    assert got["oom-1"].as_json(2000)["evidence"].endswith("Killed process 41 (python3)")


def test_gpu_memory_goes_to_the_job_whose_processes_hold_it() -> None:
    # torchrun (pid 11) and its workers, in sessions of their own (torch's elastic agent starts
    # them so), on two GPUs; another tenant's process on a third
    apps = "\n".join(["app 300 18330 300 300 11 10 1", "app 301 18100 301 301 11 10 1",
                      "app 999 2000 999 999 1"])
    got = states(record("run-1", "gpus 0,1", "wrapper 10 alive", "pid 11"),
                 record("ok-1", "wrapper 20 dead", "pid 21", 'exit {"rc": 0, "ended": 1500}'),
                 apps=apps)
    assert got["run-1"].gpu_memory_mib == 36430 and got["ok-1"].gpu_memory_mib is None


# -- torchrun and the rendezvous, from captured facts ------------------------------------------

NET = {"net_addrs": (FIX / "net" / "ip-o-addr-show-build-machine.txt").read_text(),
       "net_route": (FIX / "net" / "proc-net-route-build-machine.txt").read_text()}


def test_torchrun_argv_passes_the_command_through() -> None:
    argv = torchrun_argv(["python", "train.py", *HOSTILE], nnodes=2, node_rank=1, nproc_per_node=8,
                         master_addr="10.0.0.5", master_port=29500)
    assert argv == ("torchrun", "--nnodes=2", "--node-rank=1", "--nproc-per-node=8",
                    "--master-addr=10.0.0.5", "--master-port=29500", "train.py", *HOSTILE)
    assert torchrun_argv(["-m", "pkg.train"], nnodes=2, node_rank=0, nproc_per_node=1,
                         master_addr="a", master_port=1)[-2:] == ("-m", "pkg.train")
    assert "--no-python" in torchrun_argv(["./run.sh"], nnodes=2, node_rank=0, nproc_per_node=1,
                                           master_addr="a", master_port=1)
    with pytest.raises(ProvisionError, match="run adds torchrun"):
        torchrun_argv(["torchrun", "x.py"], nnodes=2, node_rank=0, nproc_per_node=1,
                      master_addr="a", master_port=1)


def test_rendezvous_where_the_laptops_address_lies_on_an_interface() -> None:
    """Sandbox hosts (and servers on one LAN): the first host's address is on its network."""
    f = captured("cpu-only", NET)
    r = rendezvous([Node("a", "127.0.0.10", f), Node("b", "127.0.0.11", f)], 29611)
    assert (r.addr, r.port, r.ifnames) == ("127.0.0.10", 29611, ("lo", "lo"))
    assert r.reason == "a's address lies on its interface lo"
    assert r.env(1) == {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}


def test_rendezvous_behind_nat_uses_the_default_routes_address() -> None:
    """A rental reached through a forwarded port: its private address, on the default route."""
    f = captured("cpu-only", NET)
    r = rendezvous([Node("a", "203.0.113.7", f), Node("b", "203.0.113.8", f)])
    assert (r.addr, r.port, r.ifnames) == ("192.0.2.2", 29500, ("eth0", "eth0"))
    assert "203.0.113.7 is not on any of its interfaces: NAT or a forwarded port" in r.reason
    assert rendezvous([Node("a", "x", f)], addr="10.9.9.9").reason == "--master-addr"
    bare = captured("cpu-only", {"net_addrs": {"rc": 127, "out": "bash: line 1: ip: command not "
                                               "found"}, "net_route": ""})  # nothing to choose from
    with pytest.raises(ProvisionError, match="give one the other hosts reach with --master-addr"):
        rendezvous([Node("a", "203.0.113.7", bare)])


def test_processes_per_node() -> None:
    gpu = captured("ubuntu-22.04-rtx4090")
    assert nproc_for(gpu, None, None) == 8 and nproc_for(gpu, (0, 1), None) == 2
    assert nproc_for(captured("cpu-only"), None, None) == 1 and nproc_for(gpu, None, 3) == 3


# -- the rendered host scripts -----------------------------------------------------------------

def bash_ok(script: str) -> None:
    r = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert r.returncode == 0, r.stderr


def test_nccl_job_renders_exactly() -> None:
    """The NCCL path on GPU hosts, as rendered: torchrun with its rank and rendezvous, the
    interface and the validation fix exported, every word of the command quoted once."""
    argv = torchrun_argv(["train.py", *HOSTILE], nnodes=2, node_rank=1, nproc_per_node=8,
                         master_addr="10.0.0.5", master_port=29500)
    spec = JobSpec("train-1201-143055", "train", argv, gpus=(0, 1, 2, 3, 4, 5, 6, 7),
                   env={"NCCL_P2P_DISABLE": "1", "NCCL_SOCKET_IFNAME": "ib0",
                        "GLOO_SOCKET_IFNAME": "ib0"}, data_dirs=("/root/autodl-tmp",),
                   rank=1, nnodes=2, hosts=("a", "b"))
    wrapper = remote.wrapper_script(spec)
    assert ("export NCCL_P2P_DISABLE=1\nexport NCCL_SOCKET_IFNAME=ib0\n"
            "export GLOO_SOCKET_IFNAME=ib0\n"
            "argv=( torchrun --nnodes=2 --node-rank=1 --nproc-per-node=8 --master-addr=10.0.0.5 "
            "--master-port=29500 train.py '; rm -rf /' 'it'\"'\"'s' 'a b' 'x\ny' '$(reboot)' '`id`' "
            "'--flag=\"q\"' )\n") in wrapper
    launch = remote.launch_script(spec)
    assert "gpus=0,1,2,3,4,5,6,7\n" in launch and "for d in /root/autodl-tmp; do" in launch
    assert "cmd0=torchrun\n" in launch
    bash_ok(launch)
    bash_ok(wrapper)


def test_every_job_script_is_bash() -> None:
    spec = JobSpec("t-1", "t", ("python", *HOSTILE), workdir="~/my runs")
    for script in (remote.launch_script(spec), remote.launch_script(replace(spec, share=True)),
                   remote.list_script(), remote.kill_script("t", 10),
                   follow_script("logs", remote.where_script("t'1", "t-1", True), 10, 3),
                   remote.sampler_script(2, 0, ("/workspace", "~/data dir"))):
        bash_ok(script)
    assert "home_path wd '~/my runs'" in remote.launch_script(spec)


def test_the_lister_reads_a_job_folder_here(tmp_path: Path) -> None:
    """The lister's own bash on a job folder as a supervisor leaves it (no host needed: it only
    reads): each line it prints reaches the parser."""
    jd = tmp_path / ".gpu-provision" / "jobs" / "t-1"
    jd.mkdir(parents=True)
    (jd / "spec.json").write_text(JobSpec("t-1", "t", ("python", "it's.py")).spec_json() + "\n")
    for name, text in (("name", "t"), ("started", "1000"), ("boot", BOOT), ("gpus", "0"),
                       ("launcher", "setsid"), ("wrapper", "999999999"), ("pid", "999999998"),
                       ("exit.json", '{"rc": 2, "ended": 1010}')):
        (jd / name).write_text(text + "\n")
    (jd / "log").write_text("epoch 1\n\r  \nTraceback ...\nValueError: loss is nan\n")
    r = subprocess.run(["bash", "-c", remote.list_script()], capture_output=True, text=True,
                       env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    [job] = parse_records(r.stdout, "here").jobs
    assert (job.id, job.label, job.argv, job.gpus) == ("t-1", "exited 2", ("python", "it's.py"), (0,))
    assert (job.last_line, job.log_size, job.duration(0)) == ("ValueError: loss is nan", 50, 10.0)


# -- the reader's position ---------------------------------------------------------------------

def test_reader_counts_lines_and_keeps_its_place(tmp_path: Path) -> None:
    printed: list[str] = []
    path = tmp_path / "t.pos"
    r = Reader(path, Position("t-1", 100, 2), printed.append)
    r.on_line(f"{remote.JOB_HEADER}t-1")
    for line in ("a", "", "b"):
        r.on_line(line)
    assert printed == ["a", "", "b"] and load(path) == Position("t-1", 100, 5)
    r.on_line("")  # the blank the result line brings: held back, then dropped
    r.on_line(f'{MARKER} {{"exit": 0, "size": 180, "result": null}}')
    r.finished(180, ended=False)
    assert printed == ["a", "", "b"] and load(path) == Position("t-1", 180, 0)
    # another job of that name: the count starts again (the host restarts it from 0 too)
    r2 = Reader(path, load(path), printed.append)
    r2.on_line(f"{remote.JOB_HEADER}t-2")
    r2.on_line("x")
    assert load(path) == Position("t-2", 0, 1)
    r2.finished(2, ended=True)
    assert not path.exists()


# -- watch -------------------------------------------------------------------------------------

def captured_row(name: str) -> str:
    """The sampler's fields of a captured --query-gpu row, as nvidia-smi prints them nounits."""
    rows = list(csv.reader((FIX / "nvidia-smi" / name).open(), skipinitialspace=True))
    head, row = rows[0], rows[1]
    fields = ("timestamp", "count", "index", "utilization.gpu [%]", "memory.used [MiB]",
              "memory.total [MiB]", "temperature.gpu", "power.draw [W]", "power.limit [W]",
              "clocks.current.sm [MHz]", "clocks.max.sm [MHz]", "clocks_event_reasons.active")
    return ", ".join(row[head.index(f)].split(" ")[0] if "[" in f else row[head.index(f)]
                     for f in fields)


def test_gpu_rows_from_a_captured_h100() -> None:
    [g] = parse_gpu_rows(captured_row("query-gpu-full-h100-80gb-hbm3-590.48.01.csv"))
    assert g == GpuSample(0, 0.0, 0.0, 81559.0, 41.0, 69.85, 700.0, 345.0, 1980.0, 0x1)
    assert g.reason_names == ("idle",) and g.throttled == ()
    assert parse_gpu_rows("2026/07/03 22:10:46.109, 1, 0, [N/A], 0, 1, 2, 3, 4, 5, 6, [N/A]")[0] \
        .utilization_pct is None


def sample(t: float, util: float, *, jobs: tuple[JobState, ...] = (), used: float = 1000,
           reasons: int = 0, disk_free: float = 100.0) -> Sample:
    g = GpuSample(0, util, used, 24564, 60, 300, 450, 2520, 2520, reasons)
    return Sample("box", t, BOOT, (g,), jobs, (Disk("/root", "/", disk_free, 200.0),), 64, 60)


def job(state: str = "running", **kw: object) -> JobState:
    return JobState(**{"host": "box", "id": "train-1", "name": "train", "argv": ("x",),
                       "state": state, "gpus": (0,), "started": 0.0, **kw})  # type: ignore[arg-type]


def test_alerts() -> None:
    m = Monitor(idle_minutes=10)
    m.update(sample(0, 50, jobs=(job(),)))
    m.update(sample(60, 0, jobs=(job(),)))
    assert m.alerts("box") == []
    m.update(sample(660, 0, jobs=(job(hit="RuntimeError: CUDA out of memory. Tried to allocate"),),
                    used=24000, reasons=0x40, disk_free=4.0))
    assert [(a.level, a.text) for a in m.alerts("box")] == [
        ("warning", "job train-1: GPU 0 at 0% for 10 min while it runs"),
        ("error", "job train-1 log: RuntimeError: CUDA out of memory. Tried to allocate"),
        ("warning", "GPU 0 memory 23.4/24.0 GiB (98%)"),
        ("warning", "GPU 0 throttled: HW thermal slowdown (SM 2520 of 2520 MHz, 60 C, 300/450 W)"),
        ("warning", "disk /root 98% used (4.0 GB free of 200.0)")]
    m.update(sample(662, 0, jobs=(job("exited", exit_code=1, ended=661.0),)))
    assert ("error", "job train-1 exited 1") in [(a.level, a.text) for a in m.alerts("box")]


def test_a_watch_that_starts_late_announces_recent_ends_only() -> None:
    m = Monitor()
    m.update(sample(10_000, 0, jobs=(job("exited", exit_code=0, ended=9_900.0, id="new"),
                                     job("exited", exit_code=1, ended=1_000.0, id="old"))))
    assert [a.text for a in m.alerts("box")] == ["job new exited 0"]


def test_sampler_line_parses_and_garbage_does_not_raise() -> None:
    line = json.dumps({"t": 2000, "boot": BOOT,
                       "gpus": captured_row("query-gpu-full-h200-590.48.01.csv"),
                       "jobs": record("run-1", "wrapper 10 alive", "pid 11"),
                       "disk": "/root\t/dev/vda1 263174212 182000000 77745724 71% /",
                       "mem": "MemTotal:       24609000 kB\nMemAvailable:   23000000 kB"})
    s = parse_sample(line, "box")
    assert s is not None and s.gpus[0].memory_total_mib == 143771.0
    assert [j.label for j in s.jobs] == ["running"] and s.disks[0].free_gb == 74.1
    assert parse_sample("not json", "box") is None and parse_sample("[1]", "box") is None


def test_in_a_limited_container_memory_is_the_cgroups() -> None:
    """/proc/meminfo shows the machine's 23.5 GB; the cgroup allows 2 GiB and holds 1.95 GiB
    (after its inactive file cache): the sample says 2 GB, and the alert names the limit."""
    line = json.dumps({"t": 2000, "boot": BOOT, "gpus": "", "jobs": "", "disk": "",
                       "mem": "MemTotal:       24609000 kB\nMemAvailable:   23000000 kB",
                       "cgmem": f"{2 * 1024**3} {int(2.05 * 1024**3)} {int(0.1 * 1024**3)}"})
    s = parse_sample(line, "box")
    assert s is not None and s.limited and (s.usable_gb, s.free_gb) == (2.0, 0.1)
    m = Monitor()
    m.update(s)
    assert [a.text for a in m.alerts("box")] == [
        "memory 1.9/2 GB used (the cgroup's limit: past it the kernel kills the job)"]
    assert m.as_json(["box"])["hosts"][0]["memory"] == {
        "total_gb": 2.0, "available_gb": 0.1, "limit_gb": 2.0, "machine_gb": 23.5}
    unlimited = line.replace(f"{2 * 1024**3} ", "9223372036854771712 ")
    s2 = parse_sample(unlimited, "box")
    assert s2 is not None and not s2.limited and s2.usable_gb == 23.5
