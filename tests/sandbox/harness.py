"""Start and stop sandbox hosts: real OpenSSH servers on 127.0.0.x, one mount namespace each.

Everything a host changes lands in its own overlay upper dir under ``$GPU_SANDBOX_DIR``
(default ``/tmp/gpu-sandbox``); only the GPU, the driver, reboot and foreign package tools are
stand-ins (``standin.py``). Needs root, ``unshare`` and Debian's openssh-server.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FIXTURES = REPO / "tests" / "fixtures"
PROFILES = HERE / "profiles"
SSHD = "/usr/sbin/sshd"
HIDE_ALWAYS = ("/etc/pip.conf", "/etc/xdg/pip")

STANDINS_ALWAYS = ("lspci", "lsmod", "modprobe", "reboot", "shutdown", "systemd-detect-virt")
STANDINS_BY_TOOLS = {
    "apt": ("apt-get", "apt", "apt-cache", "dpkg-query", "apt-mark", "update-initramfs"),
    "yum": ("yum", "rpm", "dracut"),  # CentOS 7: yum 3, no dnf
    "dnf": ("dnf", "yum", "rpm", "dracut"),  # EL 8/9: yum is dnf
    "none": (),
}


def sandbox_dir() -> Path:
    return Path(os.environ.get("GPU_SANDBOX_DIR", "/tmp/gpu-sandbox"))


@contextmanager
def allocating() -> Iterator[None]:
    """Held while a host takes its name, address and port, or the mirror starts: test processes
    running side by side (pytest -n) share one sandbox dir and one mirror."""
    base = sandbox_dir()
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


# the hosts this process started and has not stopped: a test process running beside others
# stops only its own when it ends (stop_started); pytest -n's controller stops everything
# (stop_all) once they all have
_STARTED: list[str] = []


def why_unavailable() -> str | None:
    """None when sandbox hosts can run here, else the reason (tests skip with it)."""
    if sys.platform != "linux":
        return "sandbox hosts need Linux"
    if os.geteuid() != 0:
        return "sandbox hosts need root (mount namespaces, overlayfs, chroot)"
    if not Path(SSHD).exists():
        return f"{SSHD} missing: apt-get install openssh-server"
    for tool in ("unshare", "ssh-keygen", "nsenter", "sudo"):
        if not shutil.which(tool):
            return f"{tool} missing"
    probe = subprocess.run(["unshare", "--mount", "--uts", "true"], capture_output=True)
    if probe.returncode != 0:
        return f"cannot create mount namespaces: {probe.stderr.decode().strip()}"
    return None


@dataclass(frozen=True)
class HostInfo:
    id: str
    profile: str
    host: str
    port: int
    user: str
    key: str
    inventory: str
    root: str
    mirror: dict[str, str]
    pid: int

    @property
    def lib(self) -> Path:
        """The host's /var/lib/gpu-sandbox as seen from outside (its upper dir)."""
        return Path(self.root) / "upper/var/lib/gpu-sandbox"

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        """The stand-in calls recorded so far (optionally of one tool)."""
        log = self.lib / "calls.log"
        rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        return [r for r in rows if tool is None or r["tool"] == tool]

    def state(self) -> dict[str, Any]:
        return json.loads((self.lib / "state.json").read_text())  # type: ignore[no-any-return]

    def sessions(self) -> list[str]:
        """sshd's log of sessions: one 'Starting session: command ...' line per remote exec."""
        log = Path(self.root) / "upper/var/log/gpu-sandbox-sshd.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return [ln for ln in text.splitlines() if "Starting session:" in ln]

    def inventory_with(self, dest: Path, **changes: Any) -> str:
        """A copy of this host's inventory with some keys changed (a bad sha256, a proxy port)."""
        data = yaml.safe_load(Path(self.inventory).read_text())
        data.update(changes)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(yaml.safe_dump(data))
        return str(dest)

    def inventory_with_mirrors(self, dest: Path, mirrors: dict[str, Any], **changes: Any) -> str:
        """``inventory_with``, with some of its mirrors changed (the others kept)."""
        data = yaml.safe_load(Path(self.inventory).read_text())
        return self.inventory_with(dest, mirrors={**data["mirrors"], **mirrors}, **changes)

    def step_waited_on(self, step: str) -> bool:
        """A run's foreground is attached to ``step`` on the host: it holds the step's waiter
        lock (step.sh.j2), which a re-attaching run takes once the last one let go."""
        waiter = self.path(f"/root/.gpu-provision/steps/{step}.waiter")
        if not waiter.exists():
            return False
        with waiter.open("a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False

    def path(self, inside: str) -> Path:
        """A path of the host's file system, as it lies on this machine (for checks). A
        profile's ``disks`` are in the host's namespace only: read those with ``in_host``."""
        root = Path(self.root)
        disks = json.loads((root / "host.json").read_text()).get("disks", {})
        assert not any(inside == d or inside.startswith(d.rstrip("/") + "/") for d in disks), \
            f"{inside} lies on one of the host's own disks ({', '.join(disks)}): use in_host"
        for src, dst in host_binds(root):
            if inside == dst or inside.startswith(dst.rstrip("/") + "/"):
                return root / src / inside[len(dst):].lstrip("/")
        return root / "upper" / inside.lstrip("/")


def host_binds(root: Path) -> list[tuple[str, str]]:
    spec = json.loads((root / "host.json").read_text())
    return [tuple(b) for b in spec["binds"]]  # type: ignore[misc]


def load_profile(name: str) -> dict[str, Any]:
    path = PROFILES / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in PROFILES.glob("*.yaml")))
        raise SystemExit(f"no sandbox profile {name!r} (known: {known})")
    return yaml.safe_load(path.read_text())  # type: ignore[no-any-return]


def profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES.glob("*.yaml"))


def client_key() -> Path:
    key = sandbox_dir() / "id_ed25519"
    if key.exists():
        return key
    with allocating():
        if not key.exists():  # made under a temporary name: others see both files or none
            tmp = key.with_name("id_ed25519.new")
            for leftover in (tmp, tmp.with_suffix(".new.pub")):
                leftover.unlink(missing_ok=True)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpu-sandbox",
                            "-f", str(tmp)], check=True)
            tmp.with_suffix(".new.pub").rename(key.with_suffix(".pub"))
            tmp.rename(key)
    return key


def _free_port(ip: str, start: int) -> int:
    for port in range(start, start + 2000):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((ip, port))
                return port
            except OSError:
                continue
    raise RuntimeError(f"no free port on {ip}")


def _csv(path: Path, fields: list[str] | None = None) -> tuple[list[str], list[dict[str, str]]]:
    """A captured ``--query-gpu`` CSV: (header as printed, rows by field name). A capture made
    with ``noheader`` names its fields in the profile (``fields``), as its source's command did."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    header = fields or [h.strip() for h in lines[0].split(", ")]
    body = lines if fields else lines[1:]
    names = [h.split(" [")[0] for h in header]
    return header, [dict(zip(names, (c.strip() for c in ln.split(", ")), strict=True)) for ln in body]


BUS_ID = r"([0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)"


def _rows_from_q(text: str) -> list[dict[str, str]]:
    """The --query-gpu fields a captured ``nvidia-smi -q`` holds, one row per GPU in its order
    (which is nvidia-smi's index). A small reader of the capture, not the product's parser."""
    rows: list[dict[str, str]] = []
    section = ""
    for ln in text.splitlines():
        if m := re.match(rf"^GPU {BUS_ID}$", ln):
            rows.append({"index": str(len(rows)), "pci.bus_id": m.group(1)})
            continue
        if not rows:
            continue
        if re.match(r"^    \S", ln):
            section = ln.split(":")[0].strip()
        key, _, value = (x.strip() for x in ln.partition(":"))
        if section == "Product Name" and key == "Product Name":
            rows[-1]["name"] = value
        elif key == "GPU UUID":
            rows[-1]["uuid"] = value
        elif section == "FB Memory Usage" and key in ("Total", "Used"):
            rows[-1][f"memory.{key.lower()}"] = value
        elif section == "Utilization" and key == "Gpu":
            rows[-1]["utilization.gpu"] = value
    return rows


def _rows_from_table(text: str) -> list[dict[str, str]]:
    """The --query-gpu fields the default ``nvidia-smi`` table of a capture holds (index, name,
    bus id, memory used/total, utilization): its two lines per GPU."""
    rows: list[dict[str, str]] = []
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        m = re.match(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|\s+" + BUS_ID, ln)
        if not m or i + 1 >= len(lines):
            continue
        mem = re.search(r"(\d+)MiB /\s*(\d+)MiB", lines[i + 1])
        util = re.search(r"\|\s+(\d+)%\s+\S+\s+\|", lines[i + 1])
        row = {"index": m.group(1), "name": m.group(2), "pci.bus_id": m.group(4)}
        if mem:
            row.update({"memory.used": f"{mem.group(1)} MiB", "memory.total": f"{mem.group(2)} MiB"})
        if util:
            row["utilization.gpu"] = f"{util.group(1)} %"
        rows.append(row)
    return rows


def _gpu_rows(profile: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Rows the nvidia-smi stand-in answers --query-gpu with, from captures of the profile's GPU
    only: its full --query-gpu capture where there is one; else what its captured -q (or table)
    holds, with the compute capability from a captured --query-gpu of the same GPU model (a
    property of the model). A field no capture holds stays out: the stand-in prints [N/A]."""
    gpu = profile["gpu"]
    units = {"memory.total": "memory.total [MiB]", "memory.used": "memory.used [MiB]",
             "utilization.gpu": "utilization.gpu [%]"}
    if gpu.get("query_csv"):
        header, rows = _csv(FIXTURES / gpu["query_csv"])
        return rows, {h.split(" [")[0]: h for h in header if " [" in h}
    text = (FIXTURES / gpu.get("q", gpu["table"])).read_text()
    rows = _rows_from_q(text) if gpu.get("q") else _rows_from_table(text)
    for cap in gpu.get("cc_csv", []):
        _, model_rows = _csv(FIXTURES / cap["file"], cap.get("fields"))
        ccs = {r["name"]: r["compute_cap"] for r in model_rows}
        for row in rows:
            if row.get("name") in ccs:
                row["compute_cap"] = ccs[row["name"]]
    return rows, units


def _driver_cuda() -> dict[str, str]:
    """Driver branch -> the CUDA version nvidia-smi's header shows, read from the captured tables
    tests/fixtures/nvidia-smi/driver-branch-cuda.yaml names."""
    table = yaml.safe_load((FIXTURES / "nvidia-smi/driver-branch-cuda.yaml").read_text())
    out = {}
    for branch, name in table.items():
        m = re.search(r"CUDA (?:UMD )?Version:\s*([0-9.]+)", (FIXTURES / "nvidia-smi" / name).read_text())
        if not m:
            raise ValueError(f"no CUDA Version in the header of nvidia-smi/{name}")
        out[str(branch)] = m.group(1)
    return out


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _prepare(root: Path, hid: str, profile_name: str, profile: dict[str, Any], ip: str, port: int,
             password: str | None, reboot_delay: float) -> dict[str, Any]:
    for d in ("upper", "work", "merged", "home", "opt", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "home").chmod(0o700)
    up = root / "upper"
    lib = up / "var/lib/gpu-sandbox"
    (lib / "fixtures").mkdir(parents=True, exist_ok=True)

    # os-release (both the /etc link and its target), hidden container markers
    osr = (FIXTURES / profile["os_release"]).read_text()
    _write(up / "etc/os-release", osr)
    _write(up / "usr/lib/os-release", osr)
    # the machine's own pip settings point at its local indexes: a host must not see them
    for hidden in [*profile.get("hide", []), *HIDE_ALWAYS]:
        target = up / hidden.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(target, 0o600 | 0o020000, os.makedev(0, 0))  # overlayfs whiteout

    # stand-ins
    standin = up / "usr/local/lib/gpu-sandbox/standin.py"
    standin.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "standin.py", standin)
    standin.chmod(0o755)
    tools = STANDINS_ALWAYS + STANDINS_BY_TOOLS[profile.get("package_tools", "apt")]
    # what the release offers (tests/fixtures/packages), the kernel it runs, its ubuntu-drivers
    if profile.get("release"):
        shutil.copy(FIXTURES / "packages" / f"{profile['release']}.txt", lib / "fixtures/packages.txt")
    if profile.get("uname"):
        shutil.copy(FIXTURES / profile["uname"], lib / "fixtures/uname.txt")
        tools += ("uname",)
    if profile.get("ubuntu_drivers"):
        shutil.copy(FIXTURES / profile["ubuntu_drivers"], lib / "fixtures/ubuntu-drivers-devices.txt")
        tools += ("ubuntu-drivers",)
    for name in ("yum-centos7-eol-mirrorlist-unreachable.txt", "apt-update-lists-lock-held.txt",
                 "apt-get-install-frontend-lock-held.txt", "dnf-module-enable-stream-switch.txt",
                 "modprobe-nvidia-key-rejected.txt", "mokutil-sb-state-enabled.txt"):
        shutil.copy(FIXTURES / "misc" / name, lib / "fixtures")
    shutil.copytree(FIXTURES / "login", lib / "fixtures/login")  # a login that is not root
    if profile.get("secure_boot") == "enabled" and profile.get("mokutil", True):
        tools += ("mokutil",)  # else the kernel enforces it, and nothing on the host says so
    for inside, capture in (profile.get("files") or {}).items():  # the distro's own files
        _write(up / inside.lstrip("/"), (FIXTURES / capture).read_text())
    for tool in tools:
        link = up / "usr/local/bin" / tool
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("/usr/local/lib/gpu-sandbox/standin.py")
    if profile.get("glibc"):  # a distro older than this machine: getconf tells its glibc
        _write(up / "usr/local/bin/getconf",
               f'#!/bin/sh\n[ "$1" = GNU_LIBC_VERSION ] && {{ echo "glibc {profile["glibc"]}"; '
               'exit 0; }\nexec /usr/bin/getconf "$@"\n', 0o755)

    # GPU state
    state: dict[str, Any] = {"virt": profile.get("virt", "kvm"), "nouveau": bool(profile.get("nouveau")),
                             "failure": profile.get("failure"), "boots": 0,
                             "driver": {"installed": profile.get("driver"),
                                        "loaded": profile.get("driver"), "packages": []},
                             "held": [], "processes": profile.get("processes", []),
                             "release": profile.get("release"), "pkgdb": {"installed": {}},
                             "secure_boot": profile.get("secure_boot")}
    if profile.get("failure_fixture"):
        state["failure_fixture"] = Path(profile["failure_fixture"]).name
        shutil.copy(FIXTURES / profile["failure_fixture"], lib / "fixtures")
    shutil.copy(FIXTURES / "nvidia-smi/fail-query-compute-cap-invalid-field.txt", lib / "fixtures")
    if profile.get("lspci"):
        lines = (FIXTURES / profile["lspci"]).read_text().splitlines(keepends=True)
        n = profile.get("lspci_lines")
        (lib / "fixtures/lspci.txt").write_text("".join(lines[:n] if n else lines))
        state["lspci"] = "lspci.txt"
    if profile.get("gpu"):
        gpu = profile["gpu"]
        rows, units = _gpu_rows(profile)
        fx = {}
        for key in ("table", "q", "qx", "list", "version"):
            if gpu.get(key):
                shutil.copy(FIXTURES / gpu[key], lib / "fixtures")
                fx[key] = Path(gpu[key]).name
        state["gpu"] = {"captured_driver": gpu["captured_driver"],
                        "captured_cuda": gpu.get("captured_cuda"), "fixtures": fx, "rows": rows,
                        "units": units, "no_compute_cap": bool(gpu.get("no_compute_cap"))}
        state["driver_cuda"] = _driver_cuda()
        if profile.get("driver"):
            nvsmi = up / "usr/bin/nvidia-smi"
            nvsmi.parent.mkdir(parents=True, exist_ok=True)
            nvsmi.symlink_to("/usr/local/lib/gpu-sandbox/standin.py")
    if profile.get("fabric_manager") is not None:  # an NVSwitch board (standin_fabric.py)
        from .standin_fabric import prepare as nvswitch_board
        nvswitch_board(up, lib, state, profile["fabric_manager"], FIXTURES)
    _write(lib / "state.json", json.dumps(state, indent=1))
    _write(lib / "calls.log", "")
    if profile.get("login"):  # a login that is not root: it reads the stand-ins' state too
        lib.chmod(0o777)      # (nvidia-smi answers any user; the privileged tools refuse it)
        for name in ("state.json", "calls.log"):
            (lib / name).chmod(0o666)
        _add_login(up, profile["login"])

    # sshd
    etc = up / "etc/gpu-sandbox"
    etc.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", hid,
                    "-f", str(etc / "ssh_host_ed25519_key")], check=True)
    _write(etc / "sshd_config", "\n".join([
        f"ListenAddress {ip}:{port}", "HostKey /etc/gpu-sandbox/ssh_host_ed25519_key",
        "PidFile none", "PermitRootLogin yes", "UsePAM no", "StrictModes no",
        f"PasswordAuthentication {'yes' if password else 'no'}",
        "KbdInteractiveAuthentication no", "AuthorizedKeysFile .ssh/authorized_keys",
        "LogLevel VERBOSE", "Subsystem sftp internal-sftp", "PrintMotd no", "PrintLastLog no",
        "MaxStartups 100:30:200", "MaxSessions 50", ""]))
    (up / "run/sshd").mkdir(parents=True, exist_ok=True)
    (up / "etc/modprobe.d").mkdir(parents=True, exist_ok=True)  # kmod's dir, on every distro
    (up / "var/log").mkdir(parents=True, exist_ok=True)
    pub = client_key().with_suffix(".pub").read_text()
    _write(root / "home/.ssh/authorized_keys", pub, 0o600)
    (root / "home/.ssh").chmod(0o700)
    if password:
        _set_password(up, password)

    binds = [["home", "/root"], ["opt", "/opt"], ["tmp", "/tmp"]]
    for i, d in enumerate(profile.get("dirs", [])):
        (root / f"data{i}").mkdir(exist_ok=True)
        binds.append([f"data{i}", d])
    (root / "boot_id").write_text(str(uuid.uuid4()) + "\n")
    spec = {"id": hid, "profile": profile_name, "binds": binds, "reboot_delay": reboot_delay,
            "hostname": profile.get("hostname", hid)}
    if profile.get("limits"):  # a container's limits, real ones (limited.py)
        from .limited import make, size_bytes
        lim = profile["limits"]
        spec["cgroups"] = make(hid, lim)
        spec["shm_bytes"] = size_bytes(lim["shm"]) if lim.get("shm") else None
        spec["nofile"] = lim.get("nofile")
    if profile.get("disks"):  # small disks, real ones: a tmpfs of each size (hostd.py)
        spec["disks"] = {str(k): str(v) for k, v in profile["disks"].items()}
    if profile.get("dmi"):  # a cloud's DMI strings (a capture under tests/fixtures/dmi)
        spec["dmi"] = yaml.safe_load((FIXTURES / profile["dmi"]).read_text())
    _write(root / "host.json", json.dumps(spec, indent=1))
    return spec


