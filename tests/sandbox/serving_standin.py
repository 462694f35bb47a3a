"""A model server's stand-in for CPU sandbox hosts: answers ``/v1/models`` (vLLM) and
``/api/tags`` (Ollama) with the documented bodies in tests/fixtures/serving/, 404 otherwise.
Stdlib only: it runs on the host with the env's python, as a job.

    python serving_standin.py PORT FIXTURE_DIR [READY_FILE]

``READY_FILE``: it answers 503 until this file exists (a model still loading after the port
opened), so a test decides when loading ends.
"""

from __future__ import annotations

import http.server
import sys
from pathlib import Path

ROUTES = {"/v1/models": "vllm-v1-models.json", "/api/tags": "ollama-api-tags.json"}


def main() -> None:
    port, folder = int(sys.argv[1]), Path(sys.argv[2])
    ready = Path(sys.argv[3]) if len(sys.argv) > 3 else None

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            name = ROUTES.get(self.path)
            if name is None:
                self.send_error(404)
                return
            if ready is not None and not ready.exists():
                self.send_error(503, "loading the model")
                return
            body = (folder / name).read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    print(f"serving on 127.0.0.1:{port}", flush=True)
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
