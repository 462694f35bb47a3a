"""autostop and cost without a host: which action each platform gets and which are refused (with
what to say instead), the watchdog and its control script as bash with every value quoted, the
platform profiles' stop sections, and the cost and idle figures from a probe."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from provision.config.recipes import all_platforms, load_platform
from provision.errors import ConfigError, ProvisionError
from provision.money import autostop, cost
from provision.remote.command import quote

PLATFORMS = {p.name: p for p in all_platforms()}


@pytest.mark.parametrize("text,seconds", [("30m", 1800), ("5s", 5), ("1h30m", 5400),
                                          ("0.5s", 0.5), ("90", 90), ("2d", 172800)])
def test_durations(text: str, seconds: float) -> None:
    assert autostop.parse_duration(text, "--idle") == seconds


@pytest.mark.parametrize("text", ["", "soon", "5x", "1h and 2m", "-3s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ProvisionError, match=f"--idle {text!r}: not a duration"):
        autostop.parse_duration(text, "--idle")


@pytest.mark.parametrize("seconds,text", [(5, "5s"), (90, "90s"), (150, "2m30s"), (1800, "30m"),
                                          (3600, "1h"), (5400, "1h30m")])
def test_duration_text(seconds: int, text: str) -> None:
    assert autostop.duration_text(seconds) == text


DECISIONS = [
    # platform, flags, action run (or the refusal's words), what --save lands in
    ("generic-vm", {}, "shutdown -h now", None),
    ("generic-vm", {"save": "/data/ckpt"}, "shutdown -h now", None),  # the disk stays: no copy
    ("autodl", {"save": "~/autodl-tmp/ckpt"}, "/usr/bin/shutdown",
     "/root/autodl-fs/autostop-saved"),
    ("autodl", {"save": "/root/autodl-fs/ckpt"}, "/usr/bin/shutdown", "/root/autodl-fs"),
    ("autodl", {"action": "terminate"}, "error:releases ordinary instances from its console", None),
    ("vast", {}, "PUT https://console.vast.ai/api/v0/instances/{id}/", None),
    ("vast", {"action": "shutdown"}, "error:does not end its billing; use --action stop", None),
    ("vast", {"action": "terminate"}, "DELETE https://console.vast.ai/api/v0/instances/{id}/",
     None),
    ("runpod", {}, "error:Name what to keep with --save DIR", None),
    # REST API v1 is retired: v2's one action endpoint, and DELETE (runpod/docs migrate-from-v1)
    ("runpod", {"save": "/root/ckpt"}, "POST https://api.runpod.io/v2/pods/{id}/action",
     "/workspace/autostop-saved"),
    ("runpod", {"action": "terminate"}, "DELETE https://api.runpod.io/v2/pods/{id}", None),
    ("lambda", {}, "error:Say --action terminate to accept it", None),
    ("lambda", {"action": "stop"}, "error:cannot be stopped, only terminated", None),
    ("lambda", {"action": "terminate", "save": "/home/ubuntu/ckpt"},
     "error:give --save-to DIR (a network filesystem)", None),
    ("lambda", {"action": "terminate", "save": "/home/ubuntu/ckpt",
                "save_to": "/lambda/nfs/fs1"},
     "POST https://cloud.lambda.ai/api/v1/instance-operations/terminate",
     "/lambda/nfs/fs1/autostop-saved"),
    ("vast", {"action": "halt"}, "error:no --action halt (it has: stop, terminate)", None),
]


@pytest.mark.parametrize("platform,flags,action,saved", DECISIONS,
                         ids=[f"{d[0]}-{'-'.join(map(str, d[1].values())) or 'default'}"
                              for d in DECISIONS])
def test_what_each_platform_runs(platform: str, flags: dict[str, str], action: str,
                                 saved: str | None) -> None:
    req = autostop.Request(**flags)  # type: ignore[arg-type]
    if action.startswith("error:"):
        with pytest.raises(ProvisionError) as err:
            autostop.decide(PLATFORMS[platform], req, "/root")
        assert action[6:] in str(err.value) and "\n" not in str(err.value)
        return
    d = autostop.decide(PLATFORMS[platform], req, "/root")
    assert d.action_text == action and d.save_to == saved


def test_machines_sharing_a_volume_save_apart() -> None:
    """Two pods with the one network volume, each saving its ``ckpt``: each copy lands in a
    folder of its machine's name (made safe for a path), so neither overwrites the other."""
    req = autostop.Request(save="/root/ckpt")
    a, b = (autostop.decide(PLATFORMS["runpod"], req, "/root", machine=m).save_to
            for m in ("a1b2c3d4e5f6", "pod 7/x"))
    assert (a, b) == ("/workspace/autostop-saved/a1b2c3d4e5f6", "/workspace/autostop-saved/pod-7-x")


