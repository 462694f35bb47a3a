"""autostop: an on-host watchdog that stops the rented machine when its GPUs sit idle, so an idle
GPU is never paid for, with the laptop asleep or gone.

The decision of what to run is made here, before anything is installed (``decide``, pure): the
platform profile's action (recipes/platforms/*.yaml ``autostop``), refused where it would delete
data the user did not explicitly give up (``--action terminate``), or where it would not end the
billing; what it keeps and still bills is shown. Then the host is asked (``probe``) what only it
can tell: whether nvidia-smi sees its GPUs (an action that loses data is refused where it cannot:
a broken driver would make a running job look idle) and, on a VM, which cloud it is (a shutdown
from inside does not end the bill everywhere: ``clouds.py``). On the host,
``templates/money/autostop_watchdog.sh.j2`` samples jobs and nvidia-smi, copies the named checkpoint
folder to the platform's persistent storage first, then calls the stop (an HTTPS request with the
platform's key, or a command) and checks that the machine really goes down.

Where it runs: a systemd unit where systemd is PID 1's init (installed through ``sudo -n`` for a
login that is not root; it comes back after a reboot, with its idle clock started anew);
elsewhere (containers: RunPod, vast.ai, AutoDL) a ``setsid`` process that outlives our SSH
sessions, started again at each container start where the platform runs a script of ours then
(vast.ai's onstart), else said by ``--status``. Its state lives on the persistent storage where
the platform has one, so that a pod resumed after a stop still tells what happened.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, replace
from typing import Any

from ..config.recipes import Platform, StopAction, all_platforms
from ..errors import ProvisionError, UsageError
from ..ops.layout import expand_home
from ..remote.contract import shown
from ..remote.executor import Executor
from ..remote.runtime import run_foreground
from ..remote.templating import render
from .clouds import DMI_NAMES, identify, shutdown_verdict
from .status import duration_text, lines, state_text, status_view

__all__ = ["duration_text", "state_text", "status_view"]  # for cost and the tasks

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
SAVE_TIMEOUT = 3600  # seconds the copy to persistent storage may take (SkyPilot's hook default)
HOOK_TIMEOUT = 300.0  # seconds --hook may take before the stop goes on without it
WAIT_FOR = ("jobs_and_ssh", "jobs", "gpu")  # SkyPilot's autostop wait_for names (and ours: gpu)
PREEMPTION = ("auto", "aws", "gcp", "azure", "off")
METADATA = "169.254.169.254"  # the instance metadata service of AWS, GCP and Azure alike
# a GPU, a process or a transfer this busy is busy (the defaults of --cpu-busy and --io-busy)
CPU_BUSY, IO_BUSY = 20, 1024  # % of one core; KiB/s read or written
SAVED = "autostop-saved"  # the folder under the persistent dir that receives --save
STOP_WAIT = 300.0  # seconds the machine has to go down after a stop was accepted
TRIES = 3  # stops tried (each after another idle period) before the watchdog gives up


def parse_duration(text: str, flag: str) -> float:
    """``30m``, ``5s``, ``1h30m``, ``0.5s``, ``90`` (seconds) -> seconds."""
    t = text.strip().lower()
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([smhd]?)", t)
    if not t or not parts or re.sub(r"(\d+(?:\.\d+)?)\s*([smhd]?)", "", t).strip():
        raise UsageError(f"{flag} {text!r}: not a duration; write e.g. 30m, 90s, 1h30m")
    return sum(float(n) * _UNITS[u] for n, u in parts)


@dataclass(frozen=True)
class Request:
    """What the user asked for (``autostop`` flags)."""

    idle: float = 1800.0  # seconds
    interval: float = 60.0
    after_job: str | None = None
    action: str | None = None  # None: the platform's default
    save: str | None = None  # a folder on the host to copy to persistent storage first
    save_to: str | None = None  # persistent storage, instead of the platform's
    instance_id: str | None = None
    util_max: int = 5  # % utilisation at or below which a GPU is idle
    mem_max_mib: int = 512  # memory used at or below which a GPU is idle
    stop_wait: float = STOP_WAIT  # the machine still up this long after the stop: it failed
    wait_for: str = "jobs_and_ssh"  # what counts as activity besides the GPUs (WAIT_FOR)
    hook: str | None = None  # a command run before any stop we trigger
    hook_timeout: float = HOOK_TIMEOUT
    save_rate: int = 0  # KiB/s the copy may move (rsync --bwlimit); 0: no limit
    cpu_busy: int = CPU_BUSY
    io_busy: int = IO_BUSY
    preemption: str = "auto"  # whose preemption notice to watch for (PREEMPTION)
    metadata: str = METADATA  # host[:port] of the instance metadata service
    max_spend: float | None = None  # the cap since the machine started (inventory max_spend:)
    price_per_hour: float | None = None  # the inventory's, for the cap
    after_queue: bool = False  # armed only once the host's job queue has run (and is empty)


@dataclass(frozen=True)
class Decision:
    """What the watchdog will do, decided before it is installed."""

    platform: str
    action: str
    spec: StopAction
    save: str | None  # absolute, or None
    save_to: str | None  # where --save lands (absolute), or None
    require_persistent: str | None  # must be a separate volume on the host (else refused)
    notes: tuple[str, ...]
    persistent: str | None = None  # where the state lives, if it is there on the host
    billing_ends: bool | None = True  # False/None: a saving `cost` must not promise
    keep_base: str | None = None  # the volume --save lands on, checked on the host (keep rule)
    preempt: str = ""  # whose preemption notice the watchdog reads: aws | gcp | azure | ""
    gpu_seen: bool = True  # nvidia-smi answered at install (else the GPUs cannot count)

    @property
    def action_text(self) -> str:
        if self.spec.command:
            return " ".join(self.spec.command)
        return self.spec.request or "-"

    @property
    def loses_data(self) -> bool:
        """The action deletes something (RunPod's stop clears the container disk; terminate):
        a GPU check that fails must then count as busy, never idle."""
        return self.spec.deletes != "nothing"


def validate(req: Request) -> None:
    """The flags' values, checked before connecting: a bad one is a usage error (exit 2)."""
    if req.idle < 1:
        raise UsageError(f"--idle {req.idle}s: give at least a second")
    if not 0.1 <= req.interval <= req.idle:
        raise UsageError(f"--interval {req.interval}s: between 0.1s and the idle period")
    if req.after_job is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}",
                                                      req.after_job):
        raise UsageError(f"--after-job {req.after_job!r}: not a job name")
    if req.instance_id is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,128}",
                                                        req.instance_id):
        raise UsageError(f"--instance-id {req.instance_id!r}: not an instance id")
    if not 0 <= req.util_max <= 100 or req.mem_max_mib < 0:
        raise UsageError("--gpu-util is a percentage (0..100) and --gpu-mem MiB (>= 0)")
    if not 1 <= req.stop_wait <= 86400:
        raise UsageError(f"--stop-wait {req.stop_wait}s: between 1s and a day")
    for flag, path in (("--save", req.save), ("--save-to", req.save_to)):
        if path is not None and (not path or "\n" in path or "\0" in path):
            raise UsageError(f"{flag} {path!r}: not a path")
    if req.wait_for not in WAIT_FOR:
        raise UsageError(f"--wait-for {req.wait_for!r}: one of {', '.join(WAIT_FOR)}")
    if req.preemption not in PREEMPTION:
        raise UsageError(f"--preemption {req.preemption!r}: one of {', '.join(PREEMPTION)}")
    if req.hook is not None and (not req.hook.strip() or "\0" in req.hook):
        raise UsageError(f"--hook {req.hook!r}: a command, e.g. 'git -C ~/code push'")
    if not 1 <= req.hook_timeout <= 86400:
        raise UsageError(f"--hook-timeout {req.hook_timeout}s: between 1s and a day")
    if req.save_rate < 0 or not 0 <= req.cpu_busy <= 10000 or req.io_busy < 0:
        raise UsageError("--save-rate and --io-busy are KiB/s (>= 0), --cpu-busy a percentage "
                         "of one core (0..10000)")
    if not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?", req.metadata):
        raise UsageError(f"--metadata-address {req.metadata!r}: HOST or HOST:PORT")
    if req.max_spend is not None and (req.max_spend <= 0 or not req.price_per_hour):
        raise UsageError(f"max_spend: {req.max_spend}: needs price_per_hour: in the inventory "
                         "(the cap is counted from it) and a positive amount")


