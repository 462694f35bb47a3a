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
from .clouds import DMI_NAMES, shutdown_verdict

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
SAVE_TIMEOUT = 3600  # seconds the copy to persistent storage may take (SkyPilot's hook default)
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


def duration_text(seconds: float) -> str:
    """90 -> 1m30s, 3600 -> 1h, 5400 -> 1h30m, 5 -> 5s."""
    s = int(round(seconds))
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m" + (f"{s % 60}s" if s % 60 else "")
    return f"{s // 3600}h" + (f"{s % 3600 // 60}m" if s % 3600 // 60 else "")


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


def decide(platform: Platform, req: Request, home: str, base: str | None = None) -> Decision:
    """The action and what is saved first; raises ProvisionError (one line: what, why, and what
    to say instead) for an action that would delete data not given up explicitly, one that does
    not end the billing, or one the platform cannot do. A relative ``--save`` is under ``base``
    (the data dir, as for sync), else the home."""
    validate(req)
    prof = platform.autostop
    known = ", ".join(k for k, a in prof.actions.items() if not a.refused) or "none"
    name = req.action or prof.default
    if name is None:
        raise ProvisionError(f"platform {platform.name}: no stop action is known for it; its "
                             "profile (recipes/platforms) needs an autostop section")
    spec = prof.actions.get(name)
    if spec is None:
        raise ProvisionError(f"platform {platform.name}: no --action {name} (it has: {known})")
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
    require = None
    if spec.deletes == "outside-persistent":
        if persistent is None:
            raise ProvisionError(f"platform {platform.name}: its {name} clears the disk and there "
                                 "is no persistent storage to save to; give --save-to DIR")
        if save is None:
            raise ProvisionError(
                f"platform {platform.name}: its {name} clears everything outside {persistent} "
                f"({spec.loses}). Name what to keep with --save DIR (copied into {persistent} "
                "before the stop), or say --action terminate to give it all up")
        require = persistent
    save_to = f"{persistent.rstrip('/')}/{SAVED}" if persistent and save else None
    if save and persistent is None:
        if spec.deletes == "everything":
            raise ProvisionError(f"platform {platform.name}: --save {req.save}: there is no "
                                 "persistent storage to copy it to before the instance is "
                                 "deleted; give --save-to DIR (a network filesystem)")
        notes.append(f"--save {req.save}: nothing to copy, {platform.name}'s {name} keeps the "
                     f"disk ({spec.keeps})")
        save = None
    if save and persistent and (save + "/").startswith(persistent.rstrip("/") + "/"):
        notes.append(f"{save} is already on persistent storage ({persistent}): nothing to copy")
        save_to = persistent
    if spec.bills:
        notes.append(f"still billed while stopped: {spec.bills}")
    return Decision(platform.name, name, spec, save, save_to, require, tuple(notes),
                    persistent=expand_home(prof.persistent_dir, home) if prof.persistent_dir
                    else None)


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
                  command=list(dec.spec.command), method=method, url=url,
                  body=dec.spec.body or "", ok=dec.spec.ok or "",
                  instance_id=req.instance_id or "", id_prefix=prof.instance_id_prefix,
                  id_env=list(prof.instance_id_env), key_env=list(prof.api_key_env),
                  loses_data=dec.loses_data, stop_wait=int(round(req.stop_wait)), tries=TRIES)


def config(dec: Decision, req: Request) -> dict[str, Any]:
    """What ``--status`` shows of the settings (kept on the host; holds no secret)."""
    return {"platform": dec.platform, "action": dec.action, "action_text": dec.action_text,
            "keeps": dec.spec.keeps, "loses": dec.spec.loses, "bills": dec.spec.bills,
            "idle": int(round(req.idle)), "idle_text": duration_text(req.idle),
            "interval": round(req.interval, 2), "after_job": req.after_job,
            "util_max": req.util_max, "mem_max_mib": req.mem_max_mib, "save": dec.save,
            "save_to": dec.save_to, "notes": list(dec.notes), "loses_data": dec.loses_data,
            "billing_ends": dec.billing_ends, "stop_wait": int(round(req.stop_wait))}


def _ctl(mode: str, **values: Any) -> str:
    base: dict[str, Any] = {"command": [], "need_id": False, "id_env": [], "key_env": [],
                            "key_hint": "", "require_persistent": "", "watchdog": "",
                            "config": "", "persistent": "", "persist_dirs": [],
                            "lookup_url": "", "instance_id": "", "id_prefix": "",
                            "addresses": [], "rearm_file": ""}
    return render("money/autostop_ctl.sh.j2", mode=mode, **{**base, **values})


def probe(ex: Executor) -> dict[str, Any]:
    """What the host shows of its cloud (DMI, Xen's uuid, AWS's instance life cycle) and
    whether nvidia-smi sees its GPUs. Changes nothing."""
    r = run_foreground(ex, "autostop-probe", _ctl("probe"), again="autostop")
    if not isinstance(r.result, dict):
        raise ProvisionError(f"{ex.host}: autostop: the host answered {r.result!r}")
    return r.result


