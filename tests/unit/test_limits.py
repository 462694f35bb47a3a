"""What a job may use, from captured cgroup files, df and ulimit outputs (tests/fixtures/limits/):
the parsers, and the one judgement validate and doctor show."""

from __future__ import annotations

from pathlib import Path

from provision.facts.limits import Limits, judge, parse_cgroup, parse_limits

FX = Path(__file__).resolve().parent.parent / "fixtures" / "limits"



V1_MEM = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
V1_QUOTA, V1_PERIOD = "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"


def lines(*pairs: tuple[str, str]) -> str:
    return "\n".join(f"{path} {(FX / name).read_text().strip()}" for path, name in pairs)


def test_cgroup_v1_limit_and_quota() -> None:
    text = lines((V1_MEM, "v1-memory.limit_in_bytes-8G.txt"),
                 (V1_QUOTA, "v1-cpu.cfs_quota_us-4cpus.txt"),
                 (V1_PERIOD, "v1-cpu.cfs_period_us.txt"))
    assert parse_cgroup(text) == (8.0, 4.0)


def test_cgroup_v1_without_limits() -> None:
    text = lines((V1_MEM, "v1-memory.limit_in_bytes-unlimited.txt"),
                 (V1_PERIOD, "v1-cpu.cfs_period_us.txt")) + f"\n{V1_QUOTA} -1"
    assert parse_cgroup(text) == (None, None)


def test_cgroup_v2_inside_a_limited_container() -> None:
    text = lines(("/sys/fs/cgroup/memory.max", "v2-memory.max-nerdctl-memory42m.txt"),
                 ("/sys/fs/cgroup/cpu.max", "v2-cpu.max-nerdctl-cpus0.42.txt"))
    assert parse_cgroup(text) == (0.04, 0.42)
    none = lines(("/sys/fs/cgroup/memory.max", "v2-memory.max-no-limit.txt"),
                 ("/sys/fs/cgroup/cpu.max", "v2-cpu.max-no-quota.txt"))
    assert parse_cgroup(none) == (None, None)


def test_the_smallest_of_nested_levels_holds() -> None:
    text = lines(("/sys/fs/cgroup/memory.max", "v2-memory.max-no-limit.txt"),
                 ("/sys/fs/cgroup/docker/abc/memory.max", "v2-memory.max-nerdctl-memory42m.txt"))
    assert parse_cgroup(text)[0] == 0.04


def docker_like() -> Limits:
    return parse_limits(
        lines((V1_MEM, "v1-memory.limit_in_bytes-8G.txt"), (V1_QUOTA, "v1-cpu.cfs_quota_us-4cpus.txt"),
              (V1_PERIOD, "v1-cpu.cfs_period_us.txt")),
        (FX / "df-Pk-tmpfs-64m.txt").read_text(), (FX / "ulimit-Sn-Hn-1024-20000.txt").read_text(),
        "/data\t" + (FX / "df-Pi-tmpfs-inodes-nearly-full.txt").read_text().splitlines()[1])


def test_a_docker_container_with_its_defaults_is_judged_with_the_container_fix() -> None:
    lim = docker_like()
    assert (lim.shm_mb, lim.open_files, lim.open_files_hard) == (64.0, 1024, 20000)
    assert lim.inodes == (("/data", 8, 2000),)
    found = judge(lim, memory_gb=251.5, cpu_cores=64, container=True)
    assert [f.severity for f in found] == ["info", "info", "warn", "warn", "warn"]
    assert found[0].line == ("a job can use 8.0 GB of memory (the cgroup's limit), not the 251.5 "
                             "GB /proc/meminfo shows")
    assert found[1].line.startswith("a job gets 4 CPU cores (the cgroup's quota), not the 64")
    assert found[2].line == ("/dev/shm is 64 MB: DataLoader workers die with \"Bus error\" and "
                             "NCCL's shared-memory transport fails; fix: start the container "
                             "with --shm-size=16g (or --ipc=host); where the provider starts it, "
                             "pick an instance or template with a larger /dev/shm. Until then "
                             "DataLoader(num_workers=0) and NCCL_SHM_DISABLE=1 avoid it")
    assert "`ulimit -n 20000` in the job's shell (the hard limit allows it)" in found[3].line
    assert "/data has 8 inodes free of 2000" in found[4].line


