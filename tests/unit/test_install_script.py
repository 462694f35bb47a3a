"""The install part of the torch and packages steps (templates/setup/_install.sh.j2) run by real bash and
curl against a loopback web server laid out like a PyPI mirror: our uv is fetched, checked by
sha256 and used with our indexes only; pip takes over, saying why, when uv cannot be had, and
nothing half-written is left in the tool dir. The uv wheel here is built by the test: its "uv" is
a script that records how it was called (the real uv runs in tests/sandbox/test_installer.py)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.ops.installer import load_uv
from provision.remote.command import quote
from provision.remote.templating import render

pytestmark = pytest.mark.skipif(sys.platform != "linux" or not shutil.which("curl"),
                                reason="runs bash scripts with curl and reads /proc/net/dev")

VERSION = "0.13.9"
FILE = f"uv-{VERSION}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
# the fake uv: answers --version, records every other call (argv and UV_* variables)
RECORDING_UV = f"""#!/bin/bash
[ "$1" = --version ] && {{ echo "uv {VERSION}"; exit 0; }}
{{ printf '%s\\n' "$@"; echo ==; env | grep '^UV_' | sort; }} > "$HOME/uv-call"
"""


def uv_wheel(dest: Path, script: str) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / FILE
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("uv/__init__.py", "")
        z.writestr(f"uv-{VERSION}.data/scripts/uv", script)
    return wheel


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, folder it serves)."""
    root = tmp_path / "web"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()


def mirror_with_uv(web: tuple[str, Path], href_style: str = "relative",
                   script: str = RECORDING_UV) -> str:
    """A PyPI mirror at <base>/simple whose uv/ page lists our wheel (the file lies elsewhere,
    as on PyPI and its mirrors); returns the wheel's sha256."""
    base, root = web
    wheel = uv_wheel(root / "packages" / "ab", script)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    href = {"relative": f"../../packages/ab/{FILE}", "root": f"/packages/ab/{FILE}",
            "absolute": f"{base}/packages/ab/{FILE}"}[href_style]
    (root / "simple" / "uv").mkdir(parents=True)
    (root / "simple" / "uv" / "index.html").write_text(
        f'<html><body>\n<a href="../../packages/cd/uv-0.12.0.tar.gz#sha256={"0" * 64}">'
        f'uv-0.12.0.tar.gz</a><br/>\n<a href="{href}#sha256={digest}" '
        f'data-requires-python="&gt;=3.8">{FILE}</a><br/>\n</body></html>\n')
    return digest


class Host:
    """A home for the script, and a Python for the env that records pip calls (anything else
    runs the real Python: the script unpacks the wheel with it)."""

    def __init__(self, tmp: Path) -> None:
        self.home = tmp / "home"
        self.home.mkdir()
        self.py = tmp / "python"
        self.py.write_text(f'#!/bin/bash\nif [ "$1" = -m ]; then printf "%s\\n" "$@" > '
                           f'"$HOME/pip-call"; exit 0; fi\nexec {quote(sys.executable)} "$@"\n')
        self.py.chmod(0o755)
        self.tools = self.home / ".gpu-provision" / "tools"

    def run(self, mirrors: list[str], sha256: str | None, commands: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        uv = None if sha256 is None else {"version": VERSION, "file": FILE, "sha256": sha256}
        script = "\n".join([
            "set -euo pipefail", f"py={quote(str(self.py))}",
            render("setup/_first_mirror.sh.j2", mirror_timeout=2),
            render("setup/_install.sh.j2", uv=uv, uv_mirrors=mirrors, mirror_timeout=2,
                   pip_reason="no uv wheel is pinned for ppc64le"),
            commands])
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(self.home), **(env or {})})

    def call(self, tool: str) -> list[str]:
        return (self.home / f"{tool}-call").read_text().splitlines()

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in self.tools.iterdir()) if self.tools.exists() else []


INSTALL = "installer_ready\ninstall_packages http://idx.example/simple/ '' torch==2.13.0 'a b'\n"


@pytest.mark.parametrize("href_style", ["relative", "root", "absolute"])
def test_uv_is_fetched_checked_and_used_with_our_indexes_only(tmp_path: Path, web: tuple[str, Path],
                                                              href_style: str) -> None:
    digest = mirror_with_uv(web, href_style)
    host = Host(tmp_path)
    # the host's own uv settings: an added index (searched before --index-url), a strategy
    hostile = {"UV_EXTRA_INDEX_URL": "http://pypi.example/simple", "UV_INDEX": "x=http://y/",
               "UV_INDEX_STRATEGY": "unsafe-best-match", "UV_CACHE_DIR": "/data/uv-cache"}
    r = host.run([f"{web[0]}/missing", f"{web[0]}/simple"], digest, INSTALL, env=hostile)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"downloading {web[0]}/packages/ab/{FILE}" in r.stdout
    assert f"sha256 ok: {digest}" in r.stdout
    assert f"installer: uv {VERSION}, fetched into {host.tools}/uv-{VERSION}" in r.stdout
    assert host.leftovers() == [f"uv-{VERSION}"]
    assert (host.tools / f"uv-{VERSION}" / "uv").stat().st_mode & 0o111
    assert host.call("uv") == ["pip", "install", "--no-config", "--python", str(host.py),
                               "--index-strategy", "first-index",
                               "--index-url", "http://idx.example/simple/", "torch==2.13.0", "a b",
                               "==", "UV_CACHE_DIR=/data/uv-cache", "UV_HTTP_TIMEOUT=2"]
    assert r.stdout.splitlines()[-1].startswith("received ")  # the progress line, at the end

    again = host.run([f"{web[0]}/simple"], digest, INSTALL)
    assert f"installer: uv {VERSION} ({host.tools}/uv-{VERSION}/uv)" in again.stdout
    assert "downloading" not in again.stdout


