"""gpu-provision validation, the verdict rules of the multi-GPU tier and of CUDA not starting:
pure functions of the measurements (validate_gpu.py), beside gpu_verdict.py (Python 3.8+,
standard library only).

NCCL's ladder (validate_gpu.py runs it, these rules read it): the all-reduce as it is, once more
as it is (a slow first start: spawn, every worker's ``import torch``), then one setting at a time
- NCCL_SHM_DISABLE=1 (a small /dev/shm), NCCL_CUMEM_ENABLE=0 (cuMem/IPC handles a container
forbids), NCCL_P2P_DISABLE=1 (peer-to-peer that does not work) - each alone. Only the setting
that fixed it goes into the check's "env", the one `gpu-provision run` applies.
Sources: NCCL's environment variables,
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html (NCCL_SHM_DISABLE,
NCCL_CUMEM_ENABLE, NCCL_P2P_DISABLE, NCCL_DEBUG); NCCL troubleshooting on Docker's 64 MiB
/dev/shm, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html.
"""

from __future__ import annotations

import re
from typing import Any, Callable

Check = Callable[..., None]
# NVLink, per link and direction, GB/s, by the GPU's compute capability (NVIDIA's NVLink pages:
# NVLink 1 on P100, 2 on V100, 3 on A100, 4 on H100, 5 on Blackwell; GA102's bridge, RTX 3090/A6000,
# has 4 links of 14.0625 GB/s)
NVLINK_GBS = {"6.0": 20.0, "7.0": 25.0, "8.0": 25.0, "8.6": 14.0625, "9.0": 25.0, "10.0": 50.0}
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# GeForce Ada and Blackwell ("NVIDIA GeForce RTX 4090"; not the RTX 4000/5000 Ada workstation cards)
GEFORCE_NO_P2P = re.compile(r"GeForce RTX (40|50)\d0", re.IGNORECASE)
SMALL_SHM = 1 << 30  # bytes: Docker's default is 64 MiB
ERR_802 = re.compile(r"\b802\b|system not yet initialized|cudaErrorSystemNotReady", re.I)
FIXES = {"NCCL_SHM_DISABLE": "NCCL's shared-memory transport failed",
         "NCCL_CUMEM_ENABLE": "NCCL's cuMem (CUDA virtual memory and IPC handle) path failed: "
                              "containers without the IPC or NUMA access it needs refuse it",
         "NCCL_P2P_DISABLE": "peer-to-peer between these GPUs does not work"}


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def parse_topology(text: str | None) -> dict[str, str]:
    """`nvidia-smi topo -m` -> {"i,j": link} for each GPU pair (NV#, PIX, PXB, PHB, NODE, SYS)."""
    rows = [ln.split() for ln in (text or "").splitlines() if re.match(r"^GPU\d+\s", ln)]
    links: dict[str, str] = {}
    for row in rows:
        i = int(row[0][3:])
        for j, cell in enumerate(row[1:1 + len(rows)]):
            if i != j and cell != "X":
                links[f"{i},{j}"] = cell
    return links


def cuda_failure(m: dict[str, Any]) -> str:
    """Why CUDA did not start, from torch's own warning; error 802 on an NVSwitch board names
    the fabric manager, its state, and the fix."""
    said = " ".join((m.get("torch") or {}).get("cuda_warnings") or [])
    if not ERR_802.search(said):
        first = said.split(" (Triggered internally")[0].strip()
        return ("torch.cuda.is_available() is False (the driver is too old for this wheel, or "
                "not loaded)" + (f": {first[:300]}" if first else ""))
    fab = m.get("fabric") or {}
    seen = []
    if fab.get("manager") or fab.get("version"):
        seen.append(f"nvidia-fabricmanager {fab.get('version') or '(not installed)'} "
                    f"{fab.get('manager') or ''}".strip())
    else:
        seen.append("no nvidia-fabricmanager service here")
    states = fab.get("states") or []
    if states:
        counts: dict[str, int] = {}
        for s in states:
            counts[s] = counts.get(s, 0) + 1
        seen.append("fabric " + ", ".join(f"{s} on {n} GPU(s)" for s, n in counts.items()))
    return ("CUDA error 802: system not yet initialized: on an NVSwitch board the GPUs wait for "
            f"the fabric manager to set up the NVLink fabric ({'; '.join(seen)}). Fix: run "
            "nvidia-fabricmanager of exactly the driver's version (`gpu-provision -H <host> "
            "driver` installs and starts it on a VM; by hand `systemctl enable --now "
            "nvidia-fabricmanager`) and wait for `nvidia-smi -q` to show Fabric State "
            "Completed; on a container rental it runs on the provider's host: ask the provider")