def test_a_vm_gets_the_fix_a_vm_has() -> None:
    lim = parse_limits("", (FX / "df-Pk-tmpfs-64m.txt").read_text(),
                       (FX / "ulimit-Sn-Hn-1024-1024.txt").read_text(), "")
    found = judge(lim, memory_gb=64, cpu_cores=16, container=False)
    assert [f.text.split(":")[0] for f in found] == ["/dev/shm is 64 MB",
                                                     "the open-files limit is 1024"]
    assert found[0].fix.startswith("as root: mount -o remount,size=16G /dev/shm")
    assert "/etc/security/limits.conf" in found[1].fix


def test_a_host_without_limits_has_no_finding() -> None:
    lim = parse_limits(lines((V1_MEM, "v1-memory.limit_in_bytes-unlimited.txt")),
                       "Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                       "tmpfs 24731184 0 24731184 0% /dev/shm", "20000\n20000",
                       "/root\t/dev/vda 16777216 553992 16223224 4% /")
    assert judge(lim, memory_gb=23.6, cpu_cores=2, container=True) == []


def test_doctor_shows_the_same_judgement_and_the_unreadable_gpu() -> None:
    """doctor's findings come from the same judge(): a Docker-like 64 MB /dev/shm on a captured
    container's facts, and a GPU whose compute capability nvidia-smi answers as ERR!."""
    from provision.doctor.match import diagnose
    from tests.cases import captured
    shm = (FX / "df-Pk-tmpfs-64m.txt").read_text()
    facts = captured("autodl", {"shm": shm, "nofile": "1048576\n1048576"})
    found = {d.id: d for d in diagnose({}, facts=facts)}
    assert found["host-limits"].diagnosis.startswith("/dev/shm is 64 MB: DataLoader workers die")
    assert "--shm-size=16g" in found["host-limits"].fix
    h200 = captured("h200", {"smi_query": (
        "index, name, driver_version, memory.total [MiB], memory.used [MiB], compute_cap, "
        "utilization.gpu [%], pci.bus_id, uuid\n0, NVIDIA H200, 590.48.01, 143771 MiB, 0 MiB, "
        "ERR!, 0 %, 00000000:83:00.0, GPU-00000000-0000-0000-0000-000000000000")})
    assert h200.gpus[0].compute_cap == "9.0"  # the model's, so nothing downstream trips on it
    err = {d.id: d for d in diagnose({}, facts=h200)}["gpu-cc-unreadable"]
    assert err.diagnosis.startswith("GPU 0: nvidia-smi answers its compute capability as ERR!")
    assert "Xid 79" in err.diagnosis and "\n" not in err.diagnosis


