"""What the autostop watchdog says of itself, as ``autostop --status`` and ``cost`` show it: pure
readings of the state and config it keeps on the host (``templates/money/autostop_watchdog.sh.j2``
writes ``state.json``; ``autostop_ctl.sh.j2``'s status mode gathers it)."""

from __future__ import annotations

from typing import Any

from ..config.recipes import Platform


def duration_text(seconds: float) -> str:
    """90 -> 1m30s, 3600 -> 1h, 5400 -> 1h30m, 5 -> 5s."""
    s = int(round(seconds))
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m" + (f"{s % 60}s" if s % 60 else "")
    return f"{s // 3600}h" + (f"{s % 3600 // 60}m" if s % 3600 // 60 else "")


def state_text(state: dict[str, Any], alive: bool, cfg: dict[str, Any],
               restarted: bool = False) -> str:
    """One line: what the watchdog does or did (shared with ``cost``). ``restarted``: the
    machine has started again since the state was written (a resumed pod)."""
    if state.get("dead"):
        return f"stopped watching: {state['dead']}; run autostop again once that is fixed"
    if state.get("gave_up"):
        return f"failed: {state['gave_up']}"
    if state.get("fired_at") and not alive:
        if restarted:
            return (f"fired: {state.get('result')}; not watching since the machine was started "
                    "again (run autostop again)")
        return f"fired: {state.get('result')}"
    if not alive:
        return ""
    if state.get("preempted"):
        return f"preemption notice: {state['preempted']} (SIGINT sent to our jobs)"
    if state.get("stopping_since"):
        return f"stop sent ({state.get('result')}), waiting for the machine to go down"
    busy = state.get("busy") or ""
    if state.get("phase"):
        text = f"running (pid {state.get('pid')}): {state['phase']}, still sampling"
    else:
        text = (f"running (pid {state.get('pid')}): " + (f"busy: {busy}" if busy else
                f"idle for {duration_text(state.get('idle_for') or 0)} of "
                f"{cfg.get('idle_text')}"))
    if state.get("held") and state["held"] != "nothing to stop":
        text += f"; did not fire: {state['held']}"
    return text


def status_view(host: str, raw: dict[str, Any],
                platform: Platform | None = None) -> dict[str, Any]:
    """What ``--status`` (and ``cost``) show, from what the host reported."""
    if not raw.get("set"):
        return {"host": host, "set": False, "note": "", "log_tail": lines(raw.get("log"))}
    state, cfg = raw.get("state") or {}, raw.get("config") or {}
    alive = bool(raw.get("alive"))
    restarted = bool(state.get("boot_id")) and raw.get("boot_id") != state.get("boot_id")
    text = state_text(state, alive, cfg, restarted)
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
            "reboot_text": reboot, "last_failure": failure, "held": state.get("held") or "",
            "unseen": state.get("unseen") or "", "hook_result": state.get("hook_result") or "",
            "spend": state.get("spend") or "", "dir": raw.get("dir") or "",
            "log_tail": lines(raw.get("log"))}


def lines(text: Any) -> list[str]:
    return [x for x in str(text or "").splitlines() if x.strip()]
