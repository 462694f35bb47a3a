"""``HostFacts``: the typed result of the one facts execution (raw probe outputs -> values)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

import yaml

from ..wheels.data import dotted, load_compat, parse_compute_cap
from .cuda import parse_nvcc
from .fabric import (
    FabricManager,
    FabricState,
    nvlink5_board,
    parse_fabric_manager,
    parse_fabric_states,
    parse_nvswitches,
)
from .images import ImageTorch, parse_image_torches, parse_view, parse_view_site
from .limits import Limits, parse_limits
from .network import NetAddress, parse_default_route, parse_ip_addr
from .nvidia import (
    STATE_TEXT,
    Gpu,
    GpuProcess,
    NvidiaState,
    nvml_library_version,
    parse_compute_apps,
    parse_driver_version,
    parse_failure,
    parse_header,
    parse_query_gpu,
    parse_table,
)
from .osinfo import OsRelease, parse_os_release
from .pci import PciGpu, parse_lspci
from .platform import PlatformMarkers, Virtualization, detect_platform, detect_virtualization
from .space import Mount, parse_mounts
from .torchindex import IndexCache, parse_index_cache


@dataclass(frozen=True)
class Disk:
    path: str
    mount: str
    free_gb: float
    total_gb: float
    device: str = ""  # df's first column: what `quota` names a file system by


@dataclass(frozen=True)
class CondaEnv:
    conda: str  # the conda root prefix
    prefix: str
    name: str
    python: str | None  # "3.11"
    torch: str | None  # "2.5.1+cu124"
    torch_cuda: str | None  # "12.4"; None for a CPU build


@dataclass(frozen=True)
class HostFacts:
    os: OsRelease
    kernel: str
    arch: str
    hostname: str
    cpu_model: str
    cpu_cores: int
    memory_gb: float
    memory_available_gb: float
    home: str
    disks: tuple[Disk, ...]
    virtualization: Virtualization
    platform: str | None
    platform_evidence: str
    pid1: str
    systemd: bool
    root: bool
    sudo: bool
    glibc: str | None
    pci_gpus: tuple[PciGpu, ...]
    nvidia_state: NvidiaState
    nvidia_detail: str
    gpus: tuple[Gpu, ...]
    gpu_processes: tuple[GpuProcess, ...]
    driver: str | None
    driver_open: bool | None
    driver_cuda: str | None  # max CUDA the driver supports
    driver_cuda_source: str  # "nvidia-smi" | "driver table" | "none"
    nouveau_loaded: bool
    nvidia_module_loaded: bool
    nvcc: str | None
    pythons: tuple[str, ...]
    conda: tuple[str, ...]
    envs: tuple[CondaEnv, ...]
    mirrors: Mapping[str, str]
    boot_id: str
    journal: Mapping[str, Mapping[str, Any]]  # step -> its last recorded run
    warnings: tuple[str, ...] = field(default=())
    running: tuple[str, ...] = ()  # steps whose detached body is still running
    interrupted: tuple[str, ...] = ()  # steps whose body died unfinished (reboot, kill)
    conda_partial: str | None = None  # prefix of a Miniconda install that did not finish
    driver_packages: tuple[str, ...] = ()  # "name version" of installed NVIDIA driver packages
    torch_installers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # env -> who
    secure_boot: bool | None = None  # None: unknown (no mokutil, or not EFI)
    nvidia_ko_for_kernel: bool | None = None  # a built nvidia.ko exists for the running kernel
    nvidia_output: str = ""  # nvidia-smi's own words when it failed (what doctor matches)
    step_logs: Mapping[str, str] = field(default_factory=dict)  # step -> tail of its host log
    now: float = 0.0  # the host's clock (epoch seconds) when the facts were read
    addresses: tuple[NetAddress, ...] = ()  # every interface's addresses (ip -o addr show)
    default_iface: str | None = None  # the interface of the default route
    torch_index: tuple[IndexCache, ...] = ()  # what the PyTorch mirror served when last read
    own_envs: tuple[str, ...] = ()  # env prefixes gpu-provision created (their marker file)
    nvswitches: tuple[str, ...] = ()  # PCI slots of NVIDIA NVSwitch functions (class 0680)
    nvlink5: str | None = None  # "8x B200": NVSwitches behind ConnectX-7 (no PCI function)
    fabric_manager: FabricManager | None = None  # None: not installed
    fabric: tuple[FabricState, ...] = ()  # per GPU, where the driver reports it
    uv_versions: tuple[str, ...] = ()  # our uv in ~/.gpu-provision/tools (ops/installer.py)
    running_jobs: tuple[tuple[str, int], ...] = ()  # (job id, supervisor pid) of ours that run
    gpu_faults: tuple[str, ...] = ()  # one line per GPU nvidia-smi cannot read (ERR!)
    login: str = ""  # the user the SSH login is (id -un)
    sudo_said: str = ""  # what `sudo -n true` answered where it failed ("a password is required")
    limits: Limits = Limits()  # cgroup memory/CPU, /dev/shm, open files, inodes (facts/limits.py)
    image_torches: tuple[ImageTorch, ...] = ()  # torch outside conda: system python3, venvs
    view: str | None = None  # the interpreter our venv over the image's python was made from
    view_site: str = ""  # the user site (pip --user) our venv names in its .pth
    conda_readonly: tuple[str, ...] = ()  # conda roots the login cannot write to
    mounts: tuple[Mount, ...] = ()  # file systems an env could go on (facts/space.py)

    @property
    def has_nvidia_gpu(self) -> bool:
        """A GPU is seen, or a driver is installed that fails (mismatch, lost GPU, ...)."""
        return bool(self.gpus or self.pci_gpus) or self.nvidia_state not in ("ok", "no_driver")

    @property
    def compute_caps(self) -> tuple[str, ...]:
        return tuple(g.compute_cap for g in self.gpus if g.compute_cap)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["has_nvidia_gpu"] = self.has_nvidia_gpu
        return data


def _out(probes: Mapping[str, Any], name: str) -> tuple[str, int]:
    p = probes.get(name) or {}
    return str(p.get("out", "")), int(p.get("rc", 127))


def _ok(probes: Mapping[str, Any], name: str) -> str | None:
    out, rc = _out(probes, name)
    return out if rc == 0 else None


def parse_df(text: str) -> tuple[Disk, ...]:
    """Lines ``<path>\t<df -Pk row>`` from the disk probe -> one Disk per existing path."""
    disks = []
    for line in text.splitlines():
        path, _, row_text = line.rpartition("\t")  # a path may hold a tab; df -P rows do not
        row = row_text.split()
        if len(row) >= 6 and row[1].isdigit() and row[3].isdigit():
            disks.append(Disk(path=path, mount=row[5], total_gb=round(int(row[1]) / 1048576, 1),
                              free_gb=round(int(row[3]) / 1048576, 1), device=row[0]))
    return tuple(disks)


def parse_meminfo(text: str) -> tuple[float, float]:
    vals = dict(re.findall(r"^(\w+):\s+(\d+) kB", text, re.MULTILINE))
    total = int(vals.get("MemTotal", 0)) / 1048576
    return round(total, 1), round(int(vals.get("MemAvailable", 0)) / 1048576, 1)


def parse_envs(text: str) -> tuple[CondaEnv, ...]:
    """Lines ``root|prefix|python3.11|__version__=2.5.1+cu124 cuda=12.4`` from the envs probe."""
    envs = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 4:
            continue
        root, prefix, py, tv = parts
        # torch/version.py: "__version__ = '2.5.1+cu124'" and "cuda: Optional[str] = '12.4'"
        torch_vals = dict(re.findall(r"(__version__|cuda)(?::[^=\s]*)?=(\S+)", tv))
        cuda = torch_vals.get("cuda")
        envs.append(CondaEnv(
            conda=root, prefix=prefix,
            name="base" if prefix == root else prefix.rsplit("/", 1)[-1],
            python=py.removeprefix("python") or None,
            torch=torch_vals.get("__version__"),
            torch_cuda=None if cuda in (None, "None") else cuda,
        ))
    return tuple(envs)


def parse_mirrors(text: str) -> dict[str, str]:
    """Mirror settings found in .condarc / pip.conf, keyed ``pip.index-url``, ``conda.channels``."""
    found: dict[str, str] = {}
    source = ""
    for line in text.splitlines():
        if line.startswith("== "):
            source = "conda" if line.endswith(".condarc") else "pip"
            continue
        m = re.match(r"\s*(index-url|extra-index-url|index_url)\s*=\s*(\S+)", line)
        if m and source == "pip":
            found.setdefault(f"pip.{m.group(1).replace('_', '-')}", m.group(2))
        m = re.match(r"\s*-\s*(\S+)", line)
        if m and source == "conda":
            found["conda.channels"] = (found.get("conda.channels", "") + " " + m.group(1)).strip()
    return found


CHIP_RE = re.compile(r"^(G[A-Z]\d{3}|TU\d{3}|AD\d{3})")  # lspci's chip: GK107M, TU102GL, AD102


def cc_from_name(name: str) -> str | None:
    """Compute capability from a GPU's name: lspci's chip (``GK107M [GeForce GT 750M]``) when
    there is one, else the marketing name (nvidia-smi's, for drivers without compute_cap)."""
    chips, names = load_gpu_ccs()
    m = CHIP_RE.match(name.strip())
    if m:
        for key in sorted(chips, key=len, reverse=True):
            if m.group(1).startswith(key):
                return chips[key]
    low = name.lower()
    for key in sorted(names, key=len, reverse=True):
        if key in low:
            return names[key]
    return None


@cache
def load_gpu_ccs() -> tuple[Mapping[str, str], Mapping[str, str]]:
    """(chip prefix -> cc, lower-case name fragment -> cc) from provision/tables/gpus.yaml."""
    raw = yaml.safe_load(resources.files("provision.tables").joinpath("gpus.yaml").read_text())
    return ({k: str(v["cc"]) for k, v in raw["chips"].items()},
            {k.lower(): str(v["cc"]) for k, v in raw["gpus"].items()})


def parse_facts(raw: str | Mapping[str, Any], markers: Iterable[PlatformMarkers] = ()) -> HostFacts:
    """Turn the facts script's JSON into HostFacts. A missing tool is a value, never an error."""
    doc = json.loads(raw) if isinstance(raw, str) else raw
    probes: Mapping[str, Any] = doc["probes"]
    warnings: list[str] = []

    os_text = _ok(probes, "os_release") or ""
    osr = parse_os_release(os_text)
    centos = _ok(probes, "centos_release")
    if centos and osr.id == "centos":  # CentOS 7's os-release says only "7"
        full = parse_os_release(centos)
        osr = OsRelease(id=osr.id, version_id=full.version_id or osr.version_id,
                        pretty_name=osr.pretty_name, id_like=osr.id_like)

    home = (_ok(probes, "home") or "/root").strip()
    disks = parse_df(_out(probes, "disk")[0])
    mem_total, mem_avail = parse_meminfo(_out(probes, "meminfo")[0])
    sdv_out, sdv_rc = _out(probes, "systemd_detect_virt")  # exits 1 printing "none"
    virt = detect_virtualization(sdv_out if sdv_rc in (0, 1) else None, _ok(probes, "dmi") or "",
                                 _ok(probes, "container_markers") or "",
                                 (_ok(probes, "hypervisor_flag") or "0").strip() not in ("", "0"))
    hostname = (_ok(probes, "hostname") or "").strip()
    platform, evidence = detect_platform(
        markers, (_out(probes, "platform_markers")[0]).split(),
        (_ok(probes, "pid1_env_names") or "").split(), hostname)

    # nvidia: the query (with compute_cap, else without), the table for the max CUDA.
    q_out, q_rc = _out(probes, "smi_query")
    state = parse_failure(q_out, q_rc)
    gpus: tuple[Gpu, ...] = ()
    if state is None:
        gpus = parse_query_gpu(q_out)
    elif "not a valid field" in q_out:
        q_out, q_rc = _out(probes, "smi_query_nocc")
        state = parse_failure(q_out, q_rc)
        if state is None:
            gpus = parse_query_gpu(q_out)
    # nvidia-smi answers ERR! for a GPU it cannot talk to (fallen off the bus, Xid 79): one
    # finding, and the model's compute capability, so that nothing downstream trips over it
    faults = tuple(gpu_fault("?" if g.index is None else g.index, g.compute_cap) for g in gpus
                   if g.compute_cap and not _readable_cc(g.compute_cap))
    gpus = tuple(g if _readable_cc(g.compute_cap) else replace(g, compute_cap=None) for g in gpus)
    # a driver without the field, or one answering [N/A] for it: the model's, from its name
    gpus = tuple(g if g.compute_cap else replace(g, compute_cap=cc_from_name(g.name)) for g in gpus)
    detail = STATE_TEXT[state or "ok"]
    if state == "nvml_mismatch":
        lib = nvml_library_version(q_out)
        detail += f" (NVML library {lib})" if lib else ""
    table_out, table_rc = _out(probes, "smi_table")
    header = parse_table(table_out)[0] if table_rc == 0 else parse_header("")
    module = parse_driver_version(_ok(probes, "proc_driver") or "") or \
        parse_driver_version(_ok(probes, "sys_module") or "")
    driver = (gpus[0].driver if gpus and gpus[0].driver else None) or header.driver or \
        (module.version if module else None)
    driver_cuda, cuda_source = header.cuda, "nvidia-smi" if header.cuda else "none"
    if driver_cuda is None and driver:
        mx = load_compat().max_cuda_for_driver(dotted(driver))
        if mx:
            driver_cuda, cuda_source = ".".join(map(str, mx[:2])), "driver table"

    modules = _ok(probes, "modules") or ""
    mod_names = {ln.split()[0] for ln in modules.splitlines() if ln.strip()}
    pythons = tuple(sorted({m.group(1) for m in re.finditer(r"Python (\d+\.\d+)",
                                                            _out(probes, "pythons")[0])}))
    journal: dict[str, Any] = {}
    for line in (_ok(probes, "journal") or "").splitlines():
        try:
            entry = json.loads(line)
            journal[str(entry["step"])] = entry
        except (ValueError, KeyError, TypeError):
            warnings.append(f"unreadable journal entry on the host: {line[:80]!r}")
    uid = (_ok(probes, "uid") or "").strip()
    states: dict[str, list[str]] = {"running": [], "interrupted": [], "conda-partial": []}
    for line in (_ok(probes, "interrupted") or "").splitlines():
        kind, _, name = line.partition(" ")
        if kind in states and name:
            states[kind].append(name)
    return HostFacts(
        os=osr,
        kernel=(_ok(probes, "kernel") or "").strip(),
        arch=(_ok(probes, "arch") or "").strip(),
        hostname=hostname,
        cpu_model=(_ok(probes, "cpu_model") or "").strip(),
        cpu_cores=int((_ok(probes, "cpu_cores") or "0").strip() or 0),
        memory_gb=mem_total,
        memory_available_gb=mem_avail,
        home=home,
        disks=disks,
        virtualization=virt,
        platform=platform,
        platform_evidence=evidence,
        pid1=(_ok(probes, "pid1") or "").strip(),
        systemd=(_ok(probes, "pid1") or "").strip() == "systemd",
        root=uid == "0",
        sudo=uid == "0" or _out(probes, "sudo")[1] == 0,
        glibc=(m.group(1) if (m := re.search(r"(\d+\.\d+)", _ok(probes, "glibc") or "")) else None),
        pci_gpus=parse_lspci(_ok(probes, "lspci") or ""),
        nvidia_state=state or "ok",
        nvidia_detail=detail,
        gpus=gpus,
        gpu_processes=parse_compute_apps(_ok(probes, "smi_apps") or ""),
        driver=driver,
        driver_open=module.open if module else None,
        driver_cuda=driver_cuda,
        driver_cuda_source=cuda_source,
        nouveau_loaded="nouveau" in mod_names,
        nvidia_module_loaded="nvidia" in mod_names or module is not None,
        nvcc=parse_nvcc(_ok(probes, "nvcc") or ""),
        pythons=pythons,
        conda=tuple(ln.strip() for ln in (_ok(probes, "conda") or "").splitlines() if ln.strip()),
        envs=parse_envs(_ok(probes, "envs") or ""),
        mirrors=parse_mirrors(_ok(probes, "mirrors") or ""),
        boot_id=(_ok(probes, "boot_id") or "").strip(),
        journal=journal,
        warnings=tuple(warnings),
        running=tuple(states["running"]),
        interrupted=tuple(states["interrupted"]),
        conda_partial=next(iter(states["conda-partial"]), None),
        driver_packages=tuple(ln.strip() for ln in (_ok(probes, "driver_packages") or "")
                              .splitlines() if ln.strip()),
        torch_installers=parse_torch_installers(_ok(probes, "torch_installers") or ""),
        secure_boot=parse_secure_boot(_out(probes, "secure_boot")[0]),
        nvidia_ko_for_kernel=(bool((_ok(probes, "nvidia_ko") or "").strip())
                              if "nvidia_ko" in probes else None),
        nvidia_output=q_out.strip()[:4000] if state not in (None, "no_driver") else "",
        step_logs=parse_step_logs(_ok(probes, "step_logs") or ""),
        now=float((_ok(probes, "now") or "0").strip() or 0),
        addresses=parse_ip_addr(_ok(probes, "net_addrs") or ""),
        default_iface=parse_default_route(_ok(probes, "net_route") or ""),
        torch_index=parse_index_cache(_ok(probes, "torch_index") or ""),
        own_envs=tuple(ln.strip() for ln in (_ok(probes, "own_envs") or "").splitlines()
                       if ln.strip()),
        nvswitches=parse_nvswitches(_ok(probes, "lspci") or ""),
        nvlink5=nvlink5_board(parse_lspci(_ok(probes, "lspci") or "")),
        fabric_manager=parse_fabric_manager(_ok(probes, "fabric_manager") or ""),
        fabric=parse_fabric_states(*_out(probes, "fabric")),
        uv_versions=tuple(ln.strip() for ln in (_ok(probes, "uv_tools") or "").splitlines()
                          if ln.strip()),
        gpu_faults=faults,
        image_torches=parse_image_torches(_ok(probes, "image_torch") or ""),
        view=parse_view(_ok(probes, "image_torch") or ""),
        view_site=parse_view_site(_ok(probes, "image_torch") or ""),
        conda_readonly=tuple(ln.strip() for ln in (_ok(probes, "conda_readonly") or "")
                             .splitlines() if ln.strip()),
        mounts=parse_mounts(_out(probes, "mounts")[0]),
        login=(_ok(probes, "login") or "").strip(),
        limits=parse_limits(_ok(probes, "cgroup") or "", _ok(probes, "shm") or "",
                            _ok(probes, "nofile") or "", _ok(probes, "inodes") or "",
                            _ok(probes, "quota") or ""),
        sudo_said=_sudo_said(uid, *_out(probes, "sudo")),
        running_jobs=tuple((w[0], int(w[1])) for w in (ln.split() for ln in
                           (_ok(probes, "jobs_running") or "").splitlines())
                           if len(w) == 2 and w[1].isdigit()),
    )


def parse_step_logs(text: str) -> dict[str, str]:
    """``== <path>/<step>.log`` headers, each followed by that log's last lines."""
    logs: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        m = re.match(r"^== .*/([^/]+)\.log$", line)
        if m:
            current = logs.setdefault(m.group(1), [])
        elif current is not None:
            current.append(line)
    return {k: "\n".join(v) for k, v in logs.items()}


def parse_torch_installers(text: str) -> dict[str, tuple[str, ...]]:
    """``<env prefix> <conda|pip|...>`` lines -> env -> the installers that put torch there."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        prefix, _, who = line.strip().rpartition(" ")
        if prefix and who and who not in found.setdefault(prefix, []):
            found[prefix].append(who)
    return {k: tuple(v) for k, v in found.items()}


def parse_secure_boot(text: str) -> bool | None:
    """``mokutil --sb-state``: "SecureBoot enabled" / "SecureBoot disabled"; without mokutil the
    UEFI variable's value byte ("efivar SecureBoot 1"); else unknown."""
    m = re.search(r"SecureBoot (enabled|disabled)", text)
    if m:
        return m.group(1) == "enabled"
    m = re.search(r"^efivar SecureBoot ([01])$", text, re.MULTILINE)
    return (m.group(1) == "1") if m else None


def _sudo_said(uid: str, out: str, rc: int) -> str:
    """Why ``sudo -n true`` failed, in sudo's words (its last line: "sudo: a password is
    required"), or that it is not installed (bash: 127); "" where it worked or was not needed."""
    if uid == "0" or rc == 0:
        return ""
    if rc == 127:
        return "sudo is not installed"
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[-1] if lines else f"sudo -n exited {rc}"


def _readable_cc(cc: str | None) -> bool:
    if not cc:
        return True
    try:
        parse_compute_cap(cc)
    except ValueError:
        return False
    return True


def gpu_fault(index: int | str, answer: str) -> str:
    """The one line for a GPU whose compute capability nvidia-smi answers as ERR! (NVIDIA's
    Xid catalog: Xid 79, "GPU has fallen off the bus"; Xid 48, a double-bit ECC error)."""
    return (f"GPU {index}: nvidia-smi answers its compute capability as {answer} (a GPU falling "
            "off the bus): look for Xid 79 or 48 in `sudo dmesg` / `journalctl -k`; a GPU reset "
            f"(`nvidia-smi -r -i {index}` with nothing running on it) or a reboot may bring it "
            "back (in a container: ask the provider); if it happens again the card is faulty: "
            "rent another")
