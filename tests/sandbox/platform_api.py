"""The rental platforms' APIs on loopback, as sandbox hosts reach them: real curl, real TLS.

A sandbox host's /etc/hosts sends api.runpod.io, cloud.lambda.ai and console.vast.ai to this
server (one loopback address of its own, port 443), and its CA bundle trusts this server's test
CA (``attach``). Every call is checked against what the platform's documentation says the call
is: method, path, the ``Authorization: Bearer <key>`` header, ``Content-Type: application/json``
with a body, and the body itself; a call that differs is answered 400 and recorded in
``violations`` (a test asserts there are none). The answers replay what the platforms' docs show
(tests/fixtures/platform-api, SOURCES.md), per instance: ``ok`` (the stop is accepted and done:
``on_stop`` runs), ``noop`` (accepted, and nothing happens), ``401``, ``404``, ``410``, ``409`` (the
pod's status does not allow the action), ``429`` (over the rate limit once, with Retry-After,
then as ``ok``), ``503`` (a server error once, then as ``ok``); these answer the stop and the
terminate: the lookups (RunPod's getPod, Lambda's instance and instance list) answer as
``lookup`` says (``ok`` or an error code). A RunPod pod may be ``locked`` (getPod says so, and
every action is answered 409, as the Pod schema's `locked` "prevents stopping or resetting").
"""

from __future__ import annotations

import datetime
import json
import re
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .harness import FIXTURES, HostInfo
from .remote import ssh

HOSTS = ("api.runpod.io", "rest.runpod.io", "cloud.lambda.ai", "console.vast.ai")
ANSWERS = FIXTURES / "platform-api"


def _answer(name: str | None) -> Any:
    return None if name is None else json.loads((ANSWERS / name).read_text())


@dataclass
class Instance:
    platform: str  # runpod | lambda | vast
    id: str
    key: str
    mode: str = "ok"  # ok | noop | 401 | 404 | 410 | 409 | 429 | 503
    ip: str = ""  # lambda: the instance's address
    lookup: str = "ok"  # ok | 401 | 404: what getPod / Lambda's instance lookups answer
    locked: bool = False  # runpod: the pod's `locked`
    once: bool = False  # 429 and 503 have been answered once already
    on_stop: Callable[[], None] | None = None
    stopped: bool = False


@dataclass
class Call:
    method: str
    host: str
    path: str
    headers: dict[str, str]
    body: str
    status: int = 0


# method, host, path pattern, platform, what the body must be (None: no body), the action
ROUTES: list[tuple[str, str, str, str, Callable[[str], Any] | None, str]] = [
    # docs.runpod.io/api-reference-v2: podAction, deletePod, getPod
    ("POST", "api.runpod.io", r"/v2/pods/([^/]+)/action", "runpod",
     lambda _id: {"action": "stop"}, "stop"),
    ("DELETE", "api.runpod.io", r"/v2/pods/([^/]+)", "runpod", None, "terminate"),
    ("GET", "api.runpod.io", r"/v2/pods/([^/]+)", "runpod", None, "get"),
    # the retired v1 API (docs.runpod.io/api-reference-v2/migrate-from-v1)
    ("POST", "rest.runpod.io", r"/v1/pods/([^/]+)/stop", "runpod-v1", None, "stop"),
    # docs-api.lambda.ai/api/cloud: getInstance, terminateInstance
    ("GET", "cloud.lambda.ai", r"/api/v1/instances/([^/]+)", "lambda", None, "get"),
    ("GET", "cloud.lambda.ai", r"/api/v1/instances", "lambda", None, "list"),
    ("POST", "cloud.lambda.ai", r"/api/v1/instance-operations/terminate", "lambda",
     lambda i: {"instance_ids": [i]}, "terminate"),
    # docs.vast.ai/api-reference: manage instance (PUT state), destroy instance
    ("PUT", "console.vast.ai", r"/api/v0/instances/([^/]+)/", "vast",
     lambda _id: {"state": "stopped"}, "stop"),
    ("DELETE", "console.vast.ai", r"/api/v0/instances/([^/]+)/", "vast", None, "terminate"),
]

