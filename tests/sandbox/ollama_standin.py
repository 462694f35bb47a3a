"""Ollama's Linux release archive, as the local mirror serves it to CPU sandbox hosts.

The real archive (github.com/ollama/ollama @ fb307609, scripts/build_linux.sh: ``tar c -C
./dist/ bin lib | zstd``) holds ``bin/ollama`` and ``lib/ollama/`` (its GPU runners, about
1.5 GB). Here the same layout and names, with a small ``bin/ollama`` that does what the recipe's
job and ``forward`` need of the real one: ``ollama serve`` listens on ``$OLLAMA_HOST`` (unset:
127.0.0.1:11434, envconfig/config.go) and answers ``GET /`` with "Ollama is running"
(server/routes.go) and ``GET /api/tags`` with the documented model list
(tests/fixtures/serving/ollama-api-tags.json, docs/api.md "List Local Models"), replayed.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "serving" / "ollama-api-tags.json"

PROGRAM = '''#!/usr/bin/env python3
"""A stand-in for ollama (tests/sandbox/ollama_standin.py): `serve` and `--version` only."""
import http.server, os, sys

TAGS = %(tags)r

if sys.argv[1:] in (["-v"], ["--version"]):
    print("ollama version is 0.0.0-standin")
    sys.exit(0)
if sys.argv[1:] != ["serve"]:
    print("the sandbox's ollama stand-in knows `serve` and `--version` only", file=sys.stderr)
    sys.exit(2)
host = os.environ.get("OLLAMA_HOST") or "127.0.0.1:11434"
addr, _, port = host.rpartition(":")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/api/tags":
            body, kind = TAGS.encode(), "application/json; charset=utf-8"
        elif self.path == "/":
            body, kind = b"Ollama is running", "text/plain; charset=utf-8"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


print(f"Listening on {addr or '127.0.0.1'}:{port} (version 0.0.0-standin)", flush=True)
http.server.ThreadingHTTPServer((addr or "127.0.0.1", int(port)), Handler).serve_forever()
'''

ARCHES = ("amd64", "arm64")


def _tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, mode in (("bin", 0o755), ("lib", 0o755), ("lib/ollama", 0o755)):
            d = tarfile.TarInfo(name)
            d.type, d.mode = tarfile.DIRTYPE, mode
            tar.addfile(d)
        data = (PROGRAM % {"tags": FIXTURE.read_text()}).encode()
        f = tarfile.TarInfo("bin/ollama")
        f.size, f.mode = len(data), 0o755
        tar.addfile(f, io.BytesIO(data))
    return out.getvalue()


def build(folder: Path) -> list[str]:
    """Write ``ollama-linux-<arch>.tar.zst`` and ``.tgz`` into ``folder``; returns their names."""
    folder.mkdir(parents=True, exist_ok=True)
    raw = _tar()
    names = []
    for arch in ARCHES:
        base = folder / f"ollama-linux-{arch}"
        zst = subprocess.run(["zstd", "-q", "-c"], input=raw, capture_output=True, check=True)
        Path(f"{base}.tar.zst").write_bytes(zst.stdout)
        gz = subprocess.run(["gzip", "-c", "-n"], input=raw, capture_output=True, check=True)
        Path(f"{base}.tgz").write_bytes(gz.stdout)
        names += [f"{base.name}.tar.zst", f"{base.name}.tgz"]
    return names
