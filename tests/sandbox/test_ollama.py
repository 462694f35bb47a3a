"""The ollama recipe on a CPU sandbox host, end to end: bootstrap installs Ollama's release archive
from the mirror list (the first mirror has no such file, the second serves it), unpacked under
the home with no root; `run` starts the recipe's serving job; `forward` reaches `/api/tags`.

The archive is the mirror's stand-in (tests/sandbox/ollama_standin.py): Ollama's real names and
layout, a small `bin/ollama` that serves the documented model list."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import Hosts, gpu_provision
from tests.sandbox import harness, mirror
from tests.sandbox.test_hands import Running, _get, free_port

pytestmark = pytest.mark.sandbox
PORT = 11434  # the recipe's job: OLLAMA_HOST=127.0.0.1:11434, Ollama's own default


@dataclass(frozen=True)
class Served:
    info: harness.HostInfo
    inv: str
    home: Path  # the program's own folder (known_hosts) for this host
    log: str  # the ollama step's log, as bootstrap kept it here
    fetched: list[tuple[str, int]]  # the mirror's request lines for the archives, bytes sent


@pytest.fixture(scope="module")
def served(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A host bootstrapped with recipe ollama."""
    info = hosts.fresh("cpu-only")
    base = info.mirror["url"]
    inv = info.inventory_with_mirrors(
        tmp_path_factory.mktemp("inv") / "llm.yaml",
        {"ollama": [f"{base}/miniconda", info.mirror["ollama"]]}, recipe="ollama")
    home = tmp_path_factory.mktemp("gp-home")
    since = mirror.log_offset()
    boot = tmp_path_factory.mktemp("boot")
    r = gpu_provision("-H", inv, "bootstrap", home=home, cwd=boot, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [log] = (boot / "logs").glob("llm/*/ollama.log")
    yield Served(info, inv, home, log.read_text(),
                 [(line, n) for line, n in mirror.requests(since) if "ollama-linux" in line])
    harness.stop(info.id)


def test_bootstrap_installs_ollama_from_the_second_mirror(served: Served) -> None:
    info, inv, home = served.info, served.inv, served.home
    base = info.mirror["url"]
    assert (f"mirror {base}/miniconda (ollama) has no ollama-linux-amd64.tar.zst: HTTP 404; "
            "trying the next") in served.log
    # probed with HEAD, then the one archive fetched whole (zstd is on the host: the .tar.zst)
    size = (mirror._state_file().parent / "ollama" / "ollama-linux-amd64.tar.zst").stat().st_size
    assert [(line, n) for line, n in served.fetched if line.startswith("GET")] == \
        [("GET /ollama/ollama-linux-amd64.tar.zst HTTP/1.1", size)]
    prog = info.path("/root/.gpu-provision/tools/ollama/bin/ollama")
    assert prog.is_file() and os.access(prog, os.X_OK)
    assert info.path("/root/.gpu-provision/tools/ollama/lib/ollama").is_dir()
    assert os.readlink(info.path("/root/.gpu-provision/bin/ollama")) == \
        "/root/.gpu-provision/tools/ollama/bin/ollama"
    # `shell` (as a login does) finds it on PATH
    r = gpu_provision("-H", inv, "shell", "--", "bash", "-c", "command -v ollama; ollama -v",
                      home=home)
    assert r.stdout.splitlines() == ["/root/.gpu-provision/bin/ollama",
                                     "ollama version is 0.0.0-standin"], r.stderr
    # a second plan has nothing left for it (the journal)
    r = gpu_provision("-H", inv, "plan", "--json", home=home)
    plan = json.loads(r.stdout)
    assert "ollama" not in plan["changes"], plan["changes"]
    [d] = [d for d in plan["decisions"] if d["step"] == "ollama"]
    assert d["reason"] == "ollama installed at ~/.gpu-provision/tools/ollama (journal)"


def test_the_recipe_job_serves_and_forward_reaches_api_tags(served: Served,
                                                            tmp_path: Path) -> None:
    inv, home = served.inv, served.home
    with socket.socket() as s:  # the sandbox host shares this machine's ports
        assert s.connect_ex(("127.0.0.1", PORT)) != 0, f"port {PORT} is taken on this machine"
    r = gpu_provision("-H", inv, "run", "--json", "--no-code", home=home, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)["id"]
    local = free_port()
    env = dict(os.environ, GPU_PROVISION_HOME=str(home), COLUMNS="200")
    fwd = Running([sys.executable, "-m", "provision", "-H", inv, "forward", f"{PORT}:{local}"],
                  env, tmp_path)
    try:
        # the recipe's serve: check, without --check
        fwd.wait_line(r"GET /api/tags: 200 models: gemma3", timeout=60)
        status, body = _get(f"http://127.0.0.1:{local}/api/tags")
        assert status == 200 and json.loads(body)["models"][0]["name"] == "gemma3"
        assert _get(f"http://127.0.0.1:{local}/") == (200, b"Ollama is running")
        # the job's server listens on the host's loopback only
        listens = gpu_provision("-H", inv, "shell", "--", "bash", "-c",
                                f"ss -Hltn 'sport = :{PORT}' | awk '{{print $4}}'",
                                home=home).stdout
        assert listens.split() == [f"127.0.0.1:{PORT}"], listens
        assert fwd.stop() == 0
    finally:
        fwd.stop()
        gpu_provision("-H", inv, "kill", job, "--grace", "1", home=home)