def test_torch_outside_conda_is_found_with_its_interpreter() -> None:
    """What the image_torch probe prints for a torch/version.py (the captured 2.2.1+cu121 one)
    in the system pythons' dist-packages (Debian's unversioned one is /usr/bin/python3's, here
    3.12), a source-built /usr/local python's site-packages, a venv; the first torch on an
    interpreter's path hides the next, and a venv whose python is gone is no Python at all."""
    from provision.facts.images import parse_image_torches, parse_view
    version_py = (FX.parent / "torch/version-py-2.2.1-cu121.txt").read_text()
    tv = " ".join(ln.replace("'", "").replace(" ", "") for ln in version_py.splitlines()
                  if ln.startswith(("__version__", "cuda")))  # as the probe's grep and tr do
    bins = ["/usr/bin/python3|python3.12", "/usr/bin/python3.10|", "/usr/bin/python3.12|",
            "/usr/local/bin/python3.11|", "/workspace/venv/bin/python|"]
    text = "\n".join([*(f"bin|{b}" for b in bins), *(f"torch|{p}|{tv}" for p in (
        # in the probe's order, which is Debian's sys.path order
        "/usr/local/lib/python3.10/dist-packages/torch/version.py",
        "/usr/local/lib/python3.12/dist-packages/torch/version.py",
        "/usr/lib/python3/dist-packages/torch/version.py",
        "/usr/local/lib/python3.11/site-packages/torch/version.py",
        "/workspace/venv/lib/python3.11/site-packages/torch/version.py",
        "/venv/lib/python3.11/site-packages/torch/version.py"))])
    found = parse_image_torches(text)
    assert [(t.kind, t.python_bin, t.python, t.torch, t.torch_cuda) for t in found] == [
        ("system", "/usr/bin/python3.10", "3.10", "2.2.1+cu121", "12.1"),
        ("system", "/usr/bin/python3.12", "3.12", "2.2.1+cu121", "12.1"),
        ("system", "/usr/local/bin/python3.11", "3.11", "2.2.1+cu121", "12.1"),
        ("venv", "/workspace/venv/bin/python", "3.11", "2.2.1+cu121", "12.1")]
    assert found[1].path == "/usr/local/lib/python3.12/dist-packages/torch/version.py"
    # Debian's own python3 package of torch alone: /usr/bin/python3's version
    alone = parse_image_torches("bin|/usr/bin/python3|python3.12\nbin|/usr/bin/python3.12|\n"
                                f"torch|/usr/lib/python3/dist-packages/torch/version.py|{tv}")
    assert [(t.python_bin, t.python) for t in alone] == [("/usr/bin/python3.12", "3.12")]
    # our venv over one of them: its pyvenv.cfg as Python 3.10's venv writes it (no executable)
    assert parse_view("view|home = /usr/bin\nview|include-system-site-packages = true\n"
                      "view|version = 3.10.12") == "/usr/bin/python3.10"
    assert parse_view("") is None


def test_a_known_platform_gets_its_own_words_for_the_fix() -> None:
    """vast.ai's /dev/shm is set in the template's Docker options (recipes/platforms/vast.yaml);
    doctor names it on a host detected as vast.ai, the generic container fix elsewhere."""
    from dataclasses import replace

    from provision.doctor.checks import limit_findings
    from tests.cases import captured
    facts = captured("autodl", {"shm": (FX / "df-Pk-tmpfs-64m.txt").read_text(),
                                "nofile": "1048576\n1048576"})
    shm = next(f for f in limit_findings(replace(facts, platform="vast")) if "/dev/shm" in f.text)
    assert shm.fix == ("add --shm-size=32gb to the Docker options of your template (vast.ai's "
                       "template configuration) and start a new instance from it. Until then "
                       "DataLoader(num_workers=0) and NCCL_SHM_DISABLE=1 avoid it")
    other = next(f for f in limit_findings(replace(facts, platform="runpod"))
                 if "/dev/shm" in f.text)
    assert other.fix.startswith("start the container with --shm-size=16g")