def _add_login(upper: Path, login: dict[str, Any]) -> None:
    """A user as cloud images and lab servers make them (``useradd -m``): passwd, group and
    shadow entries ("*": no password, yet not locked, so sshd lets its key in), a home with our
    key, and for ``sudo: true`` the rule cloud-init gives the default user of cloud images
    (its default user config: ``sudo: ["ALL=(ALL) NOPASSWD:ALL"]``, written to
    /etc/sudoers.d/90-cloud-init-users, mode 0440). Debian's real sudo then decides."""
    user, uid = login["user"], int(login.get("uid", 2001))
    for name, line in (("passwd", f"{user}:x:{uid}:{uid}::/home/{user}:/bin/bash"),
                       ("group", f"{user}:x:{uid}:"), ("shadow", f"{user}:*:20000:0:99999:7:::")):
        base = Path("/etc", name).read_text()
        _write(upper / "etc" / name, base.rstrip("\n") + f"\n{line}\n",
               0o640 if name == "shadow" else 0o644)
    home = upper / "home" / user
    _write(home / ".ssh/authorized_keys", client_key().with_suffix(".pub").read_text(), 0o600)
    for p in (home, home / ".ssh", home / ".ssh/authorized_keys"):
        os.chown(p, uid, uid)
    (home / ".ssh").chmod(0o700)
    if login.get("sudo"):
        _write(upper / "etc/sudoers.d/90-cloud-init-users",
               f"# User rules for {user}\n{user} ALL=(ALL) NOPASSWD:ALL\n", 0o440)