def _pcie_gbs(smi_gpu: dict[str, Any]) -> float | None:
    """The link each GPU can have (max gen x max width; the current one drops at idle)."""
    gen = int(_num(smi_gpu.get("pcie.link.gen.max")) or _num(smi_gpu.get("pcie.link.gen.current")))
    width = int(_num(smi_gpu.get("pcie.link.width.max")) or _num(smi_gpu.get("pcie.link.width.current")))
    return PCIE_LANE_GBS.get(gen, 0) * width or None


def good_run(mm: dict[str, Any]) -> dict[str, Any]:
    return next((a for a in mm.get("allreduce") or [] if a.get("ok")), {})


def expected_busbw(m: dict[str, Any]) -> tuple[float | None, str]:
    """What the topology allows an all-reduce (bus bandwidth, GB/s), and why: the slowest pair's
    NVLinks, else the slowest PCIe link (halved when peer-to-peer is off: every byte crosses PCIe
    twice, through host memory)."""
    mm = m["multi"]
    links = mm.get("topology") or {}
    n = mm.get("gpus") or 0
    caps = {g.get("capability") for g in m.get("gpus") or []}
    if links and all(v.startswith("NV") for v in links.values()) and len(caps) == 1:
        per = NVLINK_GBS.get(str(caps.pop()))
        count = min(int(v[2:] or 1) for v in links.values())
        if per:
            return per * count, f"NVLink between every pair: {count} link(s) of {per:g} GB/s"
    pcie = [x for x in (_pcie_gbs(g) for g in (m.get("smi") or {}).get("gpus") or []) if x]
    if not pcie:
        return None, "no PCIe link figures"
    p2p = mm.get("p2p") or []
    all_p2p = bool(p2p) and all(p2p[i][j] for i in range(n) for j in range(n) if i != j)
    if mm.get("p2p_error"):  # not read is not "no peer access": the link's own figure
        all_p2p = True
    inherited = inherited_nccl(m)
    via_host = not all_p2p or (good_run(mm).get("env") or {}).get("NCCL_P2P_DISABLE") == "1" \
        or inherited.get("NCCL_P2P_DISABLE") == "1"
    low = min(pcie)
    return (low / 2, f"PCIe {low:.1f} GB/s per GPU, through host memory (no peer-to-peer)") \
        if via_host else (low, f"PCIe {low:.1f} GB/s per GPU, peer-to-peer")


def inherited_nccl(m: dict[str, Any]) -> dict[str, str]:
    """The NCCL_* settings this host's environment gives every process (the image's or the
    login's), which the all-reduce inherited: their effect is theirs, not the hardware's."""
    return {k: str(v) for k, v in (m.get("env") or {}).items() if k.startswith("NCCL_") and v is not None
            and k != "NCCL_DEBUG"}


def _how(run: dict[str, Any]) -> str:
    said = "hung (" + str(run.get("error")) + ")" if run.get("timeout") else f"failed: {run.get('error')}"
    if run.get("stage"):
        said += f" during {run['stage']}"
    if run.get("nccl_warn"):
        said += f"; NCCL said: {run['nccl_warn']}"
    return said


def _p2p_cause(m: dict[str, Any], names: list[str], peer: bool) -> str:
    mm = m["multi"]
    if any(GEFORCE_NO_P2P.search(x) for x in names) and peer:
        return (f"{', '.join(names)}: NVIDIA does not support peer-to-peer on GeForce RTX 40/50 "
                "cards, yet this driver reports it")
    if mm.get("acs_redirect") or (mm.get("hypervisor") and mm.get("iommu_groups")):
        return ("IOMMU/ACS redirect peer-to-peer traffic through the root complex " +
                ("(a VM: the hypervisor's IOMMU)" if mm.get("hypervisor") and mm.get("iommu_groups")
                 else "(ACS is on in the PCIe switches: disable it in the BIOS)"))
    return FIXES["NCCL_P2P_DISABLE"]


