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
        if "nounits" in fmt or loop_seconds(args) is not None:
            return sample_rows(fields, fmt, gpu, drv, loop_seconds(args))
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


def loop_seconds(args: list[str]) -> float | None:
    """``-l N`` / ``--loop=N`` (seconds) or ``-lms N`` / ``--loop-ms=N``: sample again and again."""
    for i, a in enumerate(args):
        for flag, scale in (("-l", 1.0), ("--loop", 1.0), ("-lms", 0.001), ("--loop-ms", 0.001)):
            if a == flag and i + 1 < len(args):
                return float(args[i + 1]) * scale
            if a.startswith(flag + "="):
                return float(a.split("=", 1)[1]) * scale
    return None


def sample_rows(fields: list[str], fmt: str, gpu: dict, drv: dict, loop: float | None) -> int:
    """--query-gpu with nounits and/or a loop, as nvidia-smi prints them: the captured rows each
    time (a sample of an idle GPU), the unit dropped from each cell whose header names one, and
    the sample's own timestamp in nvidia-smi's format."""
    units = {f: gpu["units"][f].rsplit("[", 1)[1].rstrip("]") for f in fields
             if "[" in gpu["units"].get(f, "")}
    while True:
        now = time.time()
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
        out = io.StringIO()
        if "noheader" not in fmt:
            out.write(", ".join(f if "nounits" in fmt else gpu["units"].get(f, f) for f in fields) + "\n")
        for row in gpu["rows"]:
            row = dict(row, driver_version=drv["loaded"], timestamp=stamp)
            cells = [str(row.get(f, "[N/A]")) for f in fields]
            if "nounits" in fmt:
                cells = [c.removesuffix(" " + units[f]) if f in units else c
                         for f, c in zip(fields, cells, strict=True)]
            out.write(", ".join(cells) + "\n")
        try:
            sys.stdout.write(out.getvalue())
            sys.stdout.flush()
        except BrokenPipeError:  # the reader went away, as it ends nvidia-smi -l
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        if loop is None:
            return 0
        time.sleep(loop)


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


def main() -> int:
    tool = os.path.basename(sys.argv[0])
    args = sys.argv[1:]
    log_call(tool, args)
    st = State()
    if tool == "nvidia-smi" and loop_seconds(args) is not None:
        st.close()  # it samples until its reader goes: it must not hold the state's lock
        return nvidia_smi(args, st.data)
    try:
        rc = TOOLS[tool](args, st.data)
        st.save()
        return rc
    finally:
        st.close()


if __name__ == "__main__":
    sys.exit(main())