def check_probe(dec: Decision, platform: Platform, seen: dict[str, Any],
                host: str) -> Decision:
    """Refuse what the host's answers forbid (ProvisionError, one line); else the decision
    with what is known of the bill."""
    if dec.loses_data and not seen.get("gpu_ok"):
        raise ProvisionError(
            f"{host}: autostop not set: the GPU check fails here ({seen.get('gpu_text') or '?'})"
            f"; the watchdog could not tell a running job from idle GPUs, and {dec.platform}'s "
            f"{dec.action} loses {dec.spec.loses or 'data'}. Make nvidia-smi work first "
            f"(gpu-provision -H {host} doctor)")
    if not dec.spec.command or platform.kind != "vm":
        return dec
    dmi = seen.get("dmi") or {}
    verdict = shutdown_verdict({**{k: dmi.get(k, "") for k in DMI_NAMES},
                                "hypervisor_uuid": seen.get("hypervisor_uuid") or "",
                                "life_cycle": seen.get("life_cycle") or ""})
    if verdict.refused:
        raise ProvisionError(f"{host}: autostop not set: {verdict.refused}")
    notes = dec.notes + ((verdict.note,) if verdict.note else ())
    return replace(dec, notes=notes, billing_ends=verdict.billing_ends)


def install(ex: Executor, dec: Decision, req: Request, platform: Platform,
            addresses: tuple[str, ...] = ()) -> dict[str, Any]:
    """Ask the host (``probe``), refuse what it forbids, check what the stop needs there and
    start the watchdog. ``addresses``: the host's addresses as we reached it (an instance the
    platform's API names must have one of them). Raises ProvisionError naming each problem;
    nothing is installed then."""
    dec = check_probe(dec, platform, probe(ex), ex.host)
    prof = platform.autostop
    http = not dec.spec.command
    lookup = (prof.instance_lookup or "").partition(" ")[2] if http else ""
    body = _ctl("install", command=list(dec.spec.command),
                need_id=http and not req.instance_id, id_env=list(prof.instance_id_env),
                key_env=list(prof.api_key_env) if http else [], key_hint=prof.key_hint,
                require_persistent=dec.require_persistent or "",
                watchdog=watchdog_script(dec, req, platform),
                config=json.dumps(config(dec, req), sort_keys=True),
                persistent=dec.persistent or "", lookup_url=lookup,
                instance_id=req.instance_id or "", id_prefix=prof.instance_id_prefix,
                addresses=list(addresses), rearm_file=prof.rearm_file or "")
    r = run_foreground(ex, "autostop", body, again="autostop")
    result = r.result if isinstance(r.result, dict) else {}
    if result.get("problems"):
        raise ProvisionError(f"{ex.host}: autostop not set: " + "; ".join(result["problems"]))
    if not result.get("installed"):
        tail = " | ".join(_lines(result.get("log"))[-3:])
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
                       again="autostop --status")
    if not isinstance(r.result, dict):
        raise ProvisionError(f"{ex.host}: autostop --status: the host answered {r.result!r}")
    return r.result


def state_text(state: dict[str, Any], alive: bool, cfg: dict[str, Any]) -> str:
    """One line: what the watchdog does or did (shared with ``cost``)."""
    if state.get("dead"):
        return f"stopped watching: {state['dead']}; run autostop again once that is fixed"
    if state.get("gave_up"):
        return f"failed: {state['gave_up']}"
    if state.get("fired_at") and not alive:
        return f"fired: {state.get('result')}"
    if not alive:
        return ""
    if state.get("stopping_since"):
        return f"stop sent ({state.get('result')}), waiting for the machine to go down"
    busy = state.get("busy") or ""
    return (f"running (pid {state.get('pid')}): " + (f"busy: {busy}" if busy else
            f"idle for {duration_text(state.get('idle_for') or 0)} of "
            f"{cfg.get('idle_text')}"))


def status_view(host: str, raw: dict[str, Any],
                platform: Platform | None = None) -> dict[str, Any]:
    """What ``--status`` (and ``cost``) show, from what the host reported."""
    if not raw.get("set"):
        return {"host": host, "set": False, "note": "", "log_tail": _lines(raw.get("log"))}
    state, cfg = raw.get("state") or {}, raw.get("config") or {}
    alive = bool(raw.get("alive"))
    text = state_text(state, alive, cfg)
    supervisor = raw.get("supervisor") or ""
    rearm = raw.get("rearm") or ""
    if not text:
        text = ("not running: the machine restarted since it was set (a container restart ends "
                "it), or it was killed; run autostop again")
        if raw.get("armed_boot_id") and raw.get("boot_id") != raw.get("armed_boot_id") \
                and supervisor != "systemd":
            text = "not running: the host rebooted since it was set; run autostop again"
    if supervisor == "systemd":
        reboot = "a systemd unit: it starts again after a reboot, its idle clock anew"
    elif raw.get("rearm_file"):
        reboot = (f"a setsid process, started again at each container start by "
                  f"{raw['rearm_file']}")
    else:
        hint = platform.autostop.rearm_hint if platform else ""
        reboot = ("a setsid process: a reboot or container restart ends it; "
                  + (hint or "run autostop again then").replace("{rearm}", rearm or "rearm.sh"))
    failure = state.get("last_failure") or ""
    return {"host": host, "set": True, "alive": alive, "fired": bool(state.get("fired_at")),
            "state_text": text, "config": cfg, "state": state, "supervisor": supervisor,
            "reboot_text": reboot, "last_failure": failure, "dir": raw.get("dir") or "",
            "log_tail": _lines(raw.get("log"))}


def _lines(text: Any) -> list[str]:
    return [x for x in str(text or "").splitlines() if x.strip()]