def judge_multi(m: dict[str, Any], th: dict[str, Any], check: Check) -> None:
    """The multi-GPU tier: NCCL all-reduce works (else which one setting fixed it, or the
    failure in NCCL's words), bus bandwidth against the topology, peer access per pair,
    /dev/shm, exclusive-process compute mode."""
    mm = m["multi"]
    names = sorted({str(g.get("name")) for g in m.get("gpus") or []})
    n = mm.get("gpus") or len(m.get("gpus") or [])
    if mm.get("error"):
        check("multi-gpu", "fail", f"the multi-GPU measurements failed: {mm['error']}")
        return
    p2p = mm.get("p2p") or []
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    peer = [(i, j) for i, j in pairs if p2p and p2p[i][j] and p2p[j][i]]
    if mm.get("p2p_error"):
        check("p2p", "warn", f"peer access could not be read ({mm['p2p_error']}): the all-reduce is "
              "judged against the links' own bandwidth")
    elif len(peer) == len(pairs):
        check("p2p", "pass", f"peer access between all {len(pairs)} GPU pair(s)")
    elif not peer:
        check("p2p", "pass", f"no peer access between any of the {len(pairs)} GPU pair(s): "
              "traffic between GPUs goes through host memory")
    else:
        have = ", ".join(f"{i}-{j}" for i, j in peer[:12])
        check("p2p", "pass", f"peer access between {len(peer)} of {len(pairs)} GPU pair(s) "
              f"({have}); the others go through host memory")
    exclusive = [str(x) for x in mm.get("exclusive") or []]
    if exclusive:
        check("compute mode", "warn", f"GPU {', '.join(exclusive)} in Exclusive_Process compute mode: "
              "one process per GPU, so a job that opens a GPU twice (a parent that touches CUDA "
              "before it spawns its workers) fails with 'busy or unavailable'; validation ran "
              "its all-reduce before touching CUDA itself. `nvidia-smi -c DEFAULT` (root) "
              "lifts it")
    if not mm.get("nccl"):
        check("nccl all-reduce", "warn", "this torch build has no NCCL: multi-GPU jobs fall back "
              "to gloo (slow)")
        return
    runs = mm.get("allreduce") or []
    first = runs[0] if runs else {}
    good = good_run(mm)
    shm = mm.get("shm_bytes")
    small_shm = shm is not None and shm < SMALL_SHM
    if first.get("ok"):
        check("nccl all-reduce", "pass", f"{n} GPUs: results correct, bus bandwidth "
              f"{first.get('busbw_gbs')} GB/s")
    elif good and not good.get("env"):
        check("nccl all-reduce", "pass", f"{n} GPUs: the first start {_how(first)}; the same run "
              f"again passed ({good.get('busbw_gbs')} GB/s): a slow first start (spawning "
              f"{n} workers that each import torch), no setting needed")
    elif good:
        (key, value), = good["env"].items()
        cause = FIXES.get(key, key)
        if key == "NCCL_P2P_DISABLE":
            cause = _p2p_cause(m, names, bool(peer))
        if key == "NCCL_SHM_DISABLE" and small_shm:
            cause = (f"/dev/shm is {shm / 1048576:.0f} MiB (a container's default), too small for "
                     "NCCL's shared-memory buffers; ask the platform for a larger one (docker "
                     "--shm-size)")
        before = [f"{k}={v}" for r in runs[2:] if not r.get("ok") for k, v in (r.get("env") or {}).items()]
        check("nccl all-reduce", "warn", f"as it is, the all-reduce over {n} GPUs {_how(first)} "
              "(twice)" + (f"; not fixed by {', '.join(before)}" if before else "") +
              f"; with {key}={value} alone it works ({good.get('busbw_gbs')} GB/s): {cause}. "
              f"gpu-provision run sets {key}={value} on this host's jobs", env={key: value})
    else:
        tried = ", ".join(sorted({k for r in runs for k in (r.get("env") or {})})) or "nothing else"
        hint = (f"; /dev/shm is only {shm / 1048576:.0f} MiB" if small_shm else "")
        check("nccl all-reduce", "fail", f"NCCL all-reduce over {n} GPUs {_how(first)}; it failed "
              f"again with each of {tried} set{hint}")
    if small_shm and not (good.get("env") or {}).get("NCCL_SHM_DISABLE"):
        check("/dev/shm", "warn", f"/dev/shm is {shm / 1048576:.0f} MiB (a container's default): "
              "DataLoader workers fail with 'bus error' and NCCL may need NCCL_SHM_DISABLE=1; ask "
              "the platform for a larger shm (docker --shm-size)")
    if good and good.get("busbw_gbs") is not None:
        want, basis = expected_busbw(m)
        if want:
            ratio = good["busbw_gbs"] / want
            low = ratio < th["min_bandwidth_ratio"]
            why = ""
            if low and (mm.get("acs_redirect") or (mm.get("hypervisor") and mm.get("iommu_groups"))):
                why = "; IOMMU/ACS on this host can route peer-to-peer through the root complex"
            inherited = inherited_nccl(m)
            if inherited:
                why += ("; this environment sets " + ", ".join(f"{k}={v}" for k, v in inherited.items())
                        + " for every process (not ours): the all-reduce ran with it")
            check("multi-gpu bandwidth", "warn" if low else "pass",
                  f"all-reduce bus bandwidth {good['busbw_gbs']} GB/s of about {want:.0f} the "
                  f"topology allows ({ratio:.2f}; {basis}){why}")
