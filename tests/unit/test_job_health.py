"""The GPUs' health through a job: the snapshot bash (templates/jobs/_health.sh.j2) run here on
the stand-in nvidia-smi and dmesg replaying captured hosts (tests/fixtures/validation/hosts), the
job folder read by the real lister, and what changed as `jobs`, `logs` and `watch` say it."""

from __future__ import annotations

import base64
import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

from provision.jobs import remote
from provision.jobs.health import diff, health_notes, job_health, parse_snapshot
from provision.jobs.monitor import Monitor, parse_sample
from provision.jobs.spec import JobSpec
from provision.jobs.state import parse_records
from provision.remote.templating import render
from tests.unit.gpu_payload import FAKE, FIXTURES, HOSTS

AKASH = FIXTURES / "errors" / "gpu-hardware" / "xid79-dmesg-T-akash-support-209.txt"


def snapshot(smi_dir: Path, tmp: Path) -> str:
    """health_snapshot's line on the host ``smi_dir`` replays (its nvidia-smi answers and
    dmesg.txt)."""
    script = render("jobs/_health.sh.j2") + "\nhealth_snapshot\n"
    env = {"PATH": f"{FAKE / 'bin'}:/usr/bin:/bin", "FAKE_SMI_DIR": str(smi_dir), "HOME": str(tmp)}
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _host_with_log(tmp: Path, name: str, log: str) -> Path:
    folder = tmp / name
    shutil.copytree(HOSTS / "h100-xid79-ours", folder)
    (folder / "dmesg.txt").write_text(log)
    return folder


def test_a_gpu_that_fell_off_the_bus_is_in_its_health(tmp_path: Path) -> None:
    """At the job's end the GPU is off the bus: nvidia-smi fails whole ("GPU is lost", as
    captured in marian-nmt#251, at this host's address), so the end lists no GPU; its Xid 79 is
    still the job's GPU's (by the start's address), and the GPU is said to be gone."""
    lines = AKASH.read_text().split("root@node1:~# dmesg -T | grep NVRM\n")[1].splitlines()
    before = _host_with_log(tmp_path, "before", lines[0] + "\n")
    after = _host_with_log(tmp_path, "after", "\n".join(lines) + "\n")
    lost = (FIXTURES / "nvidia-smi" / "fail-gpu-lost.txt").read_text()
    (after / "lost.txt").write_text(lost.replace("0000:03:00.0", "0000:A1:00.0"))
    s, e = parse_snapshot(snapshot(before, tmp_path)), parse_snapshot(snapshot(after, tmp_path))
    assert s is not None and e is not None and e.gpus == () and e.dmesg
    assert e.smi_rc == 15 and e.lost == ("0000:a1:00",)
    assert diff(s, e) == ["GPU 0: 1 new Xid 79 (fell off the bus; hardware) at 21:29",
                          "GPU 0: no longer answers nvidia-smi (lost: off the bus)"]


def _line(rows: list[str], rc: int, xid: str = "") -> str:
    """A snapshot line as health_snapshot prints it (index and PCI address fields only)."""
    b64 = lambda t: base64.b64encode(t.encode()).decode()  # noqa: E731
    return json.dumps({"t": 1000, "uptime": 500, "fields": "index,pci.bus_id",
                       "gpus": b64("\n".join(rows)), "smi_rc": rc, "dmesg": True, "xid": b64(xid)})


FOUR = [f"{i}, 00000000:{bus}:00.0" for i, bus in enumerate(("18", "2A", "3A", "5D"))]


