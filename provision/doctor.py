"""Match a host's state and error texts against the knowledge base of known failures.

The knowledge base (``provision/data/knowledge.yaml``) is data: signatures, diagnoses, fixes.
This module holds the named fact checks it refers to and fills in the fix with this host's
numbers (the wheel to reinstall, the first build with a GPU's architecture). Pure: no I/O but
reading the shipped YAML.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .compat import cc_text, first_build_with, parse_compute_cap
from .errors import ConfigError, ProvisionError
from .facts.host import HostFacts
from .paths import Traversable, data_file

if TYPE_CHECKING:
    from .plan import Plan

KNOWLEDGE = data_file("knowledge.yaml")
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
    both = [env for env, who in f.torch_installers.items() if "conda" in who and "pip" in who]
    return {"env": both[0]} if both else None


def _nvcc_differs(f: HostFacts) -> dict[str, str] | None:
    if not (f.nvcc and f.driver_cuda):
        return None
    if f.nvcc.split(".")[:2] == f.driver_cuda.split(".")[:2]:
        return None
    return {"nvcc": f.nvcc, "driver_cuda": f.driver_cuda}


CHECKS: dict[str, Check] = {
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


def _search(entry: Entry, texts: Mapping[str, str]) -> tuple[str, re.Match[str]] | None:
    for source, text in texts.items():
        for pattern in entry.match:
            m = pattern.search(text)
            if m:
                return source, m
    return None


def _line_of(text: str, m: re.Match[str]) -> str:
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    return text[start:end if end >= 0 else None].strip()[:200]


def diagnose(texts: Mapping[str, str], facts: HostFacts | None = None, plan: Plan | None = None,
             host: str = "<host>") -> list[Finding]:
    """Every entry whose signature is in ``texts`` (source -> text) and whose checks hold on
    ``facts``; entries with checks need facts. Ordered errors first."""
    findings: list[Finding] = []
    taken: set[str] = set()
    for entry in load_knowledge():
        if entry.group and entry.group in taken:
            continue
        values: dict[str, str] = {"host": host}
        evidence = ""
        if entry.match:
            hit = _search(entry, texts)
            if hit is None:
                continue
            source, m = hit
            values.update({k: v for k, v in m.groupdict().items() if v is not None})
            evidence = f"{source}: {_line_of(m.string, m)}"
        if entry.when:
            if facts is None:
                continue
            provided = [CHECKS[w](facts) for w in entry.when]
            if any(p is None for p in provided):
                continue
            for p in provided:
                values.update(p or {})
            evidence = evidence or "facts: " + ", ".join(entry.when)
        values.update(_specifics(entry.id, values, facts, plan, host))
        findings.append(Finding(entry.id, entry.level, _fill(entry.diagnosis, values),
                                _fill(entry.fix, values), evidence))
        if entry.group:
            taken.add(entry.group)
    return sorted(findings, key=lambda f: LEVELS.index(f.level))


def _fill(text: str, values: Mapping[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), text)


def _specifics(entry_id: str, values: Mapping[str, str], facts: HostFacts | None,
               plan: Plan | None, host: str) -> dict[str, str]:
    """The host-specific parts of a fix: the exact wheel, the first build with an arch."""
    choice = plan.torch if plan is not None else None
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
