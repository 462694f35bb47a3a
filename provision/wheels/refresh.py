"""Refresh the torch part of the compatibility data from a live PyTorch index, and diff it.

Reads ``<index>/<variant>/torch/`` for every known variant (PEP 691 JSON when the server offers
it, else PEP 503 HTML; the parsing is ``simpleindex``'s, which the torch step also runs on the
host), keeps Linux x86_64 CPython wheels, and compares the (release, variant,
python) sets with ``compat.yaml``.
"""

from __future__ import annotations

import copy
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from ..errors import ProvisionError
from .data import CompatData, dotted
from .simpleindex import ACCEPT, file_names, py_tag_text, served, variant_index


def list_files(url: str, timeout: float = 30) -> list[str]:
    """Wheel file names on one PEP 691/503 project page (empty when the page is absent)."""
    req = urllib.request.Request(url, headers={"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read().decode("utf-8", "replace")
            ctype = resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise ProvisionError(f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, TimeoutError) as exc:
        raise ProvisionError(f"{url}: cannot reach the index ({getattr(exc, 'reason', exc)})") from None
    return file_names(body, ctype)


@dataclass(frozen=True)
class IndexDiff:
    added: tuple[str, ...]  # "2.15.0+cu130 (python 3.10-3.14)"
    removed: tuple[str, ...]
    python_changed: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.python_changed)

    def lines(self) -> list[str]:
        return ([f"+ {a}" for a in self.added] + [f"- {r}" for r in self.removed]
                + [f"~ {p}" for p in self.python_changed])


def scan_index(base: str, variants: list[str]) -> dict[tuple[str, str], set[str]]:
    """(release, variant) -> python versions ("3.11") with a Linux x86_64 wheel."""
    found: dict[tuple[str, str], set[str]] = defaultdict(set)
    for variant in variants:
        files = list_files(variant_index(base, variant, "torch"))
        for ver, tags in served(files, "torch", variant, "x86_64").items():
            found[(ver, variant)].update(py_tag_text(t) for t in tags if t.startswith("cp"))
    return found


def diff_index(data: CompatData, found: dict[tuple[str, str], set[str]],
               variants: list[str]) -> IndexDiff:
    known = {(str(r.version), v): r for r in data.releases for v in [*r.variants, "cpu"]}
    added, removed, changed = [], [], []
    for key in sorted(found, key=lambda k: (Version(k[0]), k[1])):
        pys = sorted(found[key], key=dotted)
        span = f"python {pys[0]}-{pys[-1]}"
        if key not in known:
            added.append(f"{key[0]}+{key[1]} ({span})")
        else:
            r = known[key]
            lo, hi = ".".join(map(str, r.python[0])), ".".join(map(str, r.python[1]))
            if (pys[0], pys[-1]) != (lo, hi):
                changed.append(f"{key[0]}+{key[1]}: data says python {lo}-{hi}, index has {span}")
    for key in sorted(known, key=lambda k: (known[k].version, k[1])):
        if key[1] in variants and key not in found:
            removed.append(f"{key[0]}+{key[1]} (in the data, not on the index)")
    return IndexDiff(tuple(added), tuple(removed), tuple(changed))


def refreshed_yaml(raw: dict[str, Any], data: CompatData,
                   found: dict[tuple[str, str], set[str]]) -> tuple[dict[str, Any], list[str]]:
    """The compat data with what the index adds: new variants of known releases and new
    releases (python range from the wheels, arch list copied from the newest release that has
    the variant, torchvision unknown). Returns (new raw data, notes for the reviewer)."""
    out = copy.deepcopy(raw)
    releases: dict[str, Any] = out["releases"]
    notes = []
    for (ver, variant), pys in sorted(found.items(), key=lambda k: (Version(k[0][0]), k[0][1])):
        if variant == "cpu":
            continue
        arch = next((rel_raw["variants"][variant] for rel_raw in
                     (releases[str(r.version)] for r in data.releases)
                     if variant in rel_raw["variants"]), None)
        if arch is None:
            notes.append(f"{ver}+{variant}: no known arch list for {variant}; left out")
            continue
        span = sorted(pys, key=dotted)
        if ver not in releases:
            releases[ver] = {"torchvision": None, "torchaudio": None,
                             "python": [span[0], span[-1]], "glibc": "2.28",
                             "variants": {variant: arch}}
            notes.append(f"{ver}: new release; set torchvision/torchaudio by hand, arch lists "
                         f"copied from the newest release with the same variant")
        elif variant not in releases[ver]["variants"]:
            releases[ver]["variants"][variant] = arch
            notes.append(f"{ver}+{variant}: variant added (arch list {arch})")
    out["releases"] = dict(sorted(releases.items(), key=lambda kv: Version(kv[0]), reverse=True))
    return out, notes


def refresh(index: str | None) -> tuple[IndexDiff, dict[str, Any], list[str], str]:
    """Scan ``index`` (default pytorch.org) for every known variant: (the diff against the
    shipped data, the refreshed raw data, notes for the reviewer, the index read)."""
    import yaml

    from .data import compat_text, load_compat

    data = load_compat()
    base = index or data.default_index
    variants = sorted(data.variant_cuda) + ["cpu"]
    found = scan_index(base, variants)
    new, notes = refreshed_yaml(yaml.safe_load(compat_text()[0]), data, found)
    return diff_index(data, found, variants), new, notes, base


def write_refreshed(path: Path, raw: dict[str, Any], notes: list[str], index: str) -> None:
    """The refreshed data as YAML for review, written whole or not at all."""
    import yaml

    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"# refreshed from {index}; review, then replace provision/tables/compat.yaml\n"
                   + "".join(f"# {n}\n" for n in notes)
                   + yaml.safe_dump(raw, sort_keys=False, width=100))
    tmp.replace(path)
