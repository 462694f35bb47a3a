"""Match a host's state and error texts against the knowledge base of known failures.

The knowledge base (``provision/doctor/knowledge.yaml``) is data: signatures, diagnoses, fixes.
This module holds the named fact checks it refers to and fills in the fix with this host's
numbers (the wheel to reinstall, the first build with a GPU's architecture). Pure: no I/O but
reading the shipped YAML.
"""

from __future__ import annotations

import html
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import yaml

from ..config.shipped import Traversable
from ..errors import ConfigError, ProvisionError, RemoteError
from ..facts.fabric import fabric_ready, fabric_summary
from ..facts.host import HostFacts
from ..wheels.data import cc_text, dotted, load_compat, parse_compute_cap
from ..wheels.rule import TorchChoice, first_build_with


class EnvLayout(Protocol):
    @property
    def python_bin(self) -> str: ...


class Plan(Protocol):
    """What doctor reads of a plan (``setup.plan.Plan``, a floor above): the torch it chose and
    the env it goes into, so that a fix names this host's interpreter and wheel."""

    @property
    def torch(self) -> TorchChoice | None: ...

    @property
    def layout(self) -> EnvLayout | None: ...


KNOWLEDGE = resources.files("provision.doctor") / "knowledge.yaml"
LEVELS = ("error", "warning", "info")


@dataclass(frozen=True)
class Entry:
    id: str
    level: str
    diagnosis: str
    fix: str
    match: tuple[re.Pattern[str], ...] = ()
    when: tuple[str, ...] = ()
    group: str | None = None


@dataclass(frozen=True)
class Finding:
    id: str
    level: str
    diagnosis: str
    fix: str
    evidence: str  # the matched line (and where), or the fact that holds

    def as_json(self) -> dict[str, str]:
        return {"id": self.id, "level": self.level, "diagnosis": self.diagnosis, "fix": self.fix,
                "evidence": self.evidence}


# Fact checks: each returns the placeholders it provides (a true value) or None.
Check = Callable[[HostFacts], "dict[str, str] | None"]


def _branches(packages: Sequence[str]) -> set[str]:
    found = set()
    for p in packages:
        name, _, version = p.partition(" ")
        m = re.search(r"nvidia-(?:driver|dkms)-(\d{3})", name) or re.match(r"(\d{3})\.", version)
        if m:
            found.add(m.group(1))
    return found


def _busy(f: HostFacts) -> dict[str, str] | None:
    if f.gpu_processes:
        procs = ", ".join(f"{p.name} (pid {p.pid}, {p.used_memory_mib or '?'} MiB)"
                          for p in f.gpu_processes[:5])
        return {"busy": f"{len(f.gpu_processes)} process(es) already run on it: {procs}"}
    used = [g for g in f.gpus if (g.memory_used_mib or 0) > 512]
    if used:
        return {"busy": "; ".join(f"GPU {g.index} has {g.memory_used_mib} MiB of "
                                  f"{g.memory_total_mib} MiB in use" for g in used)}
    return None


def _disk_full(f: HostFacts) -> dict[str, str] | None:
    low = [d for d in f.disks if d.total_gb > 0 and (d.free_gb < 5 or d.free_gb / d.total_gb < 0.05)]
    if not low:
        return None
    return {"disk_text": "; ".join(f"The disk holding {d.path} ({d.mount}) has {d.free_gb} GB "
                                   f"free of {d.total_gb} GB" for d in low) + "."}


def _home_small(f: HostFacts) -> dict[str, str] | None:
    home = next((d for d in f.disks if d.path == f.home), None)
    if home is None or home.total_gb >= 60:
        return None
    big = max((d for d in f.disks if d.mount != home.mount), key=lambda d: d.free_gb, default=None)
    if big is None or big.free_gb < 2 * home.total_gb:
        return None
    return {"home_text": f"The home disk ({home.mount}) is {home.total_gb} GB while {big.path} "
                         f"({big.mount}) has {big.free_gb} GB free: downloads and caches in "
                         "$HOME fill the small one first.", "data_mount": big.path}


