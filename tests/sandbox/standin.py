#!/usr/bin/python3 -I
"""Stand-ins for what a sandbox host cannot have: the GPU, the kernel driver, reboot, and the
package tools of distros this machine does not run.

One multi-call script, dispatched on the name it is called by (a symlink per tool). Each call is
appended to ``/var/lib/gpu-sandbox/calls.log`` (one JSON line: tool, argv, time) for tests to
read, and simulates its effect in ``/var/lib/gpu-sandbox/state.json``: installing an NVIDIA
driver package makes the next boot (or ``modprobe nvidia``) load that driver. nvidia-smi replays
the captured real outputs of the profile's GPU in ``/var/lib/gpu-sandbox/fixtures/``.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import sys
import time

ROOT = "/var/lib/gpu-sandbox"
STATE = f"{ROOT}/state.json"
STANDIN = "/usr/local/lib/gpu-sandbox/standin.py"

# Driver branch -> the release a stand-in package installs (versions seen in the captures).
BRANCH_VERSION = {"470": "470.256.02", "535": "535.183.01", "550": "550.144.03",
                  "560": "560.35.03", "570": "570.195.03", "575": "575.57.08",
                  "580": "580.82.09", "590": "590.48.01", "595": "595.71.05"}
# nvidia-smi exit codes are NVML return codes.
FAIL_RC = {"not_loaded": 9, "nvml_mismatch": 18, "no_devices": 6, "gpu_lost": 15,
           "unknown_error": 255}


class State:
    def __init__(self) -> None:
        self.fd = os.open(STATE, os.O_RDWR)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        with open(STATE) as f:
            self.data = json.load(f)

    def save(self) -> None:
        tmp = STATE + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, STATE)

    def close(self) -> None:
        os.close(self.fd)


def log_call(tool: str, argv: list[str]) -> None:
    with open(f"{ROOT}/calls.log", "a") as f:
        f.write(json.dumps({"tool": tool, "argv": argv, "time": time.time()}) + "\n")


def fixture(name: str) -> str:
    with open(f"{ROOT}/fixtures/{name}", encoding="utf-8") as f:
        return f.read()


def subst_versions(text: str, st: dict) -> str:
    """Replay a capture with the loaded driver's version and CUDA in place of the captured ones."""
    gpu = st["gpu"]
    loaded = st["driver"]["loaded"]
    if loaded and loaded != gpu["captured_driver"]:
        text = text.replace(gpu["captured_driver"], loaded)
        if gpu.get("captured_cuda"):
            new = st["driver_cuda"].get(loaded, gpu["captured_cuda"])
            text = re.sub(r"(CUDA (?:UMD )?Version\s*:\s*)" + re.escape(gpu["captured_cuda"]),
                          lambda m: m.group(1) + new, text)
            text = text.replace(f"<cuda_version>{gpu['captured_cuda']}</cuda_version>",
                                f"<cuda_version>{new}</cuda_version>")
    return text


def nvidia_smi(args: list[str], st: dict) -> int:
    failure = st.get("failure")
    if failure:
        sys.stdout.write(fixture(st["failure_fixture"]))
        return FAIL_RC[failure]
    drv = st["driver"]
    if not drv["loaded"]:
        sys.stdout.write("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                         "driver. Make sure that the latest NVIDIA driver is installed and "
                         "running.\n\n")
        return 9
    gpu = st["gpu"]
    joined = " ".join(args)
    q = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
    apps = next((a.split("=", 1)[1] for a in args if a.startswith("--query-compute-apps=")), None)
    fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "")
    if q is not None:
        fields = [f.strip() for f in q.split(",")]
        if "compute_cap" in fields and gpu.get("no_compute_cap"):
            sys.stdout.write(fixture("fail-query-compute-cap-invalid-field.txt"))
            return 2
        out = io.StringIO()
        if "noheader" not in fmt:
            out.write(", ".join(gpu["units"].get(f, f) for f in fields) + "\n")
        for row in gpu["rows"]:
            row = dict(row, driver_version=drv["loaded"])
            out.write(", ".join(str(row.get(f, "[N/A]")) for f in fields) + "\n")
        sys.stdout.write(out.getvalue())
        return 0
    if apps is not None:
        for p in st.get("processes", []):
            sys.stdout.write(f"{p['pid']}, {p['name']}, {p['used_memory']} MiB\n")
        return 0
    for flags, key in ((("-L",), "list"), (("-q", "-x"), "qx"), (("-q",), "q"), (("-a",), "q"),
                       (("--version",), "version")):
        if all(f in args for f in flags):
            name = gpu["fixtures"].get(key)
            if not name:
                sys.stderr.write(f"sandbox: no captured output of `nvidia-smi {joined}` for "
                                 f"this profile\n")
                return 3
            sys.stdout.write(subst_versions(fixture(name), st))
            return 0
    if args:
        sys.stderr.write(f"sandbox: `nvidia-smi {joined}` is not replayed\n")
        return 2
    sys.stdout.write(subst_versions(fixture(gpu["fixtures"]["table"]), st))
    return 0


