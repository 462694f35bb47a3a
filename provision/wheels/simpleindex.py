"""Python package index pages (PEP 691 JSON, else PEP 503 HTML) -> the wheels they list, and
which torch releases (with their companions) a mirror serves for one Python.

Standard library only, and Python 3.8 syntax: the same file runs on the laptop
(``refresh-compat`` imports it) and on the host, where the torch step runs it as a script with
the env's own Python. There it reads the pages the step fetched (curl/wget), writes what the
mirror serves to a small cache under ``~/.gpu-provision/index/`` (one JSON line per mirror and
variant, which the facts read back), and picks the first of the plan's candidates the mirror
has. The plan applies the same ``pick`` to the cached answer, so both say the same thing.

Script use (on the host):
  python simpleindex.py scan CACHE_DIR BASE VARIANT PROJECT=PAGE_FILE...
      (PAGE_FILE.type holds the page's Content-Type; a missing file: the page was absent)
  python simpleindex.py pick CANDIDATES_JSON CACHE_FILE...
      prints the index URL, the lag note (or an empty line) and one requirement per line;
      exit 10: the next candidate's variant was not scanned yet; exit 5: none is served.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
import time
from html.parser import HTMLParser
from typing import Any
from urllib.parse import unquote

PEP691 = "application/vnd.pypi.simple.v1+json"
ACCEPT = f"{PEP691}, text/html;q=0.1"
PROJECTS = ("torch", "torchvision", "torchaudio")
# name-version(+local)(-build)-python-abi-platform.whl (PEP 427)
WHEEL_RE = re.compile(r"^(?P<name>[A-Za-z0-9_.]+?)-(?P<ver>\d[^-+]*?)(?:\+(?P<local>[A-Za-z0-9.]+))?"
                      r"(?:-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")
RELEASE_RE = re.compile(r"^\d+(?:\.\d+)*$")  # final releases only: no rc, dev or post
NEED_MORE, NONE_SERVED = 10, 5


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.files: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href") or ""
            self.files.append(unquote(href.split("#", 1)[0].rsplit("/", 1)[-1]))


def file_names(body: str, content_type: str = "") -> list[str]:
    """The file names one project page lists: PEP 691 JSON (by its Content-Type, or a body that
    is a JSON object) or PEP 503 HTML anchors."""
    if PEP691 in content_type or body.lstrip().startswith("{"):
        return [unquote(str(f.get("filename", ""))) for f in json.loads(body).get("files", [])]
    parser = _Links()
    parser.feed(body)
    return parser.files


def parse_wheel(name: str) -> dict[str, str] | None:
    """``torch-2.5.1+cu124-cp311-cp311-linux_x86_64.whl`` -> its parts; None for other files."""
    m = WHEEL_RE.match(name)
    if not m:
        return None
    return {k: v or "" for k, v in m.groupdict().items()}


def served(files: list[str], project: str, variant: str, arch: str) -> dict[str, list[str]]:
    """release -> the Python tags (``cp311``) with a wheel of ``project`` for Linux ``arch`` on a
    variant index. A local tag must be the variant's (a mirror of the default variant may name
    its CUDA builds without one); free-threaded builds and pre-releases are left out."""
    found: dict[str, set[str]] = {}
    want = project.replace("-", "_").lower()
    for name in files:
        w = parse_wheel(name)
        if w is None or w["name"].replace("-", "_").lower() != want:
            continue
        if not RELEASE_RE.match(w["ver"]) or w["abi"].endswith("t"):
            continue
        if (w["local"] or variant) != variant:
            continue
        plat = w["plat"]
        if plat != "any" and not ("linux" in plat and arch in plat):
            continue
        for tag in w["py"].split("."):
            found.setdefault(w["ver"], set()).add(tag)
    return {ver: sorted(tags) for ver, tags in found.items()}


def version_key(ver: str) -> tuple[int, ...]:
    return tuple(int(p) for p in ver.split("."))


def variant_index(base: str, variant: str, project: str = "") -> str:
    """THE spelling of a PyTorch index URL: ``<base>/<variant>/`` (the pip/uv index of one CUDA
    variant), or one project's page under it (``<base>/<variant>/torch/``)."""
    return f"{base.rstrip('/')}/{variant}/" + (f"{project}/" if project else "")


def cache_name(url: str) -> str:
    """The cache file of one variant index URL (``<base>/<variant>/``)."""
    return hashlib.sha256(url.encode()).hexdigest()[:16] + ".json"


def entry(base: str, variant: str, pages: dict[str, list[str] | None], arch: str,
          now: float) -> dict[str, Any]:
    """What one mirror serves on one variant index, as the cache keeps it. ``pages``: project
    -> the files its page listed, None when the page was absent (HTTP 404 and the like)."""
    base = base.rstrip("/")
    return {"v": 1, "url": variant_index(base, variant), "base": base, "variant": variant, "arch": arch,
            "at": int(now), "read": sorted(pages),
            "served": {p: served(files or [], p, variant, arch) for p, files in pages.items()}}


def has(e: dict[str, Any], project: str, version: str, py_tag: str) -> bool | None:
    """Does the cached ``e`` serve ``project`` ``version`` for ``py_tag``? None: not read."""
    if project not in e.get("read", ()):
        return None
    tags = e.get("served", {}).get(project, {}).get(version)
    return bool(tags) and (py_tag in tags or "py3" in tags)


def newest(e: dict[str, Any], py_tag: str) -> str | None:
    """The newest torch release ``e`` serves for ``py_tag``."""
    vers = [v for v, tags in e.get("served", {}).get("torch", {}).items()
            if py_tag in tags or "py3" in tags]
    return max(vers, key=version_key) if vers else None