ERRORS: dict[str, dict[int, str | None]] = {  # platform -> status -> the answer's file
    "runpod": {401: "runpod-v2-401.json", 404: "runpod-v2-404.json", 410: "runpod-v2-410.json",
               409: "runpod-v2-409.json", 429: "runpod-v2-429.json", 503: None},
    "runpod-v1": {410: "runpod-v2-410.json"},
    "lambda": {401: "lambda-401.json", 404: "lambda-404.json", 410: "lambda-404.json",
               409: None, 429: None, 503: None},
    # vast.ai documents no error bodies
    "vast": {401: None, 404: None, 410: None, 409: None, 429: None, 503: None},
}


def _cert(folder: Path) -> tuple[Path, Path, Path]:
    """A test CA and a certificate it signed for every API host (made once per folder)."""
    ca_pem, crt, key = folder / "api-ca.pem", folder / "api.pem", folder / "api.key"
    if crt.exists():
        return ca_pem, crt, key
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-sandbox platform API CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv = (x509.CertificateBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTS[0])]))
           .issuer_name(ca_name).public_key(srv_key.public_key())
           .serial_number(x509.random_serial_number())
           .not_valid_before(now - datetime.timedelta(days=1))
           .not_valid_after(now + datetime.timedelta(days=30))
           .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in HOSTS]),
                          critical=False)
           .sign(ca_key, hashes.SHA256()))
    key.write_bytes(srv_key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    crt.write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return ca_pem, crt, key


def _free_address() -> str:
    for i in range(2, 250):
        ip = f"127.0.3.{i}"
        with socket.socket() as s:
            try:
                s.bind((ip, 443))
                return ip
            except OSError:
                continue
    raise RuntimeError("no free loopback address for the platform API")


class PlatformApi:
    def __init__(self, folder: Path):
        self.ca, crt, key = _cert(folder)
        self.instances: dict[tuple[str, str], Instance] = {}
        self.calls: list[Call] = []
        self.violations: list[str] = []
        self.lock = threading.Lock()
        self.ip = _free_address()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n).decode() if n else ""
                host = (self.headers.get("Host") or "").split(":")[0]
                call = Call(self.command, host, self.path, dict(self.headers.items()), body)
                status, answer = api.answer(call)
                call.status = status
                with api.lock:
                    api.calls.append(call)
                data = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                if status == 429:  # how long to wait (podAction 429)
                    self.send_header("Retry-After", "1")
                if data:
                    ctype = ("application/problem+json" if status >= 400 and
                             host.endswith("runpod.io") else "application/json")
                    self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

        self.server = ThreadingHTTPServer((self.ip, 443), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(crt), str(key))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def attach(self, info: HostInfo) -> None:
        """Send the host's requests for the platforms' API hosts here, and trust our CA."""
        lines = "".join(f"{self.ip} {h}\n" for h in HOSTS)
        ca = self.ca.read_text()
        ssh(info, f"sed -i '/ gpu-sandbox-api$/d' /etc/hosts; printf %s {_q(lines)} | "
                  "sed 's/$/ gpu-sandbox-api/' >> /etc/hosts; "
                  f"grep -q 'gpu-sandbox platform' /etc/ssl/certs/ca-certificates.crt || "
                  f"printf '%s\\n' '# gpu-sandbox platform API CA' {_q(ca)} "
                  ">> /etc/ssl/certs/ca-certificates.crt")

    def add(self, inst: Instance) -> Instance:
        with self.lock:
            self.instances[(inst.platform, inst.id)] = inst
        return inst

    def calls_for(self, instance_id: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if instance_id in c.path + c.body]

    def answer(self, call: Call) -> tuple[int, Any]:
        for method, host, pattern, platform, want, action in ROUTES:
            m = re.fullmatch(pattern, call.path)
            if host != call.host or not m:
                continue
            if method != call.method:
                continue
            iid = m.group(1) if m.groups() else _body_id(call.body)
            problem = self._check(call, want(iid) if want else None, iid)
            if problem:
                with self.lock:
                    self.violations.append(f"{call.method} {call.host}{call.path}: {problem}")
                return 400, {"problem": problem}
            if platform == "runpod-v1":  # retired: whatever the pod, the address is gone
                return 410, _answer(ERRORS[platform][410])
            if action == "list":  # the instances this key's account has
                with self.lock:
                    mine = [i for i in self.instances.values()
                            if i.platform == platform and i.key == _bearer(call)]
                if not mine:
                    return 401, _answer(ERRORS[platform][401])
                return 200, {"data": [self._lambda(i)["data"] for i in mine]}
            inst = self.instances.get((platform, iid))
            if inst is None:
                return 404, _answer(ERRORS[platform][404])
            mode = inst.lookup if action == "get" else inst.mode
            if _bearer(call) != inst.key or mode == "401":
                return 401, _answer(ERRORS[platform][401])
            if mode in ("404", "410"):
                return int(mode), _answer(ERRORS[platform][int(mode)])
            if action != "get" and (mode == "409" or inst.locked):
                return 409, _answer(ERRORS[platform][409])
            if mode in ("429", "503") and not inst.once:
                inst.once = True
                return int(mode), _answer(ERRORS[platform][int(mode)])
            return self._done(inst, action)
        with self.lock:
            self.violations.append(f"{call.method} {call.host}{call.path}: no such API call")
        return 404, None

    def _check(self, call: Call, want: Any, iid: str) -> str:
        auth = call.headers.get("Authorization") or ""
        if not re.fullmatch(r"Bearer \S+", auth):
            return f"Authorization {auth!r} is not 'Bearer <key>'"
        if want is None:
            return f"a body {call.body!r} where the call has none" if call.body else ""
        if (call.headers.get("Content-Type") or "").split(";")[0] != "application/json":
            return f"Content-Type {call.headers.get('Content-Type')!r}, not application/json"
        try:
            got = json.loads(call.body)
        except ValueError:
            return f"the body {call.body!r} is not JSON"
        return "" if got == want else f"the body {got!r}, not {want!r}"

    @staticmethod
    def _lambda(inst: Instance) -> Any:
        data = _answer("lambda-get-instance.json")
        data["data"].update(id=inst.id, ip=inst.ip)
        return data

    def _done(self, inst: Instance, action: str) -> tuple[int, Any]:
        if action == "get" and inst.platform == "lambda":  # with this instance's id and address
            return 200, self._lambda(inst)
        if action == "get":  # RunPod's pod as getPod shows it: its id, lock and actions
            pod = _answer("runpod-v2-pod.json")
            pod.update(id=inst.id, locked=inst.locked)
            if inst.stopped:
                pod.update(status="EXITED", actions=["start", "terminate"])
            return 200, pod
        if inst.mode == "ok" and not inst.stopped:
            inst.stopped = True
            if inst.on_stop:
                threading.Timer(0.5, inst.on_stop).start()  # after the answer, as a platform does
        if inst.platform == "runpod":
            return (204, None) if action == "terminate" else (200, _answer("runpod-v2-pod.json"))
        if inst.platform == "lambda":
            data = _answer("lambda-terminate.json")
            data["data"]["terminated_instances"][0]["id"] = inst.id
            return 200, data
        return 200, _answer("vast-success.json")


def _body_id(body: str) -> str:
    try:
        ids = json.loads(body or "{}").get("instance_ids") or [""]
        return str(ids[0])
    except (ValueError, AttributeError):
        return ""


def _bearer(call: Call) -> str:
    return (call.headers.get("Authorization") or "").removeprefix("Bearer ")


def _q(text: str) -> str:
    import shlex
    return shlex.quote(text)


@dataclass
class Stopper:
    """Stops a sandbox host as the platform's stop does: every process ends (hostd's reboot:
    a new boot id; the data dirs stay), and the machine comes back later (a resumed pod)."""

    info: HostInfo
    times: list[float] = field(default_factory=list)

    def __call__(self) -> None:
        import time

        from .harness import in_host
        self.times.append(time.time())
        in_host(self.info, "sh", "-c", "date +%s > /var/lib/gpu-sandbox/reboot-request")
