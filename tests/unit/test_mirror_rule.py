"""One rule for every download from a mirror (templates/setup/_first_mirror.sh.j2, install_tries
in _install.sh.j2, the plan's probe in provision/setup/mirrors.py), run by real bash, curl and
pip against loopback web servers that answer as bad mirrors do: a captive portal's sign-in page
on every path, a port that refuses connections, a 404 for a file its page lists, a wheel served
with the wrong bytes under its genuine sha256. Each is named with what it did, and the next
mirror is used; a refused one is named at once, not after the timeout."""

from __future__ import annotations

import hashlib
import http.server
import io
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.config.inventory import Target, settings_for
from provision.config.recipes import load_platform
from provision.remote.command import quote
from provision.remote.templating import render
from provision.setup.mirrors import Download, Probe, downloads, parse_answers, probe_script
from provision.setup.plan import make_plan
from tests.cases import captured
from tests.sandbox.mirror import SIGNIN, TAMPERED, refused_url

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="runs the steps' bash and curl")

WHEEL = "tinypkg-1.0-py3-none-any.whl"
SIGNED = 'not an index: text/html "Please sign in to use this network Sign..."'


def tiny_wheel() -> bytes:
    files = {"tinypkg/__init__.py": "VALUE = 42\n",
             "tinypkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
             "tinypkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
                                            "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    files["tinypkg-1.0.dist-info/RECORD"] = "".join(f"{n},,\n" for n in files) + \
        "tinypkg-1.0.dist-info/RECORD,,\n"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return out.getvalue()


class Mirrors(http.server.BaseHTTPRequestHandler):
    """``/good/``: an index (``pip/``, ``tinypkg/``) and its wheel, and a gzip archive;
    ``/signin/...``: the sign-in page on every path; ``/liar/``: the same index, its wheel's
    bytes altered; ``/gone/``: the same index, its wheel 404."""

    wheel = tiny_wheel()

    def log_message(self, *_: object) -> None:
        pass

    def send(self, body: bytes, ctype: str = "text/html", code: int = 200) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        kind, _, rest = self.path.strip("/").partition("/")
        digest = hashlib.sha256(self.wheel).hexdigest()
        if kind == "signin":
            return self.send(SIGNIN)
        if kind not in ("good", "liar", "gone"):
            return self.send(b"no such mirror", "text/plain", 404)
        if rest == "pip":
            return self.send(b'<a href="p.whl">pip-24.0-py3-none-any.whl</a>')
        if rest == "tinypkg":
            return self.send(f'<a href="/{kind}/files/{WHEEL}#sha256={digest}">{WHEEL}</a>'.encode())
        if rest == f"files/{WHEEL}" and kind != "gone":
            return self.send(self.wheel + (TAMPERED if kind == "liar" else b""),
                             "application/octet-stream")
        if rest == "tool.tgz":
            return self.send(b"\x1f\x8b\x08\x00" + bytes(20), "application/gzip")
        self.send(b"not found", "text/plain", 404)


@pytest.fixture(scope="module")
def web() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Mirrors)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def hung() -> Iterator[str]:
    """A port that takes connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()


def bash(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", **env})


def test_first_mirror_names_what_each_did_and_a_refused_one_at_once(web: str) -> None:
    refused = refused_url()
    script = render("setup/_first_mirror.sh.j2", mirror_timeout=5) + "first_mirror pypi pip/ " + \
        " ".join(quote(u) for u in (f"{web}/signin", refused, f"{web}/none", f"{web}/good")) + "\n"
    t0 = time.monotonic()
    r = bash(script)
    took = time.monotonic() - t0
    assert r.returncode == 0 and r.stdout == f"{web}/good\n", r.stderr
    assert r.stderr.splitlines() == [
        f"mirror {web}/signin (pypi) failed: {SIGNED}; trying the next",
        f"mirror {refused} (pypi) failed: refused; trying the next",
        f"mirror {web}/none (pypi) failed: HTTP 404; trying the next"]
    assert took < 3, f"a refused connection took {took:.1f}s: it must not wait for the timeout"


def test_the_probe_asks_each_mirror_once_at_the_same_time(web: str, hung: str) -> None:
    refused = refused_url()
    probes = [Probe(f"{web}/signin", "pip/", "pip"), Probe(refused, "pip/", "pip"),
              Probe(hung, "pip/", "pip"), Probe(f"{web}/good", "pip/", "pip"),
              Probe(f"{web}/good", "missing.tgz", "", file=True),
              Probe(f"{web}/good", "tool.tgz", "", file=True)]
    t0 = time.monotonic()
    r = bash(probe_script(probes, 2))
    took = time.monotonic() - t0
    answers = parse_answers(r.stdout, len(probes))
    assert answers == [SIGNED, "refused", "no answer within 2s", "ok", "HTTP 404", "ok"], r.stderr
    assert took < 4, f"the probes took {took:.1f}s: they run at once, each within the timeout"
    pypi = Download("the recipe's packages", "pypi", tuple(probes[:4]), tuple(answers[:4]))
    assert pypi.used == f"{web}/good"
    assert pypi.line() == (f"{web}/signin {SIGNED}; {refused} refused; {hung} no answer within "
                           f"2s; {web}/good ok: the recipe's packages from {web}/good")
    dead = Download("ollama", "ollama", tuple(probes[4:5]), tuple(answers[4:5]))
    assert dead.used is None
    assert dead.line() == f"{web}/good HTTP 404: no listed mirror serves ollama"


def test_a_wheel_with_the_wrong_bytes_or_none_goes_to_the_next_mirror(tmp_path: Path,
                                                                     web: str) -> None:
    """Real pip: the first mirror's wheel is 404, the second's bytes do not match its sha256
    (pip's "THESE PACKAGES DO NOT MATCH THE HASHES"); both are named, the third installs."""
    py = tmp_path / "python"  # pip installs into a folder, not into this machine's venv
    py.write_text(f'#!/bin/bash\nexec {quote(sys.executable)} "$@" --target "$HOME/site"\n')
    py.chmod(0o755)
    script = "\n".join([
        "set -euo pipefail", f"py={quote(str(py))}", "tmp=$(mktemp -d)",
        render("setup/_first_mirror.sh.j2", mirror_timeout=5),
        render("setup/_install.sh.j2", uv=None, uv_mirrors=[], mirror_timeout=5,
               pip_reason="no uv here"),
        f"tries=({web}/gone/ {web}/liar/ {web}/good/)",
        "installer_ready", "install_tries pypi / '' tinypkg", 'echo "index: $index"'])
    r = bash(script, HOME=str(tmp_path), PIP_CONFIG_FILE="/dev/null", PIP_NO_CACHE_DIR="1")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert f"mirror {web}/gone (pypi) failed: HTTP 404; giving it up for this download" in out
    assert "DO NOT MATCH THE HASHES" in out  # pip's own words, then ours:
    assert f"mirror {web}/liar (pypi) failed: hash mismatch; giving it up for this download" in out
    assert out.rstrip().endswith(f"index: {web}/good/")
    assert (tmp_path / "site" / "tinypkg" / "__init__.py").read_text() == "VALUE = 42\n"


def test_every_mirror_failing_names_each_and_installs_nothing(tmp_path: Path, web: str) -> None:
    py = tmp_path / "python"
    py.write_text(f'#!/bin/bash\nexec {quote(sys.executable)} "$@" --target "$HOME/site"\n')
    py.chmod(0o755)
    refused = refused_url()
    script = "\n".join([
        "set -euo pipefail", f"py={quote(str(py))}", "tmp=$(mktemp -d)",
        render("setup/_first_mirror.sh.j2", mirror_timeout=5),
        render("setup/_install.sh.j2", uv=None, uv_mirrors=[], mirror_timeout=5,
               pip_reason="no uv here"),
        f"tries=({web}/liar/ {refused}/)", "installer_ready",
        "rc=0; install_tries pypi / '' tinypkg || rc=$?; echo \"rc=$rc\""])
    r = bash(script, HOME=str(tmp_path), PIP_CONFIG_FILE="/dev/null", PIP_NO_CACHE_DIR="1",
             PIP_RETRIES="0")
    assert "rc=6" in r.stdout, r.stdout + r.stderr
    assert (f"no listed pypi mirror served the download whole and genuine: {web}/liar (hash "
            f"mismatch); {refused} (refused); nothing was installed") in r.stderr
    assert not (tmp_path / "site" / "tinypkg").exists()


def test_the_plan_probes_what_each_of_its_downloads_will_ask() -> None:
    """A fresh CPU host: Miniconda's index on each miniconda mirror, the cpu variant's torch/
    page on each PyTorch mirror, pip/ on each PyPI mirror (pip.conf and the recipe's packages),
    the archive on each ollama mirror; a provisioned host, whose steps change nothing, none."""
    settings = settings_for(Target(name="box", host="h", settings={
        "packages": ["pycountry"], "tools": ["ollama"], "mirrors": {
            "miniconda": ["http://a/miniconda", "http://b/miniconda/"],
            "pytorch": ["http://a/whl", "http://b/whl"], "pypi": ["http://a/simple"],
            "ollama": ["http://a/ollama"]}}), None, {})
    plan = make_plan("box", captured("cpu-only"), settings, load_platform(settings.platform))
    got = {d.kind: (d.what, [(p.url, p.path, p.want, p.file) for p in d.probes])
           for d in downloads(plan)}
    assert got == {
        "miniconda": ("Miniconda", [("http://a/miniconda", "", "Miniconda3", False),
                                    ("http://b/miniconda", "", "Miniconda3", False)]),
        "pytorch": ("torch 2.14.1+cpu", [("http://a/whl/cpu", "torch/", "torch", False),
                                         ("http://b/whl/cpu", "torch/", "torch", False)]),
        "pypi": ("the recipe's packages", [("http://a/simple", "pip/", "pip", False)]),
        "ollama": ("ollama", [("http://a/ollama", "ollama-linux-amd64.tar.zst", "", True)])}
    done = make_plan("box", captured("cpu-only-bootstrapped"), settings_for(
        Target(name="box", host="h", settings={}), None, {}), load_platform("generic-vm"))
    assert [d.kind for d in downloads(done)] == []