def _set_password(upper: Path, password: str) -> None:
    hashed = subprocess.run(["openssl", "passwd", "-6", password], capture_output=True,
                            text=True, check=True).stdout.strip()
    shadow = Path("/etc/shadow").read_text().splitlines()
    out = [f"root:{hashed}:" + ":".join(ln.split(":")[2:]) if ln.startswith("root:") else ln
           for ln in shadow]
    _write(upper / "etc/shadow", "\n".join(out) + "\n", 0o640)


def _wait_ssh(ip: str, port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((ip, port), timeout=1) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on {ip}:{port} did not come up in {timeout}s")


def wait_until(cond: Callable[[], object], what: str,
               proc: subprocess.Popen[str] | None = None, timeout: float = 120) -> None:
    """Poll ``cond`` until true; fail with ``what`` (and the run's output, if ``proc`` ended
    first)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc is None or proc.poll() is None, proc.communicate() if proc else ""
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def in_host(info: HostInfo, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command inside the host's namespace and chroot (not over SSH: setup only)."""
    return subprocess.run(["nsenter", "--mount", "--uts", "-t", str(info.pid), "chroot",
                           str(Path(info.root) / "merged"), *argv], capture_output=True,
                          text=True, check=check)


def start(profile_name: str, password: str | None = None, reboot_delay: float = 3,
          jump: bool = False, behind: HostInfo | None = None, **overrides: Any) -> HostInfo:
    """Start one sandbox host of ``profile_name`` (and the mirror, if not running).

    ``overrides`` replace profile keys for this host only (``failure="nvml_mismatch"``, say);
    ``reboot_delay`` is how long the host stays down when it reboots (seconds).

    ``jump``: a bastion: reachable here, its logins (and their ProxyJump channels) in a network
    namespace of its own (hostd.py). ``behind``: a host in that bastion's namespace, listening
    on 127.0.0.x there: nothing reaches it but through the bastion (a connection from here is
    refused), as a lab server behind a company's bastion. Such a host cannot reach the local
    mirror either.
    """
    from . import mirror
    problem = why_unavailable()
    if problem:
        raise SystemExit(f"sandbox unavailable: {problem}")
    profile = {**load_profile(profile_name), **overrides}
    base = sandbox_dir()
    base.mkdir(parents=True, exist_ok=True)
    mir = mirror.ensure()
    client_key()
    with allocating():
        n = 1
        while (base / "hosts" / f"{profile_name}-{n}").exists():
            n += 1
        hid = f"{profile_name}-{n}"
        root = base / "hosts" / hid
        used = {(p / "address").read_text() for p in (base / "hosts").glob("*")
                if (p / "address").exists()}
        ip = next(f"127.0.0.{i}" for i in range(10, 250) if f"127.0.0.{i}" not in used)
        port = _free_port(ip, 2222)
        root.mkdir(parents=True)
        (root / "address").write_text(ip)  # taken from here on, before sshd listens on it
        _STARTED.append(hid)
    _prepare(root, hid, profile_name, profile, ip, port, password, reboot_delay)
    spec = json.loads((root / "host.json").read_text())
    spec["listen"] = [ip, port]
    if jump:
        spec["jump"] = [ip, port]
    (root / "host.json").write_text(json.dumps(spec, indent=1))
    log = open(root / "hostd.log", "ab")
    cgroups = [d for d, _ in json.loads((root / "host.json").read_text()).get("cgroups", [])]
    from .limited import join
    # a limited host's supervisor joins its cgroup first: the new cgroup namespace is rooted there
    # behind a bastion: in the network namespace its hostd made (there, the loopback is its own)
    netns = ["nsenter", f"--net=/proc/{behind.pid}/ns/net"] if behind else []
    proc = subprocess.Popen([*netns, "unshare", "--mount", "--uts", "--propagation", "private",
                             *(["--cgroup"] if cgroups else []),
                             sys.executable, str(HERE / "hostd.py"), str(root)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True,
                            preexec_fn=(lambda: join(cgroups)) if cgroups else None)
    (root / "hostd.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + 20
    while not (root / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sandbox host {hid} failed to start: "
                               f"{(root / 'hostd.log').read_text()[-2000:]}")
        time.sleep(0.05)
    hostd_pid = int((root / "ready").read_text())
    if behind is None:  # else hostd waited for it where it listens
        _wait_ssh(ip, port)
    key = str(client_key())
    inv = root / f"{hid}.yaml"
    user = (profile.get("login") or {}).get("user", "root")
    info = HostInfo(id=hid, profile=profile_name, host=ip, port=port, user=user, key=key,
                    inventory=str(inv), root=str(root), mirror=mir, pid=hostd_pid)
    inv.write_text(yaml.safe_dump({
        "host": ip, "port": port, "user": user, "key": key,
        "notes": f"sandbox host {hid} ({profile['description'].strip()})",
        "mirrors": {"miniconda": mir["miniconda"], "pypi": mir["pypi"],
                    "pytorch": mir["pytorch"], "ollama": mir["ollama"],
                    "conda_channels": [mir["conda"]]},
        **profile.get("inventory", {}),
    }, sort_keys=False))
    (root / "info.json").write_text(json.dumps(asdict(info), indent=1))
    if profile.get("conda_prefix"):
        mirror.preinstall_conda(info, profile["conda_prefix"])
    if profile.get("platform_torch"):
        from .platform_env import install_platform_torch
        install_platform_torch(info, profile["conda_prefix"], profile["platform_torch"])
    for spec in profile.get("image_torch") or []:  # what the image's build left elsewhere
        from .platform_env import install_image_torch
        install_image_torch(info, profile.get("conda_prefix"), spec)
    for path in profile.get("image_removes") or []:  # what the image's build left out (a glob)
        in_host(info, "sh", "-c", f"rm -rf {path}")
    return info


def running() -> list[HostInfo]:
    hosts = sandbox_dir() / "hosts"
    out = []
    for p in sorted(hosts.glob("*")) if hosts.exists() else []:
        if (p / "info.json").exists():
            out.append(HostInfo(**json.loads((p / "info.json").read_text())))
    return out


def stop(hid: str) -> None:
    """Stop one host, everything it started, and remove its files."""
    root = sandbox_dir() / "hosts" / hid
    if not root.exists():
        raise SystemExit(f"no sandbox host {hid!r}")
    pid_file = root / "hostd.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
                time.sleep(0.05)
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
            except ProcessLookupError:
                break
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if (root / "host.json").exists():
        from .limited import remove
        remove([d for d, _ in json.loads((root / "host.json").read_text()).get("cgroups", [])])
    shutil.rmtree(root, ignore_errors=True)
    if hid in _STARTED:
        _STARTED.remove(hid)


def stop_started() -> None:
    """Stop the hosts this process started (others' hosts and the mirror keep running)."""
    for hid in list(_STARTED):
        if (sandbox_dir() / "hosts" / hid).exists():
            stop(hid)
        else:
            _STARTED.remove(hid)


def hold_host_lock(info: HostInfo, step: str, seconds: int = 6) -> threading.Thread:
    """A provisioning step (``sleep``) holding the host lock, as a bootstrap's would: returns
    once the lock's owner file names it; join the thread to wait for its end."""
    from provision.config.inventory import Target
    from provision.remote.connection import connect
    from provision.remote.executor import Executor
    from provision.remote.runtime import run_detached

    direct = Target(name="box", host=info.host, port=info.port, user="root", key=info.key)
    holder = threading.Thread(target=lambda: run_detached(
        Executor(connect(direct), "box"), step, f"sleep {seconds}", inputs="h"))
    holder.start()
    owner = info.path("/root/.gpu-provision/locks/host.owner")
    wait_until(lambda: owner.exists() and f"step {step}" in owner.read_text(),
               "the host lock to be taken", timeout=30)
    return holder


def keeper_dir() -> Path:
    """Where the program's kept connections of the tests live: under the sandbox dir, so that a
    keeper left running is found like any other sandbox process (and stopped by stop_all).
    Ours alone (0700): the program uses no run dir that others can read, and a test's own run
    dir made below it first would otherwise leave it 0755."""
    d = sandbox_dir() / "k"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    d.chmod(0o700)
    return d


def keeper_pids(under: Path | None = None, program: str = "provision.remote.keeper"
                ) -> list[int]:
    """Keeper processes (python -m provision.remote.keeper RUN_DIR) whose run dir is under
    ``under`` (default: the sandbox dir); with ``program``, another of ours (the warm server)."""
    base = str(under or sandbox_dir())
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if program in args and any(a.startswith(base) for a in args):
            found.append(int(d.name))
    return found


WARM = "provision.cli.warm_server"


def stop_keepers(under: Path | None = None) -> None:
    """End the keepers and warm servers the tests started (their idle time may not have run
    out yet)."""
    def ours() -> list[int]:
        return keeper_pids(under) + keeper_pids(under, WARM)

    for pid in ours():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while ours() and time.monotonic() < deadline:
        time.sleep(0.05)


def stop_all() -> None:
    from . import mirror
    stop_keepers()
    for info in running():
        stop(info.id)
    hosts = sandbox_dir() / "hosts"
    if hosts.exists():
        for p in hosts.iterdir():
            stop(p.name)
    mirror.stop()