def lspci(args: list[str], st: dict) -> int:
    text = fixture(st["lspci"]) if st.get("lspci") else ""
    if "-nn" not in args:
        text = re.sub(r" \[[0-9a-f]{4}\]:", ":", text)
        text = re.sub(r" \[[0-9a-f]{4}:[0-9a-f]{4}\]", "", text)
    sys.stdout.write(text)
    return 0


def lsmod(args: list[str], st: dict) -> int:
    print("Module                  Size  Used by")
    if st["driver"]["loaded"]:
        print("nvidia_uvm           1794048  0\nnvidia_drm             90112  0\n"
              "nvidia              60882944  2 nvidia_uvm,nvidia_drm")
    if st.get("nouveau"):
        print("nouveau              2686976  1")
    print("overlay               196608  0")
    return 0


def modprobe(args: list[str], st: dict) -> int:
    names = [a for a in args if not a.startswith("-")]
    remove = "-r" in args
    drv = st["driver"]
    for name in names:
        if name == "nouveau" and remove and st.get("nouveau"):
            print("modprobe: FATAL: Module nouveau is in use.", file=sys.stderr)
            return 1
        if name == "nvidia" and not remove:
            if not drv["installed"]:
                print(f"modprobe: FATAL: Module nvidia not found in directory /lib/modules/"
                      f"{os.uname().release}", file=sys.stderr)
                return 1
            if st.get("nouveau"):
                print("modprobe: ERROR: could not insert 'nvidia': No such device",
                      file=sys.stderr)
                return 1
            if drv["loaded"] and drv["loaded"] != drv["installed"]:
                print("modprobe: ERROR: could not insert 'nvidia': module in use by the "
                      "running driver " + drv["loaded"], file=sys.stderr)
                return 1
            drv["loaded"] = drv["installed"]
    return 0


def install_driver(st: dict, branch: str, package: str) -> None:
    version = BRANCH_VERSION.get(branch)
    if version is None:
        raise SystemExit(f"E: Unable to locate package {package}")
    st["driver"]["installed"] = version
    st["driver"]["packages"] = sorted(set(st["driver"]["packages"]) | {package})
    os.makedirs("/usr/bin", exist_ok=True)
    if not os.path.lexists("/usr/bin/nvidia-smi"):
        os.symlink(STANDIN, "/usr/bin/nvidia-smi")


APT_DRIVER = re.compile(r"^nvidia-driver-(\d+)(-server)?(-open)?(=.*)?$")
RPM_DRIVER = re.compile(r"^kmod-nvidia(?:-(\d+)xx)?$")