NONE = StopAction(keeps="everything: nothing is stopped", loses="nothing", bills="everything, "
                  "as before", deletes="nothing")  # --action none: notices, hook, cap warnings


def decide(platform: Platform, req: Request, home: str, base: str | None = None,
           machine: str = "") -> Decision:
    """The action and what is saved first; raises ProvisionError (one line: what, why, and what
    to say instead) for an action that would delete data not given up explicitly, one that does
    not end the billing, one the platform cannot do, or a --save whose copy would land on
    storage the action deletes (each action's ``keeps_paths``: a copy is only kept on a separate
    mount there; the host checks the mount itself at install and again before the stop). A
    relative ``--save`` is under ``base`` (the data dir, as for sync), else the home. The copy
    goes to a folder of this ``machine`` (its host name) under the persistent storage: a network
    volume is often shared by several machines, each saving a ``ckpt`` of its own."""
    validate(req)
    prof = platform.autostop
    known = ", ".join(k for k, a in prof.actions.items() if not a.refused) or "none"
    name = req.action or prof.default
    if name is None:
        raise ProvisionError(f"platform {platform.name}: no stop action is known for it; its "
                             "profile (recipes/platforms) needs an autostop section")
    spec = NONE if name == "none" else prof.actions.get(name)
    if spec is None:
        raise ProvisionError(f"platform {platform.name}: no --action {name} (it has: {known}); "
                             "--action none stops nothing")
    if spec.refused:
        raise ProvisionError(f"platform {platform.name}: --action {name} refused: {spec.refused}")
    if spec.deletes == "everything" and req.action != "terminate":
        raise ProvisionError(
            f"platform {platform.name}: its {name} deletes the instance and everything on it "
            f"(keeps {spec.keeps or 'nothing'}); autostop never chooses that for you. Say "
            "--action terminate to accept it")
    persistent = expand_home(req.save_to or prof.persistent_dir or "", home) or None
    notes: list[str] = []
    save = _abs(req.save, home, base or home) if req.save else None
    if spec.deletes == "outside-persistent":
        if persistent is None:
            raise ProvisionError(f"platform {platform.name}: its {name} clears the disk and there "
                                 "is no persistent storage to save to; give --save-to DIR")
        if save is None:
            raise ProvisionError(
                f"platform {platform.name}: its {name} clears everything outside {persistent} "
                f"({spec.loses}). Name what to keep with --save DIR (copied into {persistent} "
                "before the stop), or say --action terminate to give it all up")
    keeps = ", ".join(spec.keeps_paths) or "nothing of the instance"
    if save and persistent is None:
        if spec.deletes == "everything":
            raise ProvisionError(f"platform {platform.name}: --save {req.save}: there is no "
                                 "persistent storage to copy it to before the instance is "
                                 f"deleted; give --save-to DIR (a network filesystem), on what "
                                 f"the {name} keeps: {spec.keeps} (a mount at {keeps})")
        notes.append(f"--save {req.save}: nothing to copy, {platform.name}'s {name} keeps the "
                     f"disk ({spec.keeps})")
        save = None
    keep_base = None
    if save and persistent:
        if spec.deletes == "nothing" and req.save_to:
            pass  # a copy the user wants where they say; the action loses nothing anyway
        elif spec.keeps_paths:
            if not _may_be_under(persistent, spec.keeps_paths):
                raise ProvisionError(
                    f"platform {platform.name}: --save-to {persistent}: its {name} keeps "
                    f"{spec.keeps}: a separate mount at {keeps}; a copy anywhere else is "
                    f"deleted with the rest ({spec.loses})")
            keep_base = persistent
        elif spec.deletes != "nothing":
            raise ProvisionError(f"platform {platform.name}: its {name} deletes {spec.loses} "
                                 "and its profile names no storage it keeps: --save would be "
                                 "lost with it")
    folder = re.sub(r"[^A-Za-z0-9._-]+", "-", machine).strip(".-")
    save_to = (f"{persistent.rstrip('/')}/{SAVED}" + (f"/{folder}" if folder else "")
               if persistent and save else None)
    if save and persistent and (save + "/").startswith(persistent.rstrip("/") + "/"):
        notes.append(f"{save} is already on persistent storage ({persistent}): nothing to copy")
        save_to = persistent
    if spec.bills:
        notes.append(f"still billed while stopped: {spec.bills}")
    if prof.note:
        notes.append(" ".join(prof.note.split()))
    return Decision(platform.name, name, spec, save, save_to, None, tuple(notes),
                    persistent=expand_home(prof.persistent_dir, home) if prof.persistent_dir
                    else None, keep_base=keep_base)