def test_relative_save_is_under_the_data_dir() -> None:
    d = autostop.decide(PLATFORMS["autodl"], autostop.Request(save="run1/ckpt"), "/root",
                        "/root/autodl-tmp")
    assert d.save == "/root/autodl-tmp/run1/ckpt"
    assert autostop.decide(PLATFORMS["autodl"], autostop.Request(save="ckpt"), "/root").save \
        == "/root/ckpt"


def test_never_a_silent_delete() -> None:
    """No platform's default action deletes data: those need --action terminate, said."""
    for p in all_platforms():
        default = p.autostop.actions[p.autostop.default or ""]
        if default.deletes == "everything":
            with pytest.raises(ProvisionError, match="--action terminate"):
                autostop.decide(p, autostop.Request(), "/root")
        for name, a in p.autostop.actions.items():
            assert a.refused or (a.command or a.request), (p.name, name)
            assert a.refused or a.keeps and a.bills, (p.name, name)  # said, for --status


@pytest.mark.parametrize("bad,match", [
    ({"idle": 0.5}, "--idle 0.5s: give at least a second"),
    ({"interval": 3600.0, "idle": 60.0}, "--interval 3600.0s: between 0.1s"),
    ({"after_job": "x; rm -rf /"}, "--after-job 'x; rm -rf /': not a job name"),
    ({"instance_id": "1/../2"}, "--instance-id '1/../2': not an instance id"),
    ({"util_max": 120}, "--gpu-util is a percentage")])