def _conda_and_pip(f: HostFacts) -> dict[str, str] | None:
    """torch of conda's and a wheel's (pip, or uv, which the torch step may use) in one env."""
    both = [(env, w) for env, who in f.torch_installers.items() if "conda" in who
            for w in who if w in ("pip", "uv")]
    return {"env": both[0][0], "installer": both[0][1]} if both else None


def _nvcc_differs(f: HostFacts) -> dict[str, str] | None:
    if not (f.nvcc and f.driver_cuda):
        return None
    if f.nvcc.split(".")[:2] == f.driver_cuda.split(".")[:2]:
        return None
    return {"nvcc": f.nvcc, "driver_cuda": f.driver_cuda}


def _fabric_manager_down(f: HostFacts) -> dict[str, str] | None:
    """An NVSwitch board whose fabric manager is missing, stopped or not the driver's version
    (in a container, where it is the provider's: whose fabric is not up)."""
    if not f.nvswitches:
        return None
    fm, summary = f.fabric_manager, fabric_summary(f.fabric)
    if f.virtualization.kind == "container":
        state = f"the fabric is not up ({summary})" if fabric_ready(f.fabric) is False else None
    elif fm is None or fm.version is None:
        state = "nvidia-fabricmanager is not installed"
    elif f.driver and fm.version != f.driver:
        state = f"nvidia-fabricmanager is {fm.version}, not the driver's {f.driver}"
    elif not fm.running:
        state = f"nvidia-fabricmanager {fm.version} is {fm.active or 'not running'}"
    elif fabric_ready(f.fabric) is False:
        state = f"nvidia-fabricmanager runs but the fabric is not up ({summary})"
    else:
        state = None
    if state is None:
        return None
    return {"switches": f"{len(f.nvswitches)} NVSwitches on the PCI bus",
            "fm_state": state + (f"; {summary}" if summary and summary not in state else "")}


CHECKS: dict[str, Check] = {
    "fabric_manager_down": _fabric_manager_down,
    "nouveau_loaded": lambda f: {} if f.nouveau_loaded else None,
    "secure_boot": lambda f: {} if f.secure_boot else None,
    "no_module_for_kernel": lambda f: {"kernel": f.kernel}
    if f.nvidia_ko_for_kernel is False and f.virtualization.kind != "container" else None,
    "container": lambda f: {} if f.virtualization.kind == "container" else None,
    "no_driver_with_gpu": lambda f: {"pci": ", ".join(g.name for g in f.pci_gpus)}
    if f.nvidia_state == "no_driver" and f.pci_gpus else None,
    "several_driver_branches": lambda f: {"packages": ", ".join(f.driver_packages)}
    if len(_branches(f.driver_packages)) > 1 else None,
    "torch_conda_and_pip": _conda_and_pip,
    "gpu_busy": _busy,
    "disk_nearly_full": _disk_full,
    "home_small_beside_data": _home_small,
    "nvcc_differs": _nvcc_differs,
}


