"""The clouds' instance metadata services on loopback, as a spot machine reads them for its
preemption notice, and a receiver for the notify: webhook. Built from the vendors' documents:

- AWS IMDSv2 (docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-
  service.html, spot-instance-termination-notices.html): ``PUT /latest/api/token`` with
  ``X-aws-ec2-metadata-token-ttl-seconds`` gives a token; every GET needs it in
  ``X-aws-ec2-metadata-token`` (401 without); ``/latest/meta-data/spot/instance-action`` is 404
  until the instance is marked, then ``{"action": "terminate", "time": "<UTC, two minutes on>"}``.
- GCP (cloud.google.com/compute/docs/metadata/querying-metadata): every request needs
  ``Metadata-Flavor: Google`` (403 without); ``/computeMetadata/v1/instance/preempted`` is FALSE,
  then TRUE; ``?wait_for_change=true`` holds the answer until the value changes (or
  ``timeout_sec``).
- Azure (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events): ``Metadata: true``
  (400 without) and an ``api-version``; ``/metadata/scheduledevents`` lists ``Events``, a Spot
  eviction being ``"EventType": "Preempt"`` with its ``NotBefore``.

``preempt()`` marks the instance; ``calls`` records what was asked (method, path, headers), and
``violations`` what a real service would have refused.
"""

from __future__ import annotations

import email.utils
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "AQAEAFTNrA4eEGx0AQgJ1arIq_Cc-t4tWt3fB0Hd8RKhXlKc5ccvhg=="  # an IMDSv2 token's shape


class MetadataApi:
    def __init__(self, ip: str = "127.0.0.1"):
        self.preempted = threading.Event()
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self.violations: list[str] = []
        self.at = 0.0
        # seconds a held GCP answer comes after the change: the guest's shutdown (an ACPI soft
        # off, sent with the notice) can begin before the watcher's read returns
        self.late = 0.0
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: str, ctype: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                api.calls.append(("PUT", self.path, dict(self.headers.items())))
                if self.path == "/latest/api/token" and \
                        self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(200, TOKEN)
                api.violations.append(f"PUT {self.path}: not a token request")
                self._send(400, "")

            def do_GET(self) -> None:
                api.calls.append(("GET", self.path, dict(self.headers.items())))
                path, _, query = self.path.partition("?")
                if path.startswith("/latest/"):
                    return self._aws(path)
                if path.startswith("/computeMetadata/"):
                    return self._gcp(path, query)
                if path.startswith("/metadata/"):
                    return self._azure(path, query)
                api.violations.append(f"GET {self.path}: no such metadata")
                self._send(404, "")

            def _aws(self, path: str) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                    api.violations.append(f"GET {path} without the IMDSv2 token")
                    return self._send(401, "")
                if path == "/latest/meta-data/spot/instance-action":
                    if not api.preempted.is_set():
                        return self._send(404, "")
                    t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(api.at + 120))
                    return self._send(200, json.dumps({"action": "terminate", "time": t}),
                                      "application/json")
                if path == "/latest/meta-data/instance-life-cycle":
                    return self._send(200, "spot")
                self._send(404, "")

            def _gcp(self, path: str, query: str) -> None:
                if self.headers.get("Metadata-Flavor") != "Google":
                    api.violations.append(f"GET {path} without Metadata-Flavor: Google")
                    return self._send(403, "")
                if path == "/computeMetadata/v1/instance/scheduling/preemptible":
                    return self._send(200, "TRUE")
                if path == "/computeMetadata/v1/instance/preempted":
                    if "wait_for_change=true" in query:
                        api.preempted.wait(20)
                        if api.preempted.is_set() and api.late:
                            time.sleep(api.late)
                    return self._send(200, "TRUE" if api.preempted.is_set() else "FALSE")
                self._send(404, "")

            def _azure(self, path: str, query: str) -> None:
                if self.headers.get("Metadata") != "true" or "api-version=" not in query:
                    api.violations.append(f"GET {path}?{query} without Metadata: true or an "
                                          "api-version")
                    return self._send(400, "")
                if path == "/metadata/scheduledevents":
                    events = []
                    if api.preempted.is_set():
                        events = [{"EventId": "A123BC45-1234-5678-AB90-ABCDEF123456",
                                   "EventType": "Preempt", "ResourceType": "VirtualMachine",
                                   "Resources": ["myspotvm"], "EventStatus": "Scheduled",
                                   "NotBefore": email.utils.formatdate(api.at + 30,
                                                                       usegmt=True),
                                   "Description": "", "EventSource": "Platform",
                                   "DurationInSeconds": -1}]
                    return self._send(200, json.dumps({"DocumentIncarnation": 1 + len(events),
                                                       "Events": events}), "application/json")
                if path == "/metadata/instance/compute/priority":
                    return self._send(200, "Spot")
                self._send(404, "")

        self.server = ThreadingHTTPServer((ip, 0), Handler)
        self.address = f"{ip}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def preempt(self) -> None:
        self.at = time.time()
        self.preempted.set()

    def close(self) -> None:
        self.preempted.set()  # a held GCP request ends
        self.server.shutdown()
        self.server.server_close()


class Webhook:
    """A webhook receiver on loopback: every POST's JSON body, in order."""

    def __init__(self, ip: str = "127.0.0.1"):
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n).decode()
                hook.headers.append(dict(self.headers.items()))
                try:
                    hook.bodies.append(json.loads(raw))
                except ValueError:
                    hook.bodies.append({"raw": raw})
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer((ip, 0), Handler)
        self.url = f"http://{ip}:{self.server.server_address[1]}/hook/T0K3N"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