def lag_note(first: dict[str, Any], e: dict[str, Any], py_tag: str) -> str:
    """"mirror X has no 2.14.1+cpu; newest there 2.13.0" (or what of the set it lacks)."""
    missing = [f"{p} {first[p]}" for p in ("torchvision", "torchaudio")
               if first.get(p) and has(e, p, first[p], py_tag) is False]
    what = f"{first['torch']}+{first['variant']}"
    if has(e, "torch", first["torch"], py_tag) is not False and missing:
        what += f" with {' and '.join(missing)}"
    there = newest(e, py_tag)
    return (f"mirror {e['base']} has no {what}; newest there {there or 'none'} (for python "
            f"{py_tag_text(py_tag)})")


def py_tag_text(tag: str) -> str:
    return f"{tag[2]}.{tag[3:]}" if re.match(r"^cp\d{2,}$", tag) else tag


def pick(candidates: list[dict[str, Any]], entries: list[dict[str, Any]], py_tag: str,
         stop_at_unread: bool = True) -> tuple[int, dict[str, Any] | None, str]:
    """The first candidate (``{"torch", "variant", "torchvision", "torchaudio"}``, best first;
    a companion set to null is not wanted) the mirror serves with its companions.

    ``entries``: what was read, one per variant (the newest per variant counts). Returns
    (0, candidate, lag note or ""), or (NEED_MORE, the candidate whose variant is unread, ""):
    with ``stop_at_unread`` that candidate cannot be judged yet (the step reads its variant
    next; the plan assumes it is served); or (NONE_SERVED, None, why)."""
    by_variant: dict[str, dict[str, Any]] = {}
    for e in sorted(entries, key=lambda x: x.get("at", 0)):
        by_variant[e["variant"]] = e
    for cand in candidates:
        found = by_variant.get(cand["variant"])
        if found is None:
            if stop_at_unread:
                return NEED_MORE, cand, ""
            continue
        wanted = ["torch"] + [p for p in ("torchvision", "torchaudio") if cand.get(p)]
        if all(has(found, p, cand["torch"] if p == "torch" else cand[p], py_tag) is not False
               for p in wanted):
            first = candidates[0]
            note = "" if cand is first else lag_note(
                first, by_variant.get(first["variant"], found), py_tag)
            return 0, dict(cand, index=found["url"].rstrip("/")), note
    if not candidates:
        return NONE_SERVED, None, "no candidates"
    for cand in candidates:  # torch is there, a companion it needs is not: say exactly that
        found = by_variant.get(cand["variant"])
        if found is None or not has(found, "torch", cand["torch"], py_tag):
            continue
        lacking = [p for p in ("torchvision", "torchaudio")
                   if cand.get(p) and has(found, p, cand[p], py_tag) is False]
        if lacking:
            return NONE_SERVED, None, (
                f"mirror {found['base']} has torch {cand['torch']}+{cand['variant']} but no "
                f"{' and no '.join(lacking)} for it: list another mirror first, or set "
                "domain_libraries: false")
    first, last = candidates[0], candidates[-1]
    bases = sorted({e["base"] for e in by_variant.values()})
    there = "; ".join(f"{v}: {newest(e, py_tag) or 'none'}" for v, e in sorted(by_variant.items()))
    return NONE_SERVED, None, (
        f"the PyTorch mirror {', '.join(bases)} serves none of the torch releases the rule allows "
        f"for python {py_tag_text(py_tag)} ({first['torch']}+{first['variant']} .. "
        f"{last['torch']}+{last['variant']}); newest there: {there}")


def requirements(cand: dict[str, Any]) -> list[str]:
    return [f"{p}=={cand['torch'] if p == 'torch' else cand[p]}" for p in PROJECTS
            if p == "torch" or cand.get(p)]


def _read_pages(specs: list[str]) -> dict[str, list[str] | None]:
    pages: dict[str, list[str] | None] = {}
    for spec in specs:
        project, _, path = spec.partition("=")
        if not os.path.exists(path):
            pages[project] = None
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            body = f.read()
        ctype = ""
        if os.path.exists(path + ".type"):
            with open(path + ".type", encoding="utf-8", errors="replace") as f:
                ctype = f.read()
        try:
            pages[project] = file_names(body, ctype)
        except ValueError:
            pages[project] = None  # neither JSON nor a page: as good as absent
    return pages


def main(argv: list[str]) -> int:
    py_tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    if argv[:1] == ["scan"] and len(argv) >= 4:
        cache_dir, base, variant = argv[1:4]
        e = entry(base, variant, _read_pages(argv[4:]), platform.machine(), time.time())
        os.makedirs(cache_dir, exist_ok=True)
        path = os.path.join(cache_dir, cache_name(e["url"]))
        with open(path + ".tmp", "w") as f:
            f.write(json.dumps(e, sort_keys=True) + "\n")
        os.replace(path + ".tmp", path)
        print(f"{e['url']}: torch {newest(e, py_tag) or 'none'} is the newest for python "
              f"{py_tag_text(py_tag)}")
        print(path)
        return 0
    if argv[:1] == ["pick"] and len(argv) >= 2:
        with open(argv[1]) as f:
            candidates = json.load(f)
        entries = []
        for path in argv[2:]:
            with open(path) as f:
                entries.append(json.loads(f.read()))
        rc, cand, note = pick(candidates, entries, py_tag)
        if rc == 0 and cand is not None:
            print(cand["index"])
            print(note)
            print("\n".join(requirements(cand)))
        elif rc == NONE_SERVED:
            print(note, file=sys.stderr)
        return rc
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