def words(args: list[str]) -> list[str]:
    """The non-option arguments (the verb, then packages); "-o Name=value" pairs skipped."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif not a.startswith("-"):
            out.append(a)
    return out


def apt_get(args: list[str], st: dict) -> int:
    if not args:
        return 100
    verb, *pkgs = words(args) or [""]
    if verb in ("update", "upgrade", "autoremove", "clean"):
        print("Reading package lists... Done")
        return 0
    if verb == "install":
        for pkg in pkgs:
            m = APT_DRIVER.match(pkg)
            if m:
                install_driver(st, m.group(1), pkg)
            elif pkg in ("nvidia-driver", "cuda-drivers", "nvidia-open"):
                install_driver(st, "535" if pkg == "nvidia-driver" else "580", pkg)
            else:
                st["packages"] = sorted(set(st.get("packages", [])) | {pkg})
            print(f"Setting up {pkg} ...")
        return 0
    if verb in ("remove", "purge"):
        return 0
    print(f"E: Invalid operation {verb}", file=sys.stderr)
    return 100


def ubuntu_drivers(args: list[str], st: dict) -> int:
    verb = next((a for a in args if not a.startswith("-")), "")
    if verb in ("list", "devices"):
        for b in ("535", "550", "570", "580"):
            print(f"nvidia-driver-{b}-server, (kernel modules provided by nvidia-dkms-{b}-server)")
        return 0
    if verb == "install":
        spec = next((a for a in args if a.startswith("nvidia:")), "nvidia:580-server")
        m = re.match(r"nvidia:(\d+)", spec)
        install_driver(st, m.group(1) if m else "580", "nvidia-driver-" + spec.split(":", 1)[1])
        return 0
    return 2


def dpkg_query(args: list[str], st: dict) -> int:
    pkgs = st["driver"]["packages"] + st.get("packages", [])
    fmt = args[args.index("-f") + 1] if "-f" in args else "${Package} ${Version} ${Status}\\n"
    for p in pkgs:
        line = fmt.replace("${Package}", p).replace("${Version}", st["driver"]["installed"] or "")
        sys.stdout.write(line.replace("${Status}", "install ok installed").replace("\\n", "\n"))
    return 0 if pkgs else 1


def apt_mark(args: list[str], st: dict) -> int:
    verb = next((a for a in args if not a.startswith("-")), "")
    if verb == "hold":
        st["held"] = sorted(set(st.get("held", [])) | set(args[args.index("hold") + 1:]))
        for p in args[args.index("hold") + 1:]:
            print(f"{p} set on hold.")
    elif verb == "showhold":
        for p in st.get("held", []):
            print(p)
    return 0


def yum(args: list[str], st: dict) -> int:
    verb = next((a for a in args if not a.startswith("-")), "")
    rest = args[args.index(verb) + 1:] if verb else []
    if verb == "install":
        for pkg in words(rest):
            m = RPM_DRIVER.match(pkg)
            if m:
                install_driver(st, m.group(1) or "550", pkg)  # ELRepo el7 ends at 550
            elif pkg in ("nvidia-driver", "cuda-drivers", "nvidia-open"):
                install_driver(st, st.get("module_stream", "580"), pkg)
            else:
                st["packages"] = sorted(set(st.get("packages", [])) | {pkg})
        return 0
    if verb == "module" and rest[:1] == ["enable"]:
        m = re.search(r"nvidia-driver:(\d+)", " ".join(rest))
        st["module_stream"] = m.group(1) if m else "580"
        return 0
    if verb == "versionlock":
        if rest[:1] == ["add"]:
            st["held"] = sorted(set(st.get("held", [])) | set(rest[1:]))
        elif rest[:1] == ["list"]:
            for p in st.get("held", []):
                print(p)
        return 0
    return 0


def rpm(args: list[str], st: dict) -> int:
    pkgs = st["driver"]["packages"] + st.get("packages", [])
    for p in pkgs:
        print(f"{p}-{st['driver']['installed'] or '0'}-1.el7_9.elrepo.x86_64")
    return 0 if pkgs or "--import" in args else 1


def reboot(args: list[str], st: dict) -> int:
    with open(f"{ROOT}/reboot-request", "w") as f:
        f.write(str(time.time()))
    return 0


def systemd_detect_virt(args: list[str], st: dict) -> int:
    print(st.get("virt", "none"))
    return 0 if st.get("virt", "none") != "none" else 1


TOOLS = {"nvidia-smi": nvidia_smi, "lspci": lspci, "lsmod": lsmod, "modprobe": modprobe,
         "apt-get": apt_get, "apt": apt_get, "ubuntu-drivers": ubuntu_drivers,
         "dpkg-query": dpkg_query, "apt-mark": apt_mark, "yum": yum, "dnf": yum, "rpm": rpm,
         "reboot": reboot, "shutdown": reboot, "systemd-detect-virt": systemd_detect_virt}


# --- Stopping a rented machine (autostop): a power-off, and the rental platforms' APIs -----------

SHUTDOWN_SCHEDULED = ("Shutdown scheduled for {when}, use 'shutdown -c' to cancel.\n")


def shutdown(args: list[str], st: dict) -> int:
    """systemd's shutdown(8): ``-r`` reboots (as ``reboot``); ``-c`` cancels a pending power-off;
    otherwise a power-off ("now", or no time: in a minute, announced as systemd's
    src/systemctl/systemctl-logind.c does). The sandbox host does not go down: the power-off is
    recorded in state.json (``power_off``) for tests, beside the call in calls.log."""
    if "-r" in args or "--reboot" in args:
        return reboot(args, st)
    if "-c" in args:
        st.pop("power_off", None)
        return 0
    when = next((a for a in args if not a.startswith("-")), "+1")
    if when != "now":
        at = time.time() + 60 * int(when.lstrip("+") or 1) if when.startswith("+") else time.time()
        sys.stderr.write(SHUTDOWN_SCHEDULED.format(
            when=time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime(at))))
    st["power_off"] = {"at": time.time(), "argv": args}
    return 0


# Each platform API autostop may call: (method, URL regex) -> (HTTP status, body) of a success,
# with the response shapes their documentation gives (tests/fixtures/SOURCES.md, "Platform APIs").
PLATFORM_API = [
    ("PUT", r"https://console\.vast\.ai/api/v0/instances/(\d+)/", 200, '{"success": true}'),
    ("DELETE", r"https://console\.vast\.ai/api/v0/instances/(\d+)/", 200, '{"success": true}'),
    ("POST", r"https://rest\.runpod\.io/v1/pods/([A-Za-z0-9]+)/stop", 200, ""),
    ("DELETE", r"https://rest\.runpod\.io/v1/pods/([A-Za-z0-9]+)", 200, ""),
    ("POST", r"https://cloud\.lambda(?:labs\.com|\.ai)/api/v1/instance-operations/terminate", 200,
     '{"data": {"terminated_instances": [{"id": "%s", "status": "terminating"}]}}'),
]
API_HOSTS = ("console.vast.ai", "rest.runpod.io", "cloud.lambdalabs.com", "cloud.lambda.ai")
REAL_CURL = "/usr/bin/curl"


def curl(args: list[str], st: dict) -> int:
    """curl: requests to a rental platform's API are answered here (and recorded in calls.log as
    tool "platform-api" with method, URL, Authorization header and body); anything else is the
    real curl. Understands the options autostop uses: -X, -H (also @- and @file), --data-raw/-d,
    -o, -w '%{http_code}', -s, -S, --max-time."""
    url = next((a for a in args if a.startswith(("http://", "https://"))), "")
    if not any(f"//{h}/" in url for h in API_HOSTS):
        os.execv(REAL_CURL, ["curl", *args])
    method, headers, body, out, fmt = "", [], None, None, ""
    it = iter(args)
    for a in it:
        if a in ("-X", "--request"):
            method = next(it)
        elif a in ("-H", "--header"):
            h = next(it)
            if h.startswith("@"):
                text = sys.stdin.read() if h == "@-" else open(h[1:]).read()
                headers += [x for x in text.splitlines() if x.strip()]
            else:
                headers.append(h)
        elif a in ("-d", "--data", "--data-raw"):
            body = next(it)
        elif a in ("-o", "--output"):
            out = next(it)
        elif a in ("-w", "--write-out"):
            fmt = next(it)
        elif a in ("--max-time", "-m"):
            next(it)
    method = method or ("POST" if body is not None else "GET")
    auth = next((h.split(":", 1)[1].strip() for h in headers
                 if h.lower().startswith("authorization:")), "")
    log_call("platform-api", [method, url, auth, body or ""])
    code, answer = 404, ""
    for m, pattern, status, text in PLATFORM_API:
        match = re.fullmatch(pattern, url)
        if match and m == method:
            code, answer = status, text
            if "%s" in text:
                ids = json.loads(body or "{}").get("instance_ids") or [""]
                answer = text % ids[0]
            break
    if code == 200 and not re.fullmatch(r"Bearer \S+", auth):
        code, answer = 401, ""
    if out:
        with open(out, "w") as f:
            f.write(answer)
    else:
        sys.stdout.write(answer)
    sys.stdout.write(fmt.replace("%{http_code}", str(code)))
    return 0


TOOLS.update({"shutdown": shutdown, "curl": curl})


def main() -> int:
    tool = os.path.basename(sys.argv[0])
    args = sys.argv[1:]
    log_call(tool, args)
    st = State()
    try:
        rc = TOOLS[tool](args, st.data)
        st.save()
        return rc
    finally:
        st.close()


if __name__ == "__main__":
    sys.exit(main())
