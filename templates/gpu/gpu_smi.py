"""gpu-provision validation, what nvidia-smi says: the GPUs before we start (MIG instances, who
holds which GPU), the health evidence, and the readings taken while a GPU works. Every call is
bounded and guarded: a missing tool, a field this driver does not know or a timeout is an answer
("[N/A]" stays text here; gpu_verdict.num reads it as unknown). Shipped beside validate_gpu.py
(Python 3.8+, standard library only). Fields: nvidia-smi --help-query-gpu and
--help-query-compute-apps (https://docs.nvidia.com/deploy/nvidia-smi/index.html).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xid  # noqa: E402

SMI_TIMEOUT = 20
SMI_FIELDS = ("uuid,index,name,pci.bus_id,memory.total,memory.used,utilization.gpu,compute_mode,"
              "clocks.max.sm,power.limit,pcie.link.gen.max,pcie.link.width.max")
LOAD_FIELDS = ("clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,"
               "pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max")
# clock-event reasons: the field's name since driver 535, and its name before
REASON_FIELDS = ("clocks_event_reasons", "clocks_throttle_reasons")
# the caps a host can set that the renter pays for (nvidia-smi --help-query-gpu): the power limit
# the driver enforces against the board's default and maximum, application clocks against their
# defaults, persistence and compute mode
CAPS = ("uuid,index,power.limit,enforced.power.limit,power.default_limit,power.min_limit,"
        "power.max_limit,clocks.applications.graphics,clocks.default_applications.graphics,"
        "clocks.applications.memory,clocks.default_applications.memory,persistence_mode,compute_mode")
BAD_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
# (applications_clocks_setting: the clocks at the application clocks' ceiling, named so that a
# host that set them low is seen under load too; judge_caps compares them with the default)
REASONS = ("sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
           "sw_thermal_slowdown", "applications_clocks_setting")
HEALTH = {"ecc": "ecc.mode.current,ecc.errors.uncorrected.volatile.total,"
                 "ecc.errors.corrected.volatile.total",
          "remapped": "remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,"
                      "remapped_rows.failure",
          "retired": "retired_pages.single_bit_ecc.count,retired_pages.double_bit.count,"
                     "retired_pages.pending",
          # what the driver says must be done now to clear a fault (nvmlDeviceGetGpuRecoveryAction:
          # None, Reset, Reboot, Drain P2P, Drain and Reset); a driver without it fails this alone
          "recovery": "gpu_recovery_action"}


def run(argv: list[str], timeout: float = SMI_TIMEOUT) -> dict[str, Any]:
    """{"rc", "out", "err"}; rc 127 when the tool is missing, 124 when it timed out."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"rc": 124 if isinstance(exc, subprocess.TimeoutExpired) else 127, "out": "",
                "err": f"{argv[0]}: {exc}"}
    return {"rc": r.returncode, "out": r.stdout, "err": r.stderr}


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split(",")]


def query(fields: str, target: str | None = None) -> dict[str, Any]:
    """`nvidia-smi --query-gpu=FIELDS` -> {"rows": [{field: text}], "error"}; "[N/A]" stays text
    (gpu_verdict.num reads it as unknown)."""
    argv = ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"]
    r = run(argv + (["-i", target] if target else []))
    if r["rc"] != 0:
        return {"rows": [], "error": (r["out"] + r["err"]).strip()[:500] or f"exit {r['rc']}"}
    keys = fields.split(",")
    rows = [dict(zip(keys, _cells(ln))) for ln in r["out"].strip().splitlines()
            if len(_cells(ln)) == len(keys)]
    return {"rows": rows, "error": None}


def query_known(fields: str) -> dict[str, Any]:
    """``query`` without the fields this driver does not know (each named in nvidia-smi's error
    and dropped, one at a time): an old driver answers what it has."""
    keys = fields.split(",")
    dropped: list[str] = []
    for _ in range(len(keys)):
        q = query(",".join(keys))
        bad = BAD_FIELD.search(q["error"] or "")
        if not bad or bad.group(1) not in keys:
            return {**q, "unknown": dropped}
        keys.remove(bad.group(1))
        dropped.append(bad.group(1))
    return {"rows": [], "error": "no field answered", "unknown": dropped}


def reason_prefix() -> str | None:
    """The clock-event reasons' field name this driver knows (clocks_event_reasons since R535,
    clocks_throttle_reasons before), asked once: a driver that knows neither still answers the
    load query's clocks and link."""
    for prefix in REASON_FIELDS:
        if not query(f"{prefix}.active")["error"]:
            return prefix
    return None