def test_a_constraints_file_reaches_uv_and_pip(tmp_path: Path, web: tuple[str, Path]) -> None:
    digest = mirror_with_uv(web)
    host = Host(tmp_path)
    cmd = "installer_ready\ninstall_packages '' /tmp/c.txt numpy\n"
    assert host.run([f"{web[0]}/simple"], digest, cmd).returncode == 0
    assert host.call("uv")[:10] == ["pip", "install", "--no-config", "--python", str(host.py),
                                    "--index-strategy", "first-index", "--constraint",
                                    "/tmp/c.txt", "numpy"]
    assert host.run([], None, cmd).returncode == 0
    assert host.call("pip") == ["-m", "pip", "install", "--no-input", "--progress-bar", "off",
                                "--disable-pip-version-check", "--timeout", "2", "-c",
                                "/tmp/c.txt", "numpy"]


def test_a_tampered_uv_is_refused_and_pip_installs(tmp_path: Path, web: tuple[str, Path]) -> None:
    mirror_with_uv(web)
    host = Host(tmp_path)
    r = host.run([f"{web[0]}/simple"], "f" * 64, INSTALL)
    assert r.returncode == 0, r.stderr
    got = hashlib.sha256((web[1] / "packages" / "ab" / FILE).read_bytes()).hexdigest()
    assert (f"installer: pip, as uv {VERSION} cannot be had: sha256 mismatch for {FILE} from "
            f"{web[0]}/simple: expected {'f' * 64}, got {got}") in r.stdout
    assert host.leftovers() == []  # nothing unpacked, no temporary folder left
    assert host.call("pip") == ["-m", "pip", "install", "--no-input", "--progress-bar", "off",
                                "--disable-pip-version-check", "--timeout", "2", "--index-url",
                                "http://idx.example/simple/", "torch==2.13.0", "a b"]
    assert not (host.home / "uv-call").exists()


@pytest.mark.parametrize("case", ["no uv page", "file not listed", "binary does not run"])
def test_pip_installs_when_uv_cannot_be_had(tmp_path: Path, web: tuple[str, Path],
                                            case: str) -> None:
    base = web[0]
    digest = mirror_with_uv(web, script="#!/bin/sh\nexit 1\n" if "run" in case else RECORDING_UV)
    mirrors = [f"{base}/simple"]
    if case == "no uv page":
        mirrors = [f"{base}/missing", f"{base}/other"]
    elif case == "file not listed":
        page = web[1] / "simple" / "uv" / "index.html"
        page.write_text(page.read_text().replace(f">{FILE}<", ">uv-0.13.9.tar.gz<"))
    why = {"no uv page": f"no PyPI mirror has it: {base}/missing (HTTP 404); {base}/other "
                         "(HTTP 404);",
           "file not listed": f"{base}/simple/uv/ lists no {FILE}",
           "binary does not run": f"the uv binary in {FILE} does not run on this host"}[case]
    host = Host(tmp_path)
    r = host.run(mirrors, digest, INSTALL)
    assert r.returncode == 0, r.stderr
    assert f"installer: pip, as uv {VERSION} cannot be had: {why}" in r.stdout
    assert host.leftovers() == []
    assert host.call("pip")[:3] == ["-m", "pip", "install"]


def test_pip_when_no_uv_wheel_is_pinned_for_the_arch(tmp_path: Path) -> None:
    host = Host(tmp_path)
    r = host.run([], None, INSTALL)
    assert r.returncode == 0, r.stderr
    assert "installer: pip (no uv wheel is pinned for ppc64le)" in r.stdout
    assert host.call("pip")[-2:] == ["torch==2.13.0", "a b"]


def test_a_failed_install_fails_the_step_with_its_exit_code(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.py.write_text('#!/bin/bash\necho "ERROR: No matching distribution found for torch"\n'
                       "exit 3\n")
    r = host.run([], None, INSTALL + "echo not reached\n")
    assert r.returncode == 3
    assert "No matching distribution" in r.stdout and "not reached" not in r.stdout
    assert r.stdout.splitlines()[-1].startswith("received ")


def test_progress_lines_while_it_runs_and_at_the_end(tmp_path: Path) -> None:
    host = Host(tmp_path)
    # the install ends only once a progress line was printed while it ran (no fixed sleep)
    host.py.write_text('#!/bin/bash\nuntil grep -q "^received " "$HOME/out"; do sleep 0.1; done\n'
                       'echo "install done"\n')
    r = host.run([], None, INSTALL.replace("'a b'", "'a b' > \"$HOME/out\""))
    assert r.returncode == 0, r.stderr
    lines = (host.home / "out").read_text().splitlines()
    done = lines.index("install done")
    assert any(ln.startswith("received ") for ln in lines[:done])
    assert lines[-1].startswith("received ")
    for ln in lines:
        if ln.startswith("received "):
            assert re.fullmatch(r"received \d+ MiB in \d+\.\ds \(\d+\.\d MiB/s\)", ln), ln


def test_the_pinned_uv_names_a_manylinux_wheel_and_its_sha256_per_arch() -> None:
    rel = load_uv()
    assert rel.source == f"https://pypi.org/pypi/uv/{rel.version}/json"
    assert sorted(rel.wheels) == ["aarch64", "x86_64"]
    for arch, wheel in rel.wheels.items():
        assert wheel.file.startswith(f"uv-{rel.version}-py3-none-manylinux_2_17_{arch}.")
        assert wheel.file.endswith(".whl") and wheel.size > 10_000_000
        assert re.fullmatch(r"[0-9a-f]{64}", wheel.sha256)