def test_bad_requests(bad: dict[str, object], match: str) -> None:
    with pytest.raises(ProvisionError, match=match.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        autostop.decide(PLATFORMS["vast"], autostop.Request(**bad), "/root")  # type: ignore[arg-type]


def bash_ok(script: str) -> bool:
    return subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_watchdog_and_control_render_for_every_action(platform: str) -> None:
    p = PLATFORMS[platform]
    hostile = "/root/my ckpt/$(touch pwned)'x"
    for name, spec in p.autostop.actions.items():
        if spec.refused:
            continue
        # --save-to: storage this action keeps, where it names any
        kept = (spec.keeps_paths[0].replace("*", "fs1") if spec.keeps_paths else "/mnt/fs")
        req = autostop.Request(action=name, save=hostile, save_to=kept,
                               after_job="train-1", instance_id="i-1")
        d = autostop.decide(p, req, "/root")
        script = autostop.watchdog_script(d, req, p)
        assert bash_ok(script)
        assert f"SAVE={quote(hostile)};" in script and "$(touch pwned)'x;" not in script
        ctl = autostop._ctl("install", command=list(spec.command), need_id=False,
                            id_env=list(p.autostop.instance_id_env),
                            key_env=list(p.autostop.api_key_env), key_hint=p.autostop.key_hint,
                            keep_base=kept, keep_paths=list(spec.keeps_paths), watchdog=script,
                            config=json.dumps(autostop.config(d, req)),
                            persistent=d.persistent or "", lookup_url="https://x/{id}",
                            instance_id="i-1", addresses=["10.0.0.1"],
                            rearm_file=p.autostop.rearm_file or "")
        assert bash_ok(ctl)
    for mode in ("cancel", "status", "probe"):
        assert bash_ok(autostop._ctl(mode, persist_dirs=autostop.persistent_dirs()))


def test_profiles_stop_section_errors_name_file_and_key(tmp_path: Path) -> None:
    folder = tmp_path / "recipes" / "platforms"
    folder.mkdir(parents=True)
    (folder / "mine.yaml").write_text("kind: container\nautostop:\n  stop:\n"
                                      "    request: PUT ftp://x/{id}\n")
    with pytest.raises(ConfigError, match=r"mine.yaml:4: autostop.stop.request: 'PUT ftp://x/\{id\}'"):
        load_platform("mine", tmp_path)
    (folder / "mine.yaml").write_text("autostop:\n  stop:\n    deletes: some\n")
    with pytest.raises(ConfigError, match="autostop.stop.deletes: 'some' must be one of"):
        load_platform("mine", tmp_path)


def probe(**kw: object) -> cost.Probe:
    base: dict[str, object] = dict(now=1_000_000.0, btime=900_000.0, pid1_start=990_000.0,
                                   boot_id="b", journal_first=992_000.0,
                                   journal_last=993_000.0, jobs=(), jobs_last=None,
                                   gpus=((0, 3),), autostop_alive=False)
    base.update(kw)
    return cost.Probe(**base)  # type: ignore[arg-type]


def test_cost_since_the_container_started_and_idle_since_the_last_work() -> None:
    p = probe()
    row = cost.row("box", 0.9, "USD", p)
    assert p.since == 990_000.0  # PID 1 (the container) started after the kernel booted
    assert row["hours"] == round(10_000 / 3600, 3) and row["cost"] == round(0.9 * 10_000 / 3600, 2)
    assert row["idle_seconds"] == 7000.0  # since our last step
    assert row["autostop_text"] == "not set: each idle hour costs 0.90 USD"
    assert row["warnings"] == ["box: idle for 1h56m with no autostop set: 1.75 USD paid for an "
                               "idle machine so far; `gpu-provision -H box autostop --idle 30m` "
                               "stops it next time"]
    busy = cost.row("box", 0.9, "USD", probe(gpus=((0, 20000),)))
    assert busy["busy"] == "GPU 0 holds 20000 MiB" and busy["warnings"] == []
    job = cost.row("box", None, None, probe(jobs=("train 42",)))
    assert job["busy"] == "job train runs" and job["cost"] is None


def test_cost_with_autostop_set() -> None:
    p = probe(autostop_alive=True, autostop_config={"idle": 1800, "idle_text": "30m",
                                                    "action": "stop", "bills": "the disk"},
              autostop_state={"idle_for": 600, "busy": "", "last_active": 999_400})
    row = cost.row("box", 2.0, "USD", p)
    assert row["autostop"] == {"set": True, "idle": 1800.0, "action": "stop", "stops_in": 1200.0,
                               "saves_per_hour": 2.0, "still_billed": "the disk"}
    assert row["autostop_text"] == "stop after 30m idle, in 20m; then saves 2.00 USD/h"
    assert row["warnings"] == []


def test_idle_warning_contract() -> None:
    assert cost.idle_warning("h", 100, False, 1.0, "USD") is None  # under the period
    assert cost.idle_warning("h", 4000, True, 1.0, "USD") is None  # autostop is set
    assert cost.idle_warning("h", None, False, 1.0, "USD") is None  # busy
    assert cost.idle_warning("h", 4000, False, None, None) == (
        "h: idle for 1h6m with no autostop set; `gpu-provision -H h autostop --idle 30m` stops "
        "it next time")


def test_idle_probe_prints_one_json_line(tmp_path: Path) -> None:
    (tmp_path / ".gpu-provision" / "jobs" / "train").mkdir(parents=True)
    (tmp_path / ".gpu-provision" / "jobs" / "train" / "pid").write_text(str(os.getpid()))
    r = subprocess.run(["bash", "-c", cost.idle_probe_script()], capture_output=True, text=True,
                       env={**os.environ, "HOME": str(tmp_path)})
    p = cost.parse_probe(r.stdout.strip())
    assert p.autostop_alive is False and p.since >= p.btime > 0
    # this test's process started before its pid file was written: a job of ours runs
    assert p.jobs == (f"train {os.getpid()}",)


# What each cloud's VMs show in DMI (the values cloud-init's ds-identify matches, and AWS's
# "Identify EC2 Linux instances"), and what a shutdown from inside does to the bill there
CLOUDS = [
    ({"chassis_asset_tag": "7783-7084-3265-9085-8269-3286-77",
      "sys_vendor": "Microsoft Corporation"}, "Azure", "only 'Stopped (deallocated)' ends them"),
    ({"product_name": "Alibaba Cloud ECS", "sys_vendor": "Alibaba Cloud"}, "Alibaba Cloud",
     "StopCharging"),
    ({"sys_vendor": "Tencent Cloud", "product_name": "CVM"}, "Tencent Cloud", "KEEP_CHARGING"),
    ({"sys_vendor": "DigitalOcean", "product_name": "Droplet"}, "DigitalOcean",
     "powered off are still billable"),
    ({"sys_vendor": "Amazon EC2", "product_name": "g5.xlarge", "life_cycle": "spot"}, "AWS",
     "one-time Spot instance is terminated when it shuts down"),
    ({"sys_vendor": "Hetzner", "product_name": "vServer"}, "Hetzner Cloud",
     "billed as long as it exists"),
    ({"sys_vendor": "Vultr"}, "Vultr", "billing continues unless the instance is deleted"),
    ({"sys_vendor": "Scaleway"}, "Scaleway", "powered on or in standby"),
]


@pytest.mark.parametrize("seen,cloud,why", CLOUDS, ids=[c[1] for c in CLOUDS])
def test_a_shutdown_that_leaves_the_vm_billed_or_deleted_is_refused(
        seen: dict[str, str], cloud: str, why: str) -> None:
    p = PLATFORMS["generic-vm"]
    req = autostop.Request()
    d = autostop.decide(p, req, "/root")
    probe = {"dmi": seen, "life_cycle": seen.get("life_cycle", ""), "gpu_ok": True}
    with pytest.raises(ProvisionError) as err:
        autostop.check_probe(d, p, probe, "box")
    assert str(err.value).startswith("box: autostop not set: ") and why in str(err.value)
    assert cloud in str(err.value) or cloud == "AWS"


def test_on_oracle_cloud_a_shutdown_is_set_and_no_saving_promised() -> None:
    p = PLATFORMS["generic-vm"]
    d = autostop.decide(p, autostop.Request(), "/root")
    oci = autostop.check_probe(d, p, {"dmi": {"chassis_asset_tag": "OracleCloud.com"},
                                      "gpu_ok": True}, "box")
    assert oci.billing_ends is None and any("is_billed_for_stopped_instance" in n
                                            for n in oci.notes)


def test_where_a_shutdown_ends_the_bill_cost_promises_the_saving_and_only_there() -> None:
    p = PLATFORMS["generic-vm"]
    d = autostop.decide(p, autostop.Request(), "/root")
    aws = autostop.check_probe(d, p, {"dmi": {"sys_vendor": "Amazon EC2"},
                                      "life_cycle": "on-demand", "gpu_ok": True}, "box")
    assert aws.billing_ends is True and any("AWS: an EBS-backed instance stops" in n
                                            for n in aws.notes)
    xen = autostop.check_probe(d, p, {"dmi": {}, "hypervisor_uuid": "ec2e1916-9099-7caf",
                                      "gpu_ok": True}, "box")  # Xen: /sys/hypervisor/uuid
    assert any("did not say whether this is a Spot instance" in n for n in xen.notes)
    unknown = autostop.check_probe(d, p, {"dmi": {"sys_vendor": "QEMU"}, "gpu_ok": False,
                                          "gpu_text": "nvidia-smi is not installed"}, "box")
    assert unknown.billing_ends is None  # a power-off ends the bill only if the provider says
    req = autostop.Request()
    state = {"idle_for": 0, "busy": "", "last_active": 999_000}
    for dec, text in ((aws, "; then saves 2.00 USD/h"),
                      (unknown, "; saves 2.00 USD/h only if the provider stops billing a "
                                "powered-off machine (not known here)")):
        p2 = probe(autostop_alive=True, autostop_config=autostop.config(dec, req),
                   autostop_state=state)
        r = cost.row("box", 2.0, "USD", p2)
        assert r["autostop_text"].endswith(text)
        assert r["autostop"]["saves_per_hour"] == (2.0 if dec is aws else None)


def test_a_failing_gpu_check_refuses_only_an_action_that_loses_data() -> None:
    broken = {"dmi": {}, "gpu_ok": False, "gpu_text": "nvidia-smi exit 18: Failed to "
              "initialize NVML: Driver/library version mismatch"}
    runpod = PLATFORMS["runpod"]
    d = autostop.decide(runpod, autostop.Request(save="/root/ckpt"), "/root")
    assert d.loses_data
    with pytest.raises(ProvisionError, match="the GPU check fails here .nvidia-smi exit 18"):
        autostop.check_probe(d, runpod, broken, "pod")
    vast = PLATFORMS["vast"]  # its stop keeps the whole disk: only jobs count then
    dv = autostop.decide(vast, autostop.Request(), "/root")
    # accepted; the watchdog is told the GPUs could not be seen at install
    assert not dv.loses_data and autostop.check_probe(dv, vast, broken, "box") == \
        dataclasses.replace(dv, gpu_seen=False)
    # the watchdog it renders counts the failing check as busy for the data-losing action only
    req = autostop.Request(save="/root/ckpt")
    assert "LOSES_DATA=1" in autostop.watchdog_script(d, req, runpod)
    assert "LOSES_DATA=0" in autostop.watchdog_script(dv, autostop.Request(), vast)


@pytest.mark.parametrize("state,alive,text", [
    ({"dead": "POST u answered HTTP 410 Gone: the platform retired this API"}, False,
     "stopped watching: POST u answered HTTP 410 Gone: the platform retired this API; run "
     "autostop again once that is fixed"),
    ({"gave_up": "3 stops were accepted and the machine kept running; last: x"}, False,
     "failed: 3 stops were accepted and the machine kept running; last: x"),
    ({"fired_at": 5, "result": "ran /usr/bin/shutdown (exit 0)"}, False,
     "fired: ran /usr/bin/shutdown (exit 0)"),
    ({"fired_at": 5, "stopping_since": 9, "result": "r", "pid": 3}, True,
     "stop sent (r), waiting for the machine to go down"),
    ({"pid": 3, "busy": "the GPU check fails: x"}, True, "running (pid 3): busy: the GPU check "
     "fails: x")])
def test_status_says_what_the_watchdog_did(state: dict[str, object], alive: bool,
                                           text: str) -> None:
    raw = {"set": True, "alive": alive, "state": {**state, "last_failure": "t: still running"},
           "config": {"idle_text": "30m"}, "supervisor": "setsid", "rearm": "/w/rearm.sh"}
    v = autostop.status_view("pod", raw, PLATFORMS["runpod"])
    assert v["state_text"] == text and v["last_failure"] == "t: still running"
    assert "put `bash /w/rearm.sh` before it" in v["reboot_text"]
    row = cost.row("pod", 1.0, "USD", probe(autostop_alive=alive, autostop_config={"idle": 60},
                                            autostop_state=raw["state"]))  # type: ignore[arg-type]
    assert row["autostop_text"].endswith("; last failure: t: still running")
    if state.get("dead") or state.get("gave_up"):
        assert any("autostop will not stop this machine" in w for w in row["warnings"])


def test_every_persistent_dir_is_searched_for_the_state() -> None:
    assert autostop.persistent_dirs() == ["/root/autodl-fs", "/workspace"]