def _may_be_under(path: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``path`` or a folder above it matches one of the mount-point patterns (``*``
    matches any run of characters, ``/`` included, as bash's ``case`` does on the host)."""
    parts = path.rstrip("/").split("/")
    for i in range(len(parts), 1, -1):
        if any(fnmatch.fnmatchcase("/".join(parts[:i]), p) for p in patterns):
            return True
    return False


def _abs(path: str, home: str, base: str) -> str:
    full = expand_home(path, home)
    return full if full.startswith("/") else f"{base.rstrip('/')}/{full}"


def persistent_dirs() -> list[str]:
    """Every platform's persistent storage (absolute paths): where a state written before a
    container's disk was cleared may still be found (``--status``, ``cost``)."""
    dirs = (p.autostop.persistent_dir or "" for p in all_platforms())
    return sorted({d for d in dirs if d.startswith("/")})


def watchdog_script(dec: Decision, req: Request, platform: Platform) -> str:
    method, _, url = (dec.spec.request or "").partition(" ")
    prof = platform.autostop
    return render("money/autostop_watchdog.sh.j2", idle=int(round(req.idle)),
                  interval=round(req.interval, 2), util_max=req.util_max,
                  mem_max=req.mem_max_mib, after_job=req.after_job or "", action=dec.action,
                  save=dec.save or "", save_to=dec.save_to or "", save_timeout=SAVE_TIMEOUT,
                  save_rate=str(req.save_rate or ""), command=list(dec.spec.command),
                  method=method, url=url, body=dec.spec.body or "", ok=dec.spec.ok or "",
                  instance_id=req.instance_id or "", id_prefix=prof.instance_id_prefix,
                  id_env=list(prof.instance_id_env), key_env=list(prof.api_key_env),
                  injected=prof.id_injected, loses_data=dec.loses_data,
                  stop_wait=int(round(req.stop_wait)), tries=TRIES, wait_for=req.wait_for,
                  gpu_seen=dec.gpu_seen, cpu_busy=req.cpu_busy, io_busy=req.io_busy,
                  **_keep_values(dec), hook=req.hook or "",
                  hook_timeout=int(round(req.hook_timeout)), preempt=dec.preempt,
                  metadata=req.metadata, price=_num(req.price_per_hour),
                  after_queue=req.after_queue,
                  max_spend=_num(req.max_spend))


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:g}"


def _keep_values(dec: Decision) -> dict[str, Any]:
    """What the host checks of the storage --save lands on (money/_save.sh.j2 keep_check)."""
    return {"keep_base": dec.keep_base or "", "keep_paths": list(dec.spec.keeps_paths),
            "keep_env": dec.spec.keeps_env or "", "keep_fstypes": list(dec.spec.keeps_fstypes),
            "keeps": dec.spec.keeps}


def config(dec: Decision, req: Request) -> dict[str, Any]:
    """What ``--status`` shows of the settings (kept on the host; holds no secret)."""
    return {"platform": dec.platform, "action": dec.action, "action_text": dec.action_text,
            "keeps": dec.spec.keeps, "loses": dec.spec.loses, "bills": dec.spec.bills,
            "idle": int(round(req.idle)), "idle_text": duration_text(req.idle),
            "interval": round(req.interval, 2), "after_job": req.after_job,
            "util_max": req.util_max, "mem_max_mib": req.mem_max_mib, "save": dec.save,
            "save_to": dec.save_to, "notes": list(dec.notes), "loses_data": dec.loses_data,
            "billing_ends": dec.billing_ends, "stop_wait": int(round(req.stop_wait)),
            "wait_for": req.wait_for, "hook": req.hook, "hook_timeout": int(req.hook_timeout),
            "preempt": dec.preempt, "keep_base": dec.keep_base, "cpu_busy": req.cpu_busy,
            "io_busy": req.io_busy, "max_spend": req.max_spend,
            "price_per_hour": req.price_per_hour, "after_queue": req.after_queue}


def _ctl(mode: str, **values: Any) -> str:
    base: dict[str, Any] = {"command": [], "need_id": False, "id_env": [], "key_env": [],
                            "key_hint": "", "watchdog": "", "http": False,
                            "config": "", "persistent": "", "persist_dirs": [],
                            "lookup_url": "", "list_url": "", "check_ip": False,
                            "api_action": "", "instance_id": "", "id_prefix": "",
                            "injected": False, "addresses": [], "rearm_file": "",
                            "action": "", "save": "", "loses_data": False,
                            "notify_script": "", "metadata": METADATA,
                            "keep_base": "", "keep_paths": [], "keep_env": "",
                            "keep_fstypes": [], "keeps": ""}
    return render("money/autostop_ctl.sh.j2", mode=mode, **{**base, **values})


def probe(ex: Executor, metadata: str = METADATA) -> dict[str, Any]:
    """What the host shows of its cloud (DMI, Xen's uuid; AWS's instance life cycle, GCP's and
    Azure's Spot flags from their instance metadata) and whether nvidia-smi sees its GPUs.
    Changes nothing."""
    r = run_foreground(ex, "autostop-probe", _ctl("probe", metadata=metadata), again="autostop",
                       reads_only=True)
    if not isinstance(r.result, dict):
        raise ProvisionError(f"{ex.host}: autostop: the host answered {r.result!r}")
    return r.result


def check_probe(dec: Decision, platform: Platform, seen: dict[str, Any],
                host: str, preemption: str = "auto") -> Decision:
    """Refuse what the host's answers forbid (ProvisionError, one line); else the decision
    with what is known of the bill, whether the GPUs can be seen, and whose preemption
    notice to watch for (``preemption``: auto reads the cloud's DMI and Spot flag)."""
    if dec.loses_data and not seen.get("gpu_ok"):
        raise ProvisionError(
            f"{host}: autostop not set: the GPU check fails here ({seen.get('gpu_text') or '?'})"
            f"; the watchdog could not tell a running job from idle GPUs, and {dec.platform}'s "
            f"{dec.action} loses {dec.spec.loses or 'data'}. Make nvidia-smi work first "
            f"(gpu-provision -H {host} doctor)")
    dmi = seen.get("dmi") or {}
    values = {**{k: dmi.get(k, "") for k in DMI_NAMES},
              "hypervisor_uuid": seen.get("hypervisor_uuid") or "",
              "life_cycle": seen.get("life_cycle") or ""}
    dec = replace(dec, gpu_seen=bool(seen.get("gpu_ok")),
                  preempt=preempt_kind(preemption, values))
    if dec.preempt:
        dec = replace(dec, notes=dec.notes + (
            f"watching for the {dec.preempt.upper()} preemption notice: SIGINT to our jobs and "
            "the hook within it",))
    if not dec.spec.command or platform.kind != "vm":
        return dec
    verdict = shutdown_verdict(values)
    if verdict.refused:
        raise ProvisionError(f"{host}: autostop not set: {verdict.refused}"
                             + ("; --action none still watches for the preemption notice"
                                if dec.preempt else ""))
    notes = dec.notes + ((verdict.note,) if verdict.note else ())
    return replace(dec, notes=notes, billing_ends=verdict.billing_ends)


def preempt_kind(preemption: str, seen: dict[str, str]) -> str:
    """Whose notice to read: the one asked, else (auto) a Spot machine of AWS, GCP or Azure."""
    if preemption in ("aws", "gcp", "azure"):
        return preemption
    if preemption == "off" or seen.get("life_cycle", "").strip() != "spot":
        return ""
    cloud = identify(seen)
    return {"AWS": "aws", "Google Cloud": "gcp", "Azure": "azure"}.get(cloud.name if cloud
                                                                      else "", "")


def install(ex: Executor, dec: Decision, req: Request, platform: Platform,
            addresses: tuple[str, ...] = (), notify_script: str = "") -> dict[str, Any]:
    """Ask the host (``probe``), refuse what it forbids, check what the stop needs there (the
    instance id against the host itself, the storage --save lands on) and start the watchdog.
    ``addresses``: the host's addresses as we reached it (an instance the platform's API names
    must have one of them). Raises ProvisionError naming each problem; nothing is installed
    then. The result's ``warnings``: what the host said that does not stop it."""
    dec = check_probe(dec, platform, probe(ex, req.metadata), ex.host, req.preemption)
    prof = platform.autostop
    http = bool(dec.spec.request)
    lookup = (prof.instance_lookup or "").partition(" ")[2] if http else ""
    listing = lookup[:-len("/{id}")] if lookup.endswith("/{id}") and not prof.id_injected \
        else ""
    api_action = "stop" if dec.action == "stop" and http else ""
    body = _ctl("install", command=list(dec.spec.command), http=http,
                need_id=http and not req.instance_id, id_env=list(prof.instance_id_env),
                key_env=list(prof.api_key_env) if http else [], key_hint=prof.key_hint,
                watchdog=watchdog_script(dec, req, platform),
                config=json.dumps(config(dec, req), sort_keys=True),
                persistent=dec.persistent or "", lookup_url=lookup, list_url=listing,
                check_ip=not prof.id_injected, api_action=api_action,
                instance_id=req.instance_id or "", id_prefix=prof.instance_id_prefix,
                injected=prof.id_injected, addresses=list(addresses),
                rearm_file=prof.rearm_file or "", action=dec.action, save=dec.save or "",
                loses_data=dec.loses_data, notify_script=notify_script, **_keep_values(dec))
    r = run_foreground(ex, "autostop", body, again="autostop")
    result = r.result if isinstance(r.result, dict) else {}
    if result.get("problems"):
        raise ProvisionError(f"{ex.host}: autostop not set: " + "; ".join(result["problems"]))
    if not result.get("installed"):
        tail = " | ".join(lines(result.get("log"))[-3:])
        raise ProvisionError(f"{ex.host}: autostop: the watchdog did not start ({tail}); see "
                             f"{result.get('dir') or shown('autostop')}/autostop.log "
                             "on the host")
    return result


def cancel(ex: Executor) -> bool:
    """Stop and remove the watchdog; True when there was one."""
    r = run_foreground(ex, "autostop-cancel", _ctl("cancel", persist_dirs=persistent_dirs()),
                       again="autostop --cancel")
    return bool(isinstance(r.result, dict) and r.result.get("removed"))


def raw_status(ex: Executor) -> dict[str, Any]:
    r = run_foreground(ex, "autostop-status", _ctl("status", persist_dirs=persistent_dirs()),
                       again="autostop --status", reads_only=True)
    if not isinstance(r.result, dict):
        raise ProvisionError(f"{ex.host}: autostop --status: the host answered {r.result!r}")
    return r.result
