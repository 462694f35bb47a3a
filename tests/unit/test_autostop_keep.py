"""autostop without a host: where a --save may land before each platform's action (and what is
refused, with what to say instead), the host-side check of that storage and the copy, run as
real bash on this machine's own mounts, whose preemption notice is read, what --status and cost
say of a stop that did not fire, and the notify script's message with the pushed values
masked."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from provision.config.recipes import all_platforms
from provision.errors import ProvisionError, UsageError
from provision.money import autostop, cost, notify
from provision.money.status import state_text
from provision.remote.command import quote
from provision.remote.templating import render

PLATFORMS = {p.name: p for p in all_platforms()}

# platform, flags, the folder the host must show as a kept mount (None: no check), or the
# refusal's words
KEEPS = [
    ("runpod", {"save": "/root/ckpt"}, "/workspace"),
    ("runpod", {"action": "terminate", "save": "/root/ckpt"}, "/workspace"),
    ("runpod", {"save": "/root/ckpt", "save_to": "/root/keep"},
     "error:its stop keeps /workspace (the volume disk, or a network volume): a separate mount "
     "at /workspace; a copy anywhere else is deleted with the rest"),
    ("lambda", {"action": "terminate", "save": "/home/ubuntu/ckpt",
                "save_to": "/lambda/nfs/fs1/runs"}, "/lambda/nfs/fs1/runs"),
    ("lambda", {"action": "terminate", "save": "/home/ubuntu/ckpt", "save_to": "/home/ubuntu/fs1"},
     "/home/ubuntu/fs1"),  # an older image's mount point: the host checks it is really one
    ("lambda", {"action": "terminate", "save": "/home/ubuntu/ckpt", "save_to": "/root/backup"},
     "error:its terminate keeps attached filesystems only: a separate mount at /lambda/nfs/*"),
    ("vast", {"action": "terminate", "save": "/root/ckpt", "save_to": "/data"}, "/data"),
    ("autodl", {"save": "~/autodl-tmp/ckpt"}, "/root/autodl-fs"),  # only when really mounted
    ("autodl", {"save": "~/autodl-tmp/ckpt", "save_to": "/mnt/mine"}, None),  # loses nothing
    ("generic-vm", {"save": "/data/ckpt"}, None),
]


@pytest.mark.parametrize("platform,flags,keep", KEEPS,
                         ids=[f"{k[0]}-{'-'.join(k[1].values())}" for k in KEEPS])
def test_where_a_save_may_land(platform: str, flags: dict[str, str], keep: str | None) -> None:
    req = autostop.Request(**flags)  # type: ignore[arg-type]
    if keep and keep.startswith("error:"):
        with pytest.raises(ProvisionError) as err:
            autostop.decide(PLATFORMS[platform], req, "/root")
        assert keep[6:] in str(err.value) and "\n" not in str(err.value)
        return
    d = autostop.decide(PLATFORMS[platform], req, "/root")
    assert d.keep_base == keep


def test_every_data_losing_action_names_what_it_keeps() -> None:
    """A stop that deletes data either names the mounts it keeps, or refuses every --save."""
    for p in all_platforms():
        for name, a in p.autostop.actions.items():
            if a.refused or a.deletes == "nothing":
                continue
            assert a.keeps_paths, (p.name, name)
    runpod = PLATFORMS["runpod"].autostop.actions["terminate"]
    assert runpod.keeps_env == "RUNPOD_VOLUME_ID"  # the network volume, only when attached


@pytest.mark.parametrize("bad,match", [
    ({"wait_for": "ssh"}, "--wait-for 'ssh': one of jobs_and_ssh, jobs, gpu"),
    ({"preemption": "oracle"}, "--preemption 'oracle': one of auto, aws, gcp, azure, off"),
    ({"hook": " "}, "--hook ' ': a command"),
    ({"metadata": "169.254.169.254/x"}, "--metadata-address '169.254.169.254/x': HOST or "
                                        "HOST:PORT"),
    ({"max_spend": 5.0}, "max_spend: 5.0: needs price_per_hour:")])
def test_bad_new_requests(bad: dict[str, object], match: str) -> None:
    with pytest.raises(UsageError) as err:
        autostop.validate(autostop.Request(**bad))  # type: ignore[arg-type]
    assert match in str(err.value)


def test_action_none_stops_nothing_and_still_watches() -> None:
    d = autostop.decide(PLATFORMS["generic-vm"], autostop.Request(action="none"), "/root")
    assert d.action == "none" and not d.loses_data and not d.spec.command
    azure = {"dmi": {"chassis_asset_tag": "7783-7084-3265-9085-8269-3286-77"}, "gpu_ok": True,
             "life_cycle": "spot"}
    # a shutdown on an Azure Spot VM is refused (billing); --action none is not, and watches
    shut = autostop.decide(PLATFORMS["generic-vm"], autostop.Request(), "/root")
    with pytest.raises(ProvisionError, match="--action none still watches for the preemption"):
        autostop.check_probe(shut, PLATFORMS["generic-vm"], azure, "box")
    watched = autostop.check_probe(d, PLATFORMS["generic-vm"], azure, "box")
    assert watched.preempt == "azure"


@pytest.mark.parametrize("asked,seen,kind", [
    ("auto", {"sys_vendor": "Amazon EC2", "life_cycle": "spot"}, "aws"),
    ("auto", {"sys_vendor": "Amazon EC2", "life_cycle": "on-demand"}, ""),
    ("auto", {"product_name": "Google Compute Engine", "life_cycle": "spot"}, "gcp"),
    ("auto", {"chassis_asset_tag": "7783-7084-3265-9085-8269-3286-77", "life_cycle": "spot"},
     "azure"),
    ("auto", {"sys_vendor": "QEMU", "life_cycle": "spot"}, ""),
    ("off", {"sys_vendor": "Amazon EC2", "life_cycle": "spot"}, ""),
    ("gcp", {}, "gcp")])  # asked for: a container on a Spot VM shows no DMI of its own
def test_whose_preemption_notice_is_read(asked: str, seen: dict[str, str], kind: str) -> None:
    assert autostop.preempt_kind(asked, seen) == kind


def _keep_script(base: str, paths: list[str], fstypes: list[str] = (),  # type: ignore[assignment]
                 env: str = "") -> str:
    head = "".join([
        "set -u\nst=$HOME/.x; INJECTED=0; ACTION=terminate; KEEPS='the network volume'\n",
        f"KEEP_ENV={quote(env)}\nKEEP_PATHS=({' '.join(quote(p) for p in paths)})\n",
        f"KEEP_FSTYPES=({' '.join(quote(f) for f in fstypes)})\n"])
    return head + render("money/_env.sh.j2") + render("money/_save.sh.j2") + (
        f"if keep_check {quote(base)}; then echo \"kept $keep_mnt $keep_fst\"; "
        "else echo \"no: $keep_why\"; fi\n")


def _bash(script: str, home: Path) -> str:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          env={**os.environ, "HOME": str(home)}).stdout.strip()


def test_the_host_check_of_the_kept_storage_on_this_machines_mounts(tmp_path: Path) -> None:
    # a folder on the root's own device is never kept
    out = _bash(_keep_script(str(tmp_path), ["/*"]), tmp_path)
    assert out.startswith(f"no: {tmp_path} is not a separate volume here (it is on the disk "
                          "the terminate deletes)"), out
    # a volume that is not mounted: refused, and its folder is never created
    out = _bash(_keep_script(str(tmp_path / "nfs" / "fs1"), ["/*"]), tmp_path)
    assert "does not exist (the volume is not mounted?)" in out
    assert not (tmp_path / "nfs").exists()
    if Path("/dev/shm").is_dir():  # a tmpfs is the machine's own, whatever its path
        out = _bash(_keep_script("/dev/shm", ["/*"]), tmp_path)
        assert "a tmpfs filesystem: the machine's own" in out, out
    proc = Path("/proc/sys")
    # a separate mount of another type: kept where its mount point and type are listed
    out = _bash(_keep_script(str(proc), ["/proc"]), tmp_path)
    assert out.startswith("no: /proc/sys is on /proc, a proc filesystem"), out
    # a separate mount of a type that is not the machine's own (this machine's first such)
    mnt, fst = _other_mount()
    pat = mnt.rsplit("/", 1)[0] + "/*"
    assert _bash(_keep_script(mnt, [pat]), tmp_path) == f"kept {mnt} {fst}"
    out = _bash(_keep_script(mnt, ["/lambda/nfs/*"]), tmp_path)
    assert "which is not storage the terminate keeps (/lambda/nfs/*: the network volume)" in out
    out = _bash(_keep_script(mnt, [pat], ["nfs", "nfs4"]), tmp_path)
    assert f"a {fst} filesystem; the terminate keeps only nfs nfs4 ones" in out
    out = _bash(_keep_script(mnt, [pat], env="GP_TEST_VOLUME_ID"), tmp_path)
    assert "GP_TEST_VOLUME_ID is not set on this machine" in out


OWN = {"overlay", "tmpfs", "ramfs", "devtmpfs", "proc", "sysfs", "squashfs", "aufs"}


def _other_mount() -> tuple[str, str]:
    """A mounted folder here that is not on the root's device nor of a machine-own type
    (/dev/pts, /dev/mqueue, a cgroup hierarchy: every Linux has one)."""
    out = subprocess.run(["findmnt", "-rn", "-o", "TARGET,FSTYPE"], capture_output=True,
                         text=True).stdout
    root = os.stat("/").st_dev
    for line in out.splitlines():
        target, _, fstype = line.partition(" ")
        if target != "/" and fstype not in OWN and "\\" not in target and \
                os.path.isdir(target) and os.stat(target).st_dev != root:
            return target, fstype
    raise AssertionError(f"no separate mount on this machine: {out}")


def test_the_copy_follows_links_and_is_checked(tmp_path: Path) -> None:
    src = tmp_path / "scratch" / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "ep1.pt").write_bytes(os.urandom(5000))
    (tmp_path / "outside").write_text("opt\n")
    (src / "sub" / "optim.pt").symlink_to(tmp_path / "outside")
    (tmp_path / "ckpt").symlink_to(src)
    dest = tmp_path / "vol" / "saved"
    (tmp_path / "vol").mkdir()
    st = tmp_path / "state"
    st.mkdir()
    script = "".join([
        f"set -u\ndir={quote(str(st))}; log=$dir/log; note() {{ echo \"$*\" >> \"$log\"; }}\n",
        f"SAVE={quote(str(tmp_path / 'ckpt'))}; SAVE_TO={quote(str(dest))}; SAVE_TIMEOUT=60\n",
        "SAVE_RATE=''; KEEP_BASE=''; KEEP_DEV=''; ACTION=stop\n",
        render("money/_save.sh.j2"),
        "save_copy && echo \"ok $save_done\" || echo \"no: $save_why\"\n"])
    out = _bash(script, tmp_path)
    assert out.startswith("ok 2 files, 5004 bytes, each checked (size and sha256)"), out
    assert not (dest / "ckpt").is_symlink() and not (dest / "ckpt/sub/optim.pt").is_symlink()
    assert (dest / "ckpt/sub/optim.pt").read_text() == "opt\n"
    assert (dest / "ckpt/ep1.pt").read_bytes() == (src / "ep1.pt").read_bytes()
    # a dangling link inside: the copy fails, and says so (the stop is then held)
    (src / "latest").symlink_to(tmp_path / "gone")
    assert _bash(script, tmp_path).startswith("no: the copy of ")
    (src / "latest").unlink()
    os.unlink(tmp_path / "ckpt")
    assert _bash(script, tmp_path) == f"no: {tmp_path / 'ckpt'} does not exist"


def test_status_and_cost_say_why_it_did_not_fire() -> None:
    st = {"pid": 3, "idle_for": 5, "busy": "", "held": "t: /root/ckpt does not exist",
          "last_failure": "t: /root/ckpt does not exist"}
    assert state_text(st, True, {"idle_text": "30m"}) == (
        "running (pid 3): idle for 5s of 30m; did not fire: t: /root/ckpt does not exist")
    assert state_text({**st, "phase": "saving /root/ckpt"}, True, {}).startswith(
        "running (pid 3): saving /root/ckpt, still sampling; did not fire: ")
    assert state_text({"preempted": "t: GCP preemption"}, True, {}) == \
        "preemption notice: t: GCP preemption (SIGINT sent to our jobs)"
    p = cost.Probe(now=1_000_000.0, btime=900_000.0, pid1_start=990_000.0, boot_id="b",
                   journal_first=None, journal_last=None, jobs=(), jobs_last=None, gpus=None,
                   autostop_alive=True, autostop_config={"idle": 60, "idle_text": "1m",
                                                        "action": "stop"},
                   autostop_state=st)
    assert "; did not fire: t: /root/ckpt does not exist" in cost.row("b", 1.0, "USD",
                                                                      p)["autostop_text"]


def test_a_failing_gpu_check_is_not_idle_in_cost() -> None:
    p = cost.Probe(now=1_000_000.0, btime=900_000.0, pid1_start=990_000.0, boot_id="b",
                   journal_first=None, journal_last=None, jobs=(), jobs_last=None, gpus=None,
                   autostop_alive=False, gpu_error="nvidia-smi: Failed to initialize NVML")
    row = cost.row("box", 2.0, "USD", p)
    assert row["idle_seconds"] is None and row["warnings"] == []
    assert row["idle_text"] == "not known: the GPU check fails (nvidia-smi: Failed to " \
        "initialize NVML)"
    # with a watchdog set, its thresholds judge the GPUs (not cost's own 5% and 512 MiB)
    q = cost.Probe(now=1_000_000.0, btime=900_000.0, pid1_start=990_000.0, boot_id="b",
                   journal_first=None, journal_last=None, jobs=(), jobs_last=None,
                   gpus=((30, 3),), autostop_alive=True,
                   autostop_config={"util_max": 50, "mem_max_mib": 512},
                   autostop_state={"busy": ""})
    assert cost.busy_now(q) is None and cost.busy_now(q, 5, 512) == "GPU 0 is 30% busy"


def test_notify_carries_the_job_and_masks_pushed_values(tmp_path: Path) -> None:
    st = tmp_path / ".gpu-provision"
    jd = st / "jobs" / "train-1"
    jd.mkdir(parents=True)
    (st / "env").write_text("export HF_TOKEN=hf_SECRETVALUE123\n")
    (jd / "name").write_text("train\n")
    (jd / "log").write_text("step 1 loss 2.0\nusing hf_SECRETVALUE123\nTraceback: boom\n")
    (jd / "exit.json").write_text('{"rc": 3, "ended": 1}\n')
    got = tmp_path / "got.txt"
    script = notify.script([f"command:cat > {quote(str(got))}; echo \"$GP_EVENT $GP_EXIT\" >> "
                            f"{quote(str(got))}"], "my-4090")
    (st / "notify.sh").write_text(script)
    subprocess.run(["bash", str(st / "notify.sh"), "job", "job train failed (exit 3)", "",
                    str(jd)], env={**os.environ, "HOME": str(tmp_path)}, check=True)
    text = got.read_text()
    assert text.startswith("my-4090 (") and "job train failed (exit 3)" in text
    assert "job train (train-1), exit 3" in text and "Traceback: boom" in text
    assert "hf_SECRETVALUE123" not in text and "using ***" in text
    assert text.rstrip().endswith("job 3")
    assert "target 1 (command: exit 0)" in (st / "notify.log").read_text()


def test_notify_masks_the_platforms_own_keys_too(tmp_path: Path) -> None:
    """Keys the platform put in the environment (RunPod's pod-scoped RUNPOD_API_KEY, vast.ai's
    CONTAINER_API_KEY), not pushed by us: a failed stop's answer that repeats one, or a job that
    prints its environment, must not carry it to the webhook."""
    st = tmp_path / ".gpu-provision"
    jd = st / "jobs" / "train-1"
    jd.mkdir(parents=True)
    (jd / "name").write_text("train\n")
    (jd / "log").write_text("CONTAINER_API_KEY=c0ffee0123456789abcdef\nstep 9\n")
    got = tmp_path / "got.txt"
    (st / "notify.sh").write_text(notify.script([f"command:cat > {quote(str(got))}"], "pod"))
    env = {**os.environ, "HOME": str(tmp_path), "RUNPOD_API_KEY": "rpa_ABCDEF0123456789XYZ",
           "CONTAINER_API_KEY": "c0ffee0123456789abcdef", "RUNPOD_POD_ID": "abc123xyz9"}
    subprocess.run(["bash", str(st / "notify.sh"), "autostop", "failed",
                    'stop: HTTP 401 {"error": "bad key rpa_ABCDEF0123456789XYZ"}', str(jd), "1"],
                   env=env, check=True)
    text = got.read_text()
    assert "rpa_ABCDEF0123456789XYZ" not in text and 'bad key ***"' in text
    assert "c0ffee0123456789abcdef" not in text and "CONTAINER_API_KEY=***" in text
    assert "step 9" in text  # the rest of the log's tail is kept


def test_notify_masks_a_key_that_spans_lines_and_leaves_short_words_alone(tmp_path: Path) -> None:
    st = tmp_path / ".gpu-provision"
    st.mkdir()
    pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
    got = tmp_path / "got.txt"
    (st / "notify.sh").write_text(notify.script([f"command:cat > {quote(str(got))}"], "pod"))
    env = {**os.environ, "HOME": str(tmp_path), "GCP_SA_KEY": pem, "JUPYTER_PASSWORD": "abc123",
           "AUTH_MODE": "true", "GOOGLE_APPLICATION_CREDENTIALS": "/root/sa.json"}
    text_in = ("the key: MIIEvQIBADANBgkqhkiG9w0BAQEFAASC in a log line; jupyter abc123; "
               "mode true; {braces} kept; creds at /root/sa.json")
    subprocess.run(["bash", str(st / "notify.sh"), "autostop", "failed", text_in], env=env,
                   check=True)
    text = got.read_text()
    assert "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" not in text and "the key: *** in a log" in text
    assert "abc123" not in text
    assert "mode true; {braces} kept; creds at /root/sa.json" in text


@pytest.mark.parametrize("bad", ["ftp://x", "mailto:nobody", "command:", "ntfy:topic"])
def test_bad_notify_targets(bad: str) -> None:
    with pytest.raises(ProvisionError, match="notify: "):
        notify.script([bad], "box")


def test_the_config_says_what_is_watched() -> None:
    req = autostop.Request(save="/root/ckpt", hook="git push", wait_for="jobs")
    d = autostop.decide(PLATFORMS["runpod"], req, "/root")
    cfg = autostop.config(d, req)
    assert (cfg["keep_base"], cfg["hook"], cfg["wait_for"]) == ("/workspace", "git push", "jobs")
    assert json.dumps(cfg)  # kept on the host as JSON