def parse_mig_list(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi -L` -> the MIG instances: [{"gpu": 0, "profile": "3g.40gb", "uuid": "MIG-..."}]."""
    out: list[dict[str, Any]] = []
    gpu = None
    for line in text.splitlines():
        g = re.match(r"GPU (\d+):", line)
        if g:
            gpu = int(g.group(1))
        m = re.match(r"\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*(MIG-[^)]+)\)", line)
        if m and gpu is not None:
            out.append({"gpu": gpu, "profile": m.group(1), "device": int(m.group(2)),
                        "uuid": m.group(3).strip()})
    return out


def smi() -> dict[str, Any]:
    """nvidia-smi's view before torch touches a GPU (torch's own context uses memory): the GPUs,
    MIG mode and instances, and who holds which GPU (compute apps by gpu_uuid)."""
    q = query(SMI_FIELDS + ",mig.mode.current")
    if q["error"] and "mig.mode" in q["error"]:  # a driver without the field
        q = query(SMI_FIELDS)
    out: dict[str, Any] = {"gpus": q["rows"], "processes": [], "mig": [], "error": q["error"]}
    if q["error"]:
        return out
    r = run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
             "--format=csv,noheader,nounits"])
    for line in r["out"].strip().splitlines() if r["rc"] == 0 else []:
        c = _cells(line)
        if len(c) == 4 and c[1].isdigit() and int(c[1]) != os.getpid():
            out["processes"].append({"gpu_uuid": c[0], "pid": c[1], "name": c[2], "used_mib": c[3]})
    if any(str(g.get("mig.mode.current")).lower() == "enabled" for g in out["gpus"]):
        r = run(["nvidia-smi", "-L"])
        out["mig"] = parse_mig_list(r["out"]) if r["rc"] == 0 else []
    caps = query_known(CAPS)
    out["caps"] = caps["rows"] if not caps["error"] else {"error": caps["error"][:200]}
    out["reasons_field"] = reason_prefix()
    return out


def health(bus_ids: dict[str, str]) -> dict[str, Any]:
    """ECC, remapped rows, retired pages: one query each (a field this driver does not know
    fails only its own query), and the kernel log's Xid lines where readable: those of our GPUs
    (``bus_ids``: nvidia-smi's pci.bus_id -> index) classified, the others only counted."""
    out: dict[str, Any] = {}
    for part, fields in HEALTH.items():
        q = query("uuid,index," + fields)
        out[part] = q["rows"] if not q["error"] else {"error": q["error"][:200]}
    r = run(["dmesg"], timeout=10)
    if r["rc"] == 0:
        mine, others = xid.scoped(xid.parse(r["out"]), bus_ids)
        out["xid"] = {"events": mine[-50:], "other_gpus": others, "scoped": True,
                      "lines": [e["line"] for e in mine][-5:]}
    else:
        out["xid"] = {"lines": [], "error": "the kernel log is not readable here "
                      f"({(r['err'].strip().splitlines() or ['exit ' + str(r['rc'])])[0][:120]})"}
    return out


def start_load_query(uuid: str | None, fields: str) -> subprocess.Popen[str] | None:
    """nvidia-smi started while the GPU works, read after: the clocks of the load, not of idle."""
    if not uuid:
        return None
    try:
        return subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits",
                                 "-i", uuid], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError:
        return None


def finish_load_query(proc: subprocess.Popen[str] | None, fields: str) -> dict[str, Any]:
    if proc is None:
        return {}
    try:
        out, _ = proc.communicate(timeout=SMI_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {}
    lines = out.strip().splitlines()
    cells = _cells(lines[0]) if proc.returncode == 0 and lines else []
    return dict(zip(fields.split(","), cells)) if len(cells) == len(fields.split(",")) else {}


def load_fields(prefix: str | None) -> str:
    """What is read under load: clocks, power, temperature, the PCIe link, and each clock-event
    reason (``prefix`` is the reasons' name: clocks_event_reasons since driver 535, before it
    clocks_throttle_reasons; None where the driver knows neither)."""
    return LOAD_FIELDS + "".join(f",{prefix}.{r}" for r in REASONS if prefix)


def under_load(proc: Any, fields: str) -> dict[str, Any]:
    """One load query's readings: the fields, and the clock-event reasons that were active
    (sw_power_cap, hw_slowdown, ...) as a list."""
    got = finish_load_query(proc, fields)
    if not got:
        return {}
    out = {k: v for k, v in got.items() if not k.startswith(REASON_FIELDS)}
    out["reasons"] = [k.split(".")[-1] for k, v in got.items()
                      if k.startswith(REASON_FIELDS) and v.strip().lower() == "active"]
    return out