def test_an_end_without_nvidia_smis_answer_is_unknown_not_gone() -> None:
    """nvidia-smi gives no rows at the job's end for a reason that is not a lost GPU (a timeout
    while the GPUs are deinitialised without persistence mode, a container that lost its
    devices): the GPUs' state then is unknown, said so, and none is called gone. Where it
    failed whole because one GPU is lost (exit 15, naming it), that one is gone and of the
    others nothing is known; where it still answers for the others, the lost one alone."""
    start = parse_snapshot(_line(FOUR, 0))
    timed_out, blocked = parse_snapshot(_line([], 124)), parse_snapshot(_line([], 17))
    assert diff(start, timed_out) == [
        "GPU 0, 1, 2, 3: state at the end unknown: nvidia-smi did not answer within 10 s"]
    assert diff(start, blocked) == ["GPU 0, 1, 2, 3: state at the end unknown: nvidia-smi was "
                                    "refused access to the GPUs (a container that lost its "
                                    "devices: restart it)"]
    whole = parse_snapshot(_line(["Unable to determine the device handle for GPU0000:3A:00.0: "
                                  "Unknown Error"], 15))
    assert diff(start, whole) == [
        "GPU 2: no longer answers nvidia-smi (lost: off the bus)",
        "GPU 0, 1, 3: state at the end unknown: nvidia-smi failed whole (exit 15: a GPU is lost)"]
    others = parse_snapshot(_line([FOUR[0], FOUR[1], FOUR[3]], 15))
    assert diff(start, others) == ["GPU 2: no longer answers nvidia-smi"]