def test_a_busy_gpu_is_named_by_index_with_the_free_ones() -> None:
    """A captured 8x H200 (tests/fixtures/nvidia-smi/*-8xh200-after.csv): four GPUs held by
    processes that nvidia-smi places by GPU UUID (one whose name it cannot read), two with a few
    hundred MiB of someone's context left (below the busy mark); doctor names each busy GPU by
    index and the free ones to run on."""
    from provision.doctor.match import diagnose
    from provision.facts.nvidia import parse_compute_apps
    from tests.cases import captured
    smi = FX.parent / "nvidia-smi"
    apps = (smi / "query-compute-apps-gpu_uuid-pid-name-mem-8xh200-after.csv").read_text()
    noheader = "\n".join(apps.splitlines()[1:])  # as the facts ask for it
    facts = captured("h200", {
        "smi_query": (smi / "query-gpu-index-uuid-memused-memtotal-util-8xh200-after.csv").read_text(),
        "smi_apps": noheader})
    procs = parse_compute_apps(noheader)
    assert [(p.pid, p.gpu_uuid[:12] if p.gpu_uuid else None) for p in procs][-1] == \
        (1758887, "GPU-28780eb0")
    busy = {d.id: d for d in diagnose({}, facts=facts)}["gpu-busy"]
    assert busy.diagnosis == (
        "The GPU is already in use before your job: GPU 0: 127.0 GB held by pid 1328667 "
        "(/usr/local/bin/python3.10), 100% busy; GPU 1: 127.0 GB held by pid 1328668 "
        "(/usr/local/bin/python3.10), 100% busy; GPU 3: 126.9 GB held by pid 1328669 "
        "(/usr/local/bin/python3.10), 100% busy; GPU 7: 56.7 GB held by pid 1758887 "
        "([Not Found]), 0% busy; GPUs 2, 4-6 are free: run with --gpus 2,4,5,6. A shared or "
        "dirty instance gives you less than you pay for.")
    assert "--query-compute-apps=gpu_uuid,pid,process_name,used_memory" in busy.fix


def test_a_disk_quota_is_judged_like_free_disk() -> None:
    """``quota -u wp`` at its limit (tests/fixtures/limits/quota-u-wp-at-limit-linux2.2.txt:
    10 KiB allowed, 4 used on /dev/hda6): the data path on that file system is named, the
    recipe's free-disk minimum counts what the quota leaves, and no quota is no finding."""
    from dataclasses import replace

    from provision.config.minimums import shortfalls
    from provision.doctor.checks import limit_findings
    from provision.facts.host import Disk
    from provision.facts.limits import parse_quota
    from provision.ops.validate import host_resources
    from tests.cases import captured
    text = (FX / "quota-u-wp-at-limit-linux2.2.txt").read_text()
    assert parse_quota(text) == (("/dev/hda6", 4, 10),)
    assert parse_quota("") == ()  # quota not installed, or no quota set: it prints nothing
    facts = captured("autodl", {"quota": text})
    facts = replace(facts, disks=(Disk("/data", "/data", 900.0, 1000.0, "/dev/hda6"),))
    [q] = [f for f in limit_findings(facts) if "quota" in f.text]
    assert q.line.startswith("your disk quota on /dev/hda6 (/data) allows 0.0 GB and 0.0 GB are "
                             "used: 0.0 GB left, whatever df shows free; fix: remove what is not "
                             "needed")
    assert shortfalls({"min_free_disk_gb": 10}, host_resources(facts), "the recipe") == [
        "free disk /data: 0.0 GB free of 1000.0 GB, the recipe wants 10 GB "
        "(validation.min_free_disk_gb)"]
    assert not [f for f in limit_findings(captured("autodl", {"quota": ""})) if "quota" in f.text]


def test_an_oom_in_a_limited_container_names_the_cgroups_memory() -> None:
    """doctor's out-of-memory diagnoses say what a job could use: the cgroup's 8 GiB (captured
    v1 file), not the machine's RAM the facts' /proc/meminfo shows."""
    from provision.doctor.context import HostView
    from tests.cases import captured
    facts = captured("h200", {"cgroup": lines((V1_MEM, "v1-memory.limit_in_bytes-8G.txt"))})
    assert facts.memory_gb > 8
    view = HostView("box", facts)
    assert view.memory_gb == 8.0
    assert view.ram_text() == "; a job here can use 8 GB of RAM (the cgroup's limit)"
    plain = HostView("box", captured("h200", {}))
    assert plain.ram_text() == f"; this host has {plain.memory_gb:g} GB of RAM"
