"""A container that IS limited, by the kernel (tests/sandbox/limited.py): a cgroup of its own
with a 2 GiB memory limit and a 1.5-core CPU quota, Docker's default 64 MB /dev/shm as a real
tmpfs, an open-files limit of 1024; /proc/meminfo and nproc show the whole machine, as in any
container. The facts report the limits, not the machine; plan, validation, bench and watch judge
and show what the cgroup allows; validate and doctor name the small /dev/shm and the open-files
limit with the fix for a container, or in a known platform's own words."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox

PROFILE = "limited-container"
SHM = ("/dev/shm is 64 MB: DataLoader workers die with \"Bus error\" and NCCL's shared-memory "
       "transport fails")
NOFILE = "the open-files limit is 1024"


def ssh(info: harness.HostInfo, command: str) -> subprocess.CompletedProcess[str]:
    """A command as a login runs it: over SSH, so in the host's cgroup and with sshd's limits."""
    return subprocess.run(["ssh", "-i", info.key, "-p", str(info.port), "-o", "BatchMode=yes",
                           "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                           "-o", "LogLevel=ERROR", f"root@{info.host}", command],
                          capture_output=True, text=True, timeout=120)


def test_the_limits_are_real_and_the_facts_report_them(hosts: Hosts, gp_home: Path) -> None:
    info = hosts.get(PROFILE)
    # the kernel enforces each one: /dev/shm fills at 64 MiB, a 3 GiB allocation is killed
    shm = ssh(info, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=100; rm -f /dev/shm/fill")
    assert "No space left on device" in shm.stderr and "67108864 bytes" in shm.stderr
    hog = ssh(info, "python3 -c 'b = bytearray(3 * 2**30)'; echo exit $?")  # zero-filled: touched
    assert hog.stdout.split() == ["exit", "137"], hog  # SIGKILL from the cgroup's OOM killer
    assert ssh(info, "ulimit -n; ulimit -Hn").stdout.split() == ["1024", "1024"]

    f = facts_json(info, gp_home)
    assert f["memory_gb"] > 4  # /proc/meminfo: the machine's
    assert f["limits"]["memory_limit_gb"] == 2.0
    assert f["limits"]["cpu_quota"] == 1.5
    assert (f["limits"]["shm_mb"], f["limits"]["open_files"], f["limits"]["open_files_hard"]) \
        == (64.0, 1024, 1024)
    shown = gpu_provision("-H", info.inventory, "facts", home=gp_home)
    assert "a job gets 2 GB and 1.5 cores (the cgroup's limit)" in shown.stdout


def test_doctor_names_the_limits_with_the_fix_for_this_platform(hosts: Hosts,
                                                                gp_home: Path) -> None:
    info = hosts.get(PROFILE)
    r = gpu_provision("-H", info.inventory, "doctor", "--json", home=gp_home)
    found = {d["id"]: d for d in json.loads(r.stdout)}
    warn = found["host-limits"]
    assert warn["diagnosis"].startswith(f"{SHM}; {NOFILE}")
    assert "start the container with --shm-size=16g (or --ipc=host)" in warn["fix"]
    assert "--ulimit nofile=65536:65536" in warn["fix"]  # the hard limit is 1024 too
    assert found["host-limits-info"]["diagnosis"].startswith(
        "a job can use 2.0 GB of memory (the cgroup's limit), not the ")
    # the same container on vast.ai (its marker file): vast.ai's own words for /dev/shm
    harness.in_host(info, "sh", "-c", "echo C.12345 > /etc/vast_containerlabel")
    try:
        r = gpu_provision("-H", info.inventory, "doctor", "--json", home=gp_home)
        warn = {d["id"]: d for d in json.loads(r.stdout)}["host-limits"]
        assert warn["fix"].startswith("add --shm-size=32gb to the Docker options of your template "
                                      "(vast.ai's template configuration) and start a new "
                                      "instance from it.")
    finally:
        harness.in_host(info, "rm", "-f", "/etc/vast_containerlabel")


def test_the_recipe_minimums_and_validation_use_the_cgroups_limit(hosts: Hosts, gp_home: Path,
                                                                 tmp_path: Path) -> None:
    info = hosts.get(PROFILE)
    plan = gpu_provision("-H", info.inventory, "plan", "--json", home=gp_home)
    risks = json.loads(plan.stdout)["risks"]
    assert "memory: 2.0 GB (the cgroup's limit), recipe pytorch wants at least 8 GB " \
           "(validation.min_memory_gb)" in risks
    assert "cpu cores: 1.5 (the cgroup's CPU quota), recipe pytorch wants at least 2 " \
           "(validation.min_cpu_cores)" in risks

    r = gpu_provision("-H", info.inventory, "bootstrap", home=gp_home, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict: WARN" in r.stdout
    assert f"{info.id}: warning: {SHM}; fix: start the container with --shm-size=16g" in r.stdout
    v = gpu_provision("-H", info.inventory, "validate", "--json", home=gp_home, cwd=tmp_path)
    out = json.loads(v.stdout)
    checks = {c["name"]: c for c in out["validation"]["checks"]}
    assert checks["memory"] == {"name": "memory", "status": "warn", "reason":
                                "2.0 GB (the cgroup's limit), the recipe wants at least 8 GB"}
    host = out["validation"]["measurements"]["host"]
    assert (host["memory_gb"], host["memory_limit_gb"], host["cpu_quota"]) == (2.0, 2.0, 1.5)
    assert [x["text"] for x in out["limits"] if x["severity"] == "warn"] == [
        SHM, f"{NOFILE}: DataLoader workers and many-file datasets run out (\"Too many open "
             "files\")"]


def test_bench_and_watch_show_what_the_cgroup_allows(hosts: Hosts, gp_home: Path,
                                                     tmp_path: Path) -> None:
    info = hosts.get(PROFILE)
    r = gpu_provision("-H", info.inventory, "bench", "--download-mb", "0", "--json",
                      home=gp_home, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["cpu_cores"], report["cpu_quota"], report["host_memory_gb"],
            report["memory_limit_gb"]) == (1, 1.5, 2.0, 2.0)
    assert report["meminfo_gb"] > 4 and report["cpu_count"] >= 2

    # a job holding 1.93 GiB of the 2: watch warns that the limit, not the machine, is near
    ssh(info, "setsid python3 -c 'import os, time; b = bytearray(int(1.93 * 2**30)); "
              "open(\"/tmp/hog.pid\", \"w\").write(str(os.getpid())); time.sleep(60)' "
              ">/dev/null 2>&1 < /dev/null &")
    pid_file = info.path("/tmp/hog.pid")
    harness.wait_until(lambda: pid_file.exists() and pid_file.read_text(), "the job never held it")
    try:
        w = gpu_provision("-H", info.inventory, "watch", "--once", "--json", home=gp_home)
        view = json.loads(w.stdout)["hosts"][0]
        assert view["memory"]["total_gb"] == 2.0 and view["memory"]["limit_gb"] == 2.0
        assert view["memory"]["machine_gb"] > 4 and view["memory"]["available_gb"] <= 0.1
        # (1.93 GiB of the job and what the cgroup's other processes hold: 1.9 or 2.0 GB)
        warned = [a for a in view["alerts"] if a["level"] == "warning" and a["host"] == info.id
                  and re.fullmatch(r"memory (1\.9|2\.0)/2 GB used \(the cgroup's limit: past "
                                   r"it the kernel kills the job\)", a["text"])]
        assert warned, view["alerts"]
    finally:
        ssh(info, "kill $(cat /tmp/hog.pid); rm -f /tmp/hog.pid")  # that job alone