def test_an_xid_79_during_the_job_is_in_its_health(tmp_path: Path) -> None:
    """Before the job the captured kernel log (akash-network/support#209) holds only the driver's
    load line; after it, the Xid 79 of this host's GPU (PCI 0000:a1:00)."""
    lines = AKASH.read_text().split("root@node1:~# dmesg -T | grep NVRM\n")[1].splitlines()
    before = _host_with_log(tmp_path, "before", lines[0] + "\n")
    after = _host_with_log(tmp_path, "after", "\n".join(lines) + "\n")
    start, end = snapshot(before, tmp_path), snapshot(after, tmp_path)
    s, e = parse_snapshot(start), parse_snapshot(end)
    assert s is not None and e is not None and s.dmesg and e.dmesg
    assert [g.bus for g in e.gpus] == ["00000000:A1:00.0"] and e.gpus[0].power_limit == 700.0
    assert diff(s, e) == ["GPU 0: 1 new Xid 79 (fell off the bus; hardware) at 21:29"]
    # the job folder as the supervisor leaves it, read by the real lister
    jd = tmp_path / "home" / ".gpu-provision" / "jobs" / "t-1"
    jd.mkdir(parents=True)
    (jd / "spec.json").write_text(JobSpec("t-1", "t", ("python", "train.py")).spec_json() + "\n")
    for name, text in (("name", "t"), ("started", "1000"), ("gpus", "0"), ("launcher", "setsid"),
                       ("wrapper", "999999999"), ("exit.json", '{"rc": 1, "ended": 1010}'),
                       ("health.start", start), ("health.end", end)):
        (jd / name).write_text(text + "\n")
    (jd / "log").write_text("step 1\n")
    env = {"HOME": str(tmp_path / "home"), "PATH": f"{FAKE / 'bin'}:/usr/bin:/bin",
           "FAKE_SMI_DIR": str(after)}
    r = subprocess.run(["bash", "-c", remote.list_script()], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    listed = parse_records(r.stdout, "box")
    [job] = listed.jobs
    assert job_health(job.health) == ["GPU 0: 1 new Xid 79 (fell off the bus; hardware) at 21:29"]
    assert health_notes([listed]) == {("box", "t-1"): ["GPU 0: 1 new Xid 79 (fell off the bus; "
                                                       "hardware) at 21:29"]}
    # `logs` asks for the one job's health
    r = subprocess.run(["bash", "-c", remote.health_script("t")], capture_output=True, text=True,
                       env=env, timeout=60)
    got = dict(line.partition(" ")[::2] for line in r.stdout.splitlines())
    assert job_health((got["health-start"], got["health-end"])) == job_health(job.health)


def test_a_power_limit_lowered_while_the_job_ran(tmp_path: Path) -> None:
    """The captured capped host at the end; at the start the same host with GPU 0 at 700 W."""
    before = tmp_path / "before"
    shutil.copytree(HOSTS / "4xh100-capped-power", before)
    rows = list(csv.reader((before / "query-gpu.csv").open(), skipinitialspace=True))
    at = rows[0].index("enforced.power.limit [W]")
    rows[1][at] = "700.00 W"
    with (before / "query-gpu.csv").open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    start = parse_snapshot(snapshot(before, tmp_path))
    end = parse_snapshot(snapshot(HOSTS / "4xh100-capped-power", tmp_path))
    assert start is not None and not start.dmesg  # no dmesg.txt: the kernel log is closed here
    assert diff(start, end) == ["GPU 0: power limit 700 -> 500 W during the job (below its default: "
                                "the host lowered it)"]


def test_a_running_job_is_judged_against_now(tmp_path: Path) -> None:
    lines = AKASH.read_text().split("root@node1:~# dmesg -T | grep NVRM\n")[1].splitlines()
    start = snapshot(_host_with_log(tmp_path, "a", lines[0] + "\n"), tmp_path)
    now = snapshot(_host_with_log(tmp_path, "b", "\n".join(lines) + "\n"), tmp_path)
    assert job_health((start, ""), now) == ["GPU 0: 1 new Xid 79 (fell off the bus; hardware) at 21:29"]
    assert job_health((start, ""), "") == []  # nothing to compare with


def test_watch_alerts_on_what_changed_since_it_began(tmp_path: Path) -> None:
    lines = AKASH.read_text().split("root@node1:~# dmesg -T | grep NVRM\n")[1].splitlines()
    first = json.loads(snapshot(_host_with_log(tmp_path, "a", lines[0] + "\n"), tmp_path))
    later = json.loads(snapshot(_host_with_log(tmp_path, "b", "\n".join(lines) + "\n"), tmp_path))
    m = Monitor()
    for t, h in ((100, first), (102, None), (130, later)):
        sample = parse_sample(json.dumps({"t": t, "boot": "b", "gpus": "", "health": h}), "box")
        assert sample is not None
        m.update(sample)
    alerts = [a.as_json() for a in m.alerts("box")]
    assert {"level": "error", "host": "box", "text": "since the watch began: GPU 0: 1 new Xid 79 (fell "
            "off the bus; hardware) at 21:29"} in alerts


def test_the_sampler_and_the_wrapper_record_health() -> None:
    sampler = remote.sampler_script(2, 0, ())
    assert "health_snapshot" in sampler and '"health": %s' in sampler
    wrapper = remote.wrapper_script(JobSpec("t-1", "t", ("python", "x.py")))
    assert wrapper.index('"$jd/health.start"') < wrapper.index('setsid "${argv[@]}"') < \
        wrapper.index('"$jd/health.end"') < wrapper.index('"$jd/exit.json"')
    for script in (sampler, wrapper, remote.health_script("t'1")):
        r = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        assert r.returncode == 0, r.stderr
    assert os.path.exists(FAKE / "bin" / "dmesg")


def test_the_time_a_gpu_was_held_down_during_the_job(tmp_path: Path) -> None:
    """nvidia-smi's clock-event counters (microseconds each reason held the clocks since the
    driver loaded) before and after: GPU 2 of four braked for 41 s of the job (its counter
    CONSTRUCTED on the captured H100 rows, whose counters read 0 us)."""
    import csv
    after = tmp_path / "after"
    shutil.copytree(HOSTS / "4xh100-one-brakes-together", after)
    rows = list(csv.reader((after / "query-gpu.csv").open(), skipinitialspace=True))
    col = [h.split(" [")[0] for h in rows[0]].index("clocks_event_reasons_counters.hw_power_brake_slowdown")
    rows[3][col] = "41234567 us"
    (after / "query-gpu.csv").write_text("\n".join(", ".join(r) for r in rows) + "\n")
    start = parse_snapshot(snapshot(HOSTS / "4xh100-one-brakes-together", tmp_path))
    end = parse_snapshot(snapshot(after, tmp_path))
    assert start is not None and dict(start.gpus[2].held_us)["hw_power_brake_slowdown"] == 0
    assert diff(start, end) == ["GPU 2: 41 s of hardware power brake, the power supply's signal "
                                "(hw_power_brake_slowdown) during the job"]