@cache
def load_knowledge(path: Traversable = KNOWLEDGE) -> tuple[Entry, ...]:
    """The entries, checked: every `when` names a known check, every regex compiles."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    entries = []
    for i, e in enumerate(raw.get("entries") or []):
        where = f"entries[{i}] ({e.get('id', '?')})"
        unknown = [w for w in e.get("when") or [] if w not in CHECKS]
        if unknown:
            raise ConfigError(str(path), f"unknown check {unknown[0]!r} (known: "
                              f"{', '.join(sorted(CHECKS))})", key=f"{where}.when")
        if e.get("level") not in LEVELS or not (e.get("match") or e.get("when")):
            raise ConfigError(str(path), f"level must be one of {', '.join(LEVELS)} and an "
                              "entry needs match or when", key=where)
        try:
            patterns = tuple(re.compile(m, re.IGNORECASE) for m in e.get("match") or [])
        except re.error as exc:
            raise ConfigError(str(path), f"bad regular expression: {exc}", key=f"{where}.match") \
                from None
        entries.append(Entry(id=e["id"], level=e["level"], diagnosis=e["diagnosis"],
                             fix=e["fix"], match=patterns, when=tuple(e.get("when") or ()),
                             group=e.get("group")))
    return tuple(entries)


# What a log line starts with before the message itself: the kernel's timestamps (dmesg,
# dmesg -T), syslog and journalctl prefixes, NVRM's tag (each line of a wrapped kernel message
# repeats it), torchrun's rank tag, CI timestamps and e-mail/Markdown quote marks.
_PREFIXES = re.compile(r"""(?x)^(?:
    \[\s*\d+\.\d+\]\s*                                               # [  12.345678]
  | \[\s*T\d+\]\s*                                                      # [ T1946] (thread id)
  | \[[A-Z][a-z]{2}\x20[A-Z][a-z]{2}\x20[\x20\d]\d\x20[\d:]{8}\x20\d{4}\]\s*  # dmesg -T
  | [A-Z][a-z]{2}\x20[\x20\d]\d\x20[\d:]{8}\x20\S+\x20[\w.@/-]+(?:\[\d+\])?:\s  # syslog
  | \d{4}-\d\d-\d\dT[\d:]{8}(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\x20\S+\x20[\w.@/-]+(?:\[\d+\])?:\s
  | \[\d{4}-\d\d-\d\dT[\d:.]+Z?\]\s*                                   # [2025-07-15T19:41:39.043Z]
  | kernel:\s
  | NVRM:\s
  | \[rank\d+\]:\s?
  | >\s?
)""")
_TYPOGRAPHIC = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'",
                              "\u2032": "'", "`": "'", "\u201c": '"', "\u201d": '"',
                              "\u201e": '"', "\u2033": '"', "\u00a0": " ", "\u200b": None,
                              "\ufeff": None})


def normalise(text: str) -> str:
    """The text as signatures see it, one message line per line.

    Log prefixes go (timestamps, syslog/journal, the ``NVRM:`` every line of a wrapped kernel
    message repeats, rank tags, quote marks), rsyslog's ``#012`` becomes the line break it
    stands for, typographic quotes and backticks become ASCII quotes, HTML entities are decoded,
    runs of spaces become one and empty lines are dropped. A message wrapped over several lines
    is matched on the same text with the line breaks as spaces (see ``_search``), which keeps
    every offset: position i is the same character in both.
    """
    text = html.unescape(text.replace("#012", "\n")).translate(_TYPOGRAPHIC)
    lines = []
    for raw in text.splitlines():
        line = raw.strip()
        while (m := _PREFIXES.match(line)) and m.end():
            line = line[m.end():].lstrip()
        line = " ".join(line.split())
        if line:
            lines.append(line)
    return "\n".join(lines)


def _search(entry: Entry, views: Mapping[str, tuple[str, str]]) -> tuple[str, re.Match[str], str] | None:
    """The first signature of ``entry`` in the texts: each normalised text line by line, then
    with its lines joined (a wrapped message); a pattern that spells out ``\\n`` is about
    lines and is tried on the lines only. Returns the source, the match and the text."""
    for source, (lines, joined) in views.items():
        for pattern in entry.match:
            for text in (lines, joined) if "\\n" not in pattern.pattern else (lines,):
                m = pattern.search(text)
                if m:
                    return source, m, lines
    return None


def _line_of(text: str, m: re.Match[str]) -> str:
    """The normalised line(s) holding the match, shortened to 200 characters."""
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", max(m.end() - 1, m.start()))
    found = text[start:end if end >= 0 else None].replace("\n", " ").strip()
    return found if len(found) <= 200 else found[:97] + " ... " + found[-98:]


def explain(exc: ProvisionError) -> ProvisionError:
    """A failed step's error with the known failure its output shows in front of its fix;
    any other error as it is. Called where an error is reported, never by the engine."""
    if not isinstance(exc, RemoteError) or not exc.diagnosable:
        return exc
    known = diagnose({f"step {exc.step}": exc.output}, host=exc.host)
    if not known:
        return exc
    first = known[0]
    return exc.explained(f"{first.diagnosis} (seen: {first.evidence.split(': ', 1)[-1]}) "
                         f"{first.fix}")


def diagnose(texts: Mapping[str, str], facts: HostFacts | None = None, plan: Plan | None = None,
             host: str = "<host>") -> list[Finding]:
    """Every entry whose signature is in ``texts`` (source -> text) and whose checks hold on
    ``facts``; entries with checks need facts. Ordered errors first."""
    findings: list[Finding] = []
    taken: set[str] = set()
    views = {}
    for source, text in texts.items():
        lines = normalise(text)
        views[source] = (lines, lines.replace("\n", " "))
    for entry in load_knowledge():
        if entry.group and entry.group in taken:
            continue
        values: dict[str, str] = {"host": host}
        evidence = matched = ""
        if entry.match:
            hit = _search(entry, views)
            if hit is None:
                continue
            source, m, matched = hit
            values.update({k: v for k, v in m.groupdict().items() if v is not None})
            evidence = f"{source}: {_line_of(matched, m)}"
        if entry.when:
            if facts is None:
                continue
            provided = [CHECKS[w](facts) for w in entry.when]
            if any(p is None for p in provided):
                continue
            for p in provided:
                values.update(p or {})
            evidence = evidence or "facts: " + ", ".join(entry.when)
        values.update(_specifics(entry.id, values, facts, plan, host, matched))
        findings.append(Finding(entry.id, entry.level, _fill(entry.diagnosis, values),
                                _fill(entry.fix, values), evidence))
        if entry.group:
            taken.add(entry.group)
    return sorted(findings, key=lambda f: LEVELS.index(f.level))


def _fill(text: str, values: Mapping[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), text)


def _specifics(entry_id: str, values: Mapping[str, str], facts: HostFacts | None,
               plan: Plan | None, host: str, text: str = "") -> dict[str, str]:
    """The host-specific parts of a fix: the exact wheel, the first build with an arch, who
    holds the GPU's memory. ``text`` is the normalised text the signature was found in."""
    choice = plan.torch if plan is not None else None
    more = _SPECIFICS.get(entry_id)
    if more is not None:
        return more(values, facts, plan, host, text)
    if entry_id == "torch-cpu-build":
        if choice is not None and plan is not None and plan.layout is not None and choice.cuda != "cpu":
            return {"reinstall": f"Reinstall the CUDA build the wheel rule picks for this host: "
                                 f"{plan.layout.python_bin} -m pip install --force-reinstall "
                                 f"torch=={choice.torch} --index-url {choice.index_url} "
                                 f"(or `gpu-provision -H {host} torch`)"}
        return {"reinstall": f"Reinstall torch from the PyTorch CUDA index: `gpu-provision -H {host} "
                             "torch` picks the build for the driver and GPU; by hand, `gpu-provision "
                             "pick --driver <version> --compute-cap <cc>` names the --index-url"}
    if entry_id == "driver-too-old":
        found = values.get("found", "")
        cuda = f"{int(found) // 1000}.{int(found) % 1000 // 10}" if found.isdigit() else None
        out = {"found_cuda": f" (the driver supports CUDA {cuda})" if cuda else ""}
        if facts is not None and facts.driver:
            out["driver_fix"] = (f"Either install the wheel the rule picks for driver {facts.driver}"
                                 f" (`gpu-provision -H {host} torch`"
                                 + (f": {choice.label}" if choice else "")
                                 + f") or upgrade the driver (`gpu-provision -H {host} driver`).")
        else:
            out["driver_fix"] = ("Either upgrade the driver (`gpu-provision -H <host> driver`) or "
                                 "install a wheel for the driver's CUDA: `gpu-provision pick "
                                 "--driver <version>` names it.")
        return out
    if entry_id in ("no-kernel-image", "arch-not-compatible"):
        caps: list[tuple[int, int]] = []
        if values.get("sm"):
            sm = values["sm"]
            caps = [(int(sm[:-1]), int(sm[-1]))]
        elif facts is not None:
            caps = [parse_compute_cap(c) for c in facts.compute_caps]
        if not caps:
            text = ("Install a build that lists this GPU's sm_XY in torch.cuda.get_arch_list(): "
                    f"`gpu-provision -H {host} torch` picks one")
            return {"gpu_arch": "", "arch_fix": text, "sm_fix": text}
        fixes = []
        for cc in sorted(set(caps)):
            first = first_build_with(cc)
            fixes.append(f"torch {first[0]}+{first[1]} is the first build with {cc_text(cc)} "
                         f"(it needs driver >= {first[2]})" if first else
                         f"no official build has kernels for {cc_text(cc)}")
        text = "; ".join(fixes) + f"; `gpu-provision -H {host} torch` installs the newest that fits"
        return {"gpu_arch": f" ({', '.join(cc_text(c) for c in caps)})", "arch_fix": text,
                "sm_fix": text}
    return {}


def texts_for(facts: HostFacts | None, report: Mapping[str, Any] | None = None,
              local_logs: Mapping[str, str] | None = None,
              files: Mapping[str, str] | None = None) -> dict[str, str]:
    """Everything doctor reads, keyed by where it came from (named in the evidence)."""
    texts: dict[str, str] = {}
    if facts is not None:
        if facts.nvidia_output:
            texts["nvidia-smi"] = facts.nvidia_output
        texts.update({f"host log {k}": v for k, v in facts.step_logs.items()})
    if report:
        texts["last validation"] = "\n".join(
            f"{c.get('name')}: {c.get('status')}: {c.get('reason')}"
            for c in report.get("checks", []) if isinstance(c, Mapping)) + "\n" + "\n".join(
            str(e) for e in report.get("errors", []))
    texts.update(local_logs or {})
    texts.update(files or {})
    return texts


# Host-specific parts of the newer entries: each takes the match's values, the facts and plan
# (when doctor has a host), the host name and the normalised text the signature was found in.
Specific = Callable[[Mapping[str, str], "HostFacts | None", "Plan | None", str, str],
                    "dict[str, str]"]


def _gpu_ref(values: Mapping[str, str]) -> str:
    bus = values.get("bus")
    return f"GPU {bus}" if bus else "The GPU"


def _fabric_manager(values: Mapping[str, str], facts: HostFacts | None, plan: Plan | None,
                    host: str, text: str) -> dict[str, str]:
    driver = values.get("drv") or (facts.driver if facts is not None else None)
    if not driver:
        return {"fm_install": "Install the fabric manager of exactly the driver's version "
                              "(`nvidia-smi` shows it): Ubuntu `apt-get install "
                              "nvidia-fabricmanager-<branch>=<driver>-1` (from branch 580 the "
                              "package is `nvidia-fabricmanager=<driver>-1`), RHEL family `dnf "
                              "install nvidia-fabric-manager-<driver>`"}
    branch = driver.split(".")[0]
    apt = (f"nvidia-fabricmanager={driver}-1" if branch.isdigit() and int(branch) >= 580
           else f"nvidia-fabricmanager-{branch}={driver}-1")
    return {"fm_install": f"The driver here is {driver}: install the fabric manager of exactly "
                          f"that version, Ubuntu `apt-get install {apt}`, RHEL family `dnf "
                          f"install nvidia-fabric-manager-{driver}`"}


_ECC_WHAT = {
    "48": "an uncorrectable double-bit ECC error in its memory (Xid 48)",
    "63": "a memory row with ECC errors, now marked for remapping (Xid 63); the spare row is "
          "used only after a GPU reset or a reboot",
    "64": "a failed remapping of a bad memory row (Xid 64): its spare rows are used up",
    "94": "a contained uncorrectable ECC error (Xid 94): the process using that memory was "
          "stopped, the GPU keeps running",
    "95": "an uncontained uncorrectable ECC error (Xid 95): every process on the GPU is "
          "affected and the GPU needs a reset",
}


def _ecc(values: Mapping[str, str], facts: HostFacts | None, plan: Plan | None, host: str,
         text: str) -> dict[str, str]:
    what = _ECC_WHAT.get(values.get("xid", ""), "an uncorrectable ECC error in its memory (CUDA "
                         "reports it to the process that touched that memory)")
    return {"gpu_ref": _gpu_ref(values), "ecc_what": what}


def _fallen(values: Mapping[str, str], facts: HostFacts | None, plan: Plan | None, host: str,
            text: str) -> dict[str, str]:
    return {"gpu_ref": _gpu_ref(values)}


def _extension(values: Mapping[str, str], facts: HostFacts | None, plan: Plan | None,
               host: str, text: str) -> dict[str, str]:
    """The library named before ": undefined symbol: <sym>" on the matched line."""
    sym = values.get("sym", "")
    line = next((ln for ln in text.splitlines() if f"undefined symbol: {sym}" in ln), "")
    words = line.split(": undefined symbol:")[0].split()
    name = words[-1].rsplit("/", 1)[-1] if words else ""
    return {"so": name if ".so" in name else "A compiled extension"}


def _gpu_holders(values: Mapping[str, str], facts: HostFacts | None, plan: Plan | None,
                 host: str, text: str) -> dict[str, str]:
    """Who else holds the GPU's memory: the host's GPU processes, else the ones the message
    names ("Process 1246069 has 577.00 MiB memory in use")."""
    busy = _busy(facts) if facts is not None else None
    if busy:
        return {"holders": f" On the host now: {busy['busy']}."}
    named = re.findall(r"Process (\d+) has ([\d.]+ [KMGT]?i?B) memory in use", text)
    if named:
        return {"holders": " Other processes held memory on that GPU when it failed: "
                           + ", ".join(f"pid {pid} ({size})" for pid, size in named[:5]) + "."}
    return {"holders": ""}


def _reinstall_torch(plan: Plan | None, host: str) -> str:
    """A reinstall of the same torch over its broken files: by hand, as the `torch` task keeps
    a torch whose version passes the wheel rule (it only checks versions, not files)."""
    choice = plan.torch if plan is not None else None
    if choice is not None and plan is not None and plan.layout is not None:
        return (f"{plan.layout.python_bin} -m pip install --force-reinstall torch=={choice.torch} "
                f"--index-url {choice.index_url}")
    return ("`python -m pip install --force-reinstall torch==<version> --index-url <index>` in "
            f"the env, with the index `gpu-provision pick` names for {host}'s driver and GPU")


def _missing_lib(values: Mapping[str, str], facts: HostFacts | None, plan: Plan | None,
                 host: str, text: str) -> dict[str, str]:
    lib = values.get("lib", "the library")
    low = lib.lower()
    if low.startswith(("libc10", "libtorch", "libcaffe2", "libshm")):
        why = (f"{lib} is part of torch itself: the package that loads it was built for another "
               "torch (another version, or a CUDA build where a CPU build is installed), or "
               "torch's own files are incomplete.")
        fix = (f"Reinstall torch ({_reinstall_torch(plan, host)}), then the package that failed, "
               "in its build for exactly that torch.")
    elif low.startswith("libcudart"):
        m = re.search(r"\.so\.(\d+)", lib)
        cuda = f"CUDA {m.group(1)}" if m else "another CUDA"
        why = (f"The package that loads {lib} was built for {cuda}, whose runtime is not "
               "installed (torch's wheels bring their own copy, which other packages do not see).")
        fix = ("Install that package's build for the CUDA your torch uses (`python -c \"import "
               "torch; print(torch.version.cuda)\"`), or add the runtime it wants from pip, e.g. "
               f"`pip install nvidia-cuda-runtime-cu{m.group(1) if m else '12'}`.")
    else:
        why = (f"torch's pip wheels load {lib} from the nvidia-* pip packages "
               "(nvidia-cudnn-cu12, nvidia-cublas-cu12, ...); they are missing or not where torch "
               "looks (an install with --no-deps, an interrupted one, or pip splitting lib and "
               "lib64).")
        fix = (f"Reinstall torch with its dependencies: {_reinstall_torch(plan, host)}. Do not "
               "point LD_LIBRARY_PATH at a system CUDA to paper over it.")
    return {"lib_why": why, "lib_fix": fix}


def _glibc(values: Mapping[str, str], facts: HostFacts | None, plan: Plan | None, host: str,
           text: str) -> dict[str, str]:
    need = values.get("need", "")
    have = facts.glibc if facts is not None else None
    out = {"glibc_have": f"; this host has glibc {have}" if have else ""}
    releases = load_compat().releases
    if have:
        fits = [r for r in releases if r.glibc <= dotted(have)]
    elif need:
        fits = [r for r in releases if r.glibc < dotted(need)]
    else:
        fits = []
    out["glibc_torch"] = (f"the newest torch whose wheels run there is {fits[0].version} (glibc "
                          f"{'.'.join(map(str, fits[0].glibc))})" if fits else
                          "no torch release in gpu-provision's table runs on it")
    return out


def _pip_no_match(values: Mapping[str, str], facts: HostFacts | None, plan: Plan | None,
                  host: str, text: str) -> dict[str, str]:
    req = values.get("req", "")
    notes = []
    py = re.search(r"\bPython (3\.\d+)", text) or re.search(r"\bcp3(\d+)\b", text)
    python = (py.group(1) if py.group(1).startswith("3.") else f"3.{py.group(1)}") if py else None
    m = re.match(r"torch(?:===?(?P<ver>\d+\.\d+(?:\.\d+)?))?(?:\+\w+)?$", req)
    releases = load_compat().releases
    index = re.search(r"download\.pytorch\.org/whl/(cu\d+|cpu|rocm[\d.]+)\b", text)
    if m:
        if m.group("ver"):
            rel = next((r for r in releases if str(r.version) == m.group("ver")), None)
            what = f"torch {m.group('ver')}"
        elif index:
            rel = next((r for r in releases if index.group(1) in r.variants), None)
            what = f"the newest torch on the {index.group(1)} index, {rel.version}," if rel else ""
        else:
            rel, what = releases[0], f"the newest torch, {releases[0].version},"
        if rel is not None:
            lo, hi = (".".join(map(str, v)) for v in rel.python)
            notes.append(f"{what} has wheels for Python {lo} to {hi}")
    if python:
        notes.append(f"the Python in this log is {python}")
    if plan is not None and plan.torch is not None:
        notes.append(f"the wheel rule picks {plan.torch.label} for this host")
    return {"pip_note": (" (" + "; ".join(notes) + ")") if notes else ""}


def _forward_compat(values: Mapping[str, str], facts: HostFacts | None, plan: Plan | None,
                    host: str, text: str) -> dict[str, str]:
    if facts is not None and facts.driver and facts.driver_cuda:
        return {"driver_cuda_text": f" This host's driver {facts.driver} supports CUDA "
                                    f"{facts.driver_cuda} natively."}
    return {"driver_cuda_text": ""}


_SPECIFICS: dict[str, Specific] = {
    "fabric-manager-version": _fabric_manager,
    "fabric-manager-not-running": _fabric_manager,
    "fabric-manager-down": _fabric_manager,
    "gpu-ecc-error": _ecc,
    "gpu-fallen-off-bus": _fallen,
    "cuda-oom": _gpu_holders,
    "cublas-not-initialized": _gpu_holders,
    "cuda-lib-missing": _missing_lib,
    "torch-extension-abi": _extension,
    "glibc-too-old": _glibc,
    "pip-no-matching-distribution": _pip_no_match,
    "cuda-forward-compat": _forward_compat,
}


def read_logs(names: Sequence[str]) -> dict[str, str]:
    """``--log`` files by name (``-`` is standard input); an unreadable one is an error."""
    files = {}
    for name in names:
        if name == "-":
            files["stdin"] = sys.stdin.read()
            continue
        try:
            files[name] = Path(name).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ProvisionError(f"--log {name}: cannot read it ({exc.strerror})") from None
    return files
