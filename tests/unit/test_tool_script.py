"""The step that installs a recipe's tool (templates/setup/tool.sh.j2, made by provision/ops/
tools.py), run by real bash, curl, zstd and tar against loopback web servers laid out as
Ollama's download folder: the first mirror that serves an archive this host can unpack wins, an
older release's .tgz is taken where no .tar.zst is served, an archive without the program
leaves the old install in place, and no mirror at all is one error naming each URL tried.
The archives are the sandbox mirror's stand-in (tests/sandbox/ollama_standin.py)."""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.config.inventory import Settings
from provision.config.recipes import Mirrors
from provision.ops.tools import tool_step
from tests.cases import captured
from tests.sandbox.ollama_standin import build

pytestmark = pytest.mark.skipif(sys.platform != "linux" or not all(
    shutil.which(p) for p in ("curl", "zstd", "gzip", "tar")),
    reason="runs the step's bash with curl, zstd, gzip and tar")


def serve(root: Path) -> Iterator[str]:
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def empty(tmp_path: Path) -> Iterator[str]:
    yield from serve(tmp_path / "empty")


@pytest.fixture
def old(tmp_path: Path) -> Iterator[str]:
    """A mirror of an older release: .tgz only."""
    url = serve(tmp_path / "old")
    base = next(url)
    build(tmp_path / "built")
    shutil.copy(tmp_path / "built" / "ollama-linux-amd64.tgz", tmp_path / "old")
    yield base
    next(url, None)


def run_step(home: Path, *mirrors: str) -> subprocess.CompletedProcess[str]:
    settings = Settings(platform="generic-vm", recipe="ollama", tools=("ollama",),
                        mirrors=Mirrors(ollama=mirrors, timeout=2))
    step = tool_step(captured("cpu-only"), settings, "ollama")
    assert step.body is not None
    return subprocess.run(["bash", "-c", step.body], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home)})


def test_the_first_mirror_with_an_archive_this_host_unpacks(tmp_path: Path, empty: str,
                                                             old: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    r = run_step(home, empty, old)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"mirror {empty} (ollama) has no ollama-linux-amd64.tar.zst: HTTP 404; trying the next",
        f"mirror {empty} (ollama) has no ollama-linux-amd64.tgz: HTTP 404; trying the next",
        f"mirror {old} (ollama) has no ollama-linux-amd64.tar.zst: HTTP 404; trying the next"]
    assert f"downloading {old}/ollama-linux-amd64.tgz" in r.stdout
    link = home / ".gpu-provision" / "bin" / "ollama"
    assert subprocess.run([str(link), "--version"], capture_output=True, text=True
                          ).stdout == "ollama version is 0.0.0-standin\n"
    assert (home / ".gpu-provision" / "tools" / "ollama" / "lib" / "ollama").is_dir()


def test_an_archive_without_the_program_keeps_the_old_install(tmp_path: Path, empty: str,
                                                              old: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert run_step(home, old).returncode == 0
    # the mirror now serves something else under the name (a captive portal's page, a wrong file)
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        tar.add(__file__, arcname="README")
    subprocess.run(["gzip", "-c"], stdin=bad.open("rb"), check=True,
                   stdout=(tmp_path / "old" / "ollama-linux-amd64.tgz").open("wb"))
    r = run_step(home, old)
    assert r.returncode == 3
    assert r.stderr.strip().splitlines()[-1] == ("ollama-linux-amd64.tgz holds no bin/ollama: "
                                                 "not the ollama release archive; the old "
                                                 "install is kept")
    prog = home / ".gpu-provision" / "tools" / "ollama" / "bin" / "ollama"
    assert subprocess.run([str(prog), "-v"], capture_output=True).returncode == 0
    assert not (home / ".gpu-provision" / "tools" / "ollama.new").exists()


def test_no_mirror_serves_it(tmp_path: Path, empty: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    r = run_step(home, empty, "http://127.0.0.1:9")
    assert r.returncode == 4
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("no ollama mirror serves an archive for this host: "
                           f"{empty}/ollama-linux-amd64.tar.zst (HTTP 404); ")
    assert "http://127.0.0.1:9/ollama-linux-amd64.tgz (refused);" in last  # port 9: closed
    assert last.endswith("set mirrors.ollama in the inventory or platform to one that does")
    assert not (home / ".gpu-provision" / "tools").exists()


def test_a_recipe_naming_an_unknown_tool_is_one_line(tmp_path: Path) -> None:
    from provision.config.recipes import load_recipe
    from provision.errors import ConfigError
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "mine.yaml").write_text("tools: [olama]\n")
    with pytest.raises(ConfigError) as e:
        load_recipe("mine", tmp_path)
    assert "'olama': no such tool (known: ollama)" in str(e.value)
    assert str(tmp_path / "recipes" / "mine.yaml") in str(e.value)
