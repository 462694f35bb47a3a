"""refresh-compat against a local PyTorch-style index (PEP 503 HTML and PEP 691 JSON)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from provision.wheels.data import _load

ROOT = Path(__file__).resolve().parents[2]


def wheel(ver: str, variant: str, py: str) -> str:
    return f"torch-{ver}%2B{variant}-cp{py}-cp{py}-manylinux_2_28_x86_64.whl"


@pytest.fixture()
def index(tmp_path: Path) -> Iterator[str]:
    """cu126 as PEP 503 HTML; cu130 as PEP 691 JSON; nothing else."""
    html = [wheel("2.14.1", "cu126", p) for p in ("310", "311", "312", "313")]  # no 3.14
    (tmp_path / "cu126/torch").mkdir(parents=True)
    (tmp_path / "cu126/torch/index.html").write_text(
        "<html><body>" + "".join(f'<a href="/files/{w}#sha256=00">{w}</a>' for w in html) +
        '<a href="/files/torch-2.14.1%2Bcu126-cp313-cp313t-manylinux_2_28_x86_64.whl">t</a>'
        "</body></html>")
    js = [wheel(v, "cu130", p) for v in ("2.14.1", "2.15.0") for p in ("310", "311", "314")]

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *a: object, **k: object) -> None:
            super().__init__(*a, directory=str(tmp_path), **k)  # type: ignore[arg-type]

        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/cu130/torch/" and "vnd.pypi.simple.v1+json" in self.headers["Accept"]:
                body = json.dumps({"meta": {"api-version": "1.0"}, "name": "torch",
                                   "files": [{"filename": w.replace("%2B", "+"), "url": w}
                                             for w in js]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def refresh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provision", "refresh-compat", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_diff_against_local_index(index: str) -> None:
    r = refresh("--index", index, "--json")
    assert r.returncode == 0, r.stderr
    diff = json.loads(r.stdout)
    assert diff["added"] == ["2.15.0+cu130 (python 3.10-3.14)"]
    assert diff["python_changed"] == [
        "2.14.1+cu126: data says python 3.10-3.14, index has python 3.10-3.13"]
    assert "2.13.0+cu130 (in the data, not on the index)" in diff["removed"]
    assert "2.14.1+cu130 (in the data, not on the index)" not in diff["removed"]


def test_text_diff_and_write(index: str, tmp_path: Path) -> None:
    out = tmp_path / "compat-new.yaml"
    r = refresh("--index", index, "--write", str(out))
    assert r.returncode == 0, r.stderr
    assert "+ 2.15.0+cu130 (python 3.10-3.14)" in r.stdout
    assert "- 2.13.0+cu130" in r.stdout
    data = _load(out.read_text(), str(out))  # the written file is valid compat data
    new = next(rel for rel in data.releases if str(rel.version) == "2.15.0")
    assert data.releases[0] is new
    assert list(new.variants) == ["cu130"] and new.torchvision is None
    assert new.python == ((3, 10), (3, 14))
    assert "2.15.0: new release" in out.read_text()
    assert yaml.safe_load(out.read_text())["cuda_min_driver"]["12.8"] == "570.26"


def test_unreachable_index_is_one_line(tmp_path: Path) -> None:
    r = refresh("--index", "http://127.0.0.1:9/whl")
    assert r.returncode == 1 and "cannot reach the index" in r.stderr
    assert "Traceback" not in r.stderr
