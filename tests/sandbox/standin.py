#!/usr/bin/python3 -Iu
"""Stand-ins for what a sandbox host cannot have: the GPU, the kernel driver, the kernel's
identity, reboot, and the package tools of distros this machine does not run.

One multi-call script, dispatched on the name it is called by (a symlink per tool). Each call is
appended to ``/var/lib/gpu-sandbox/calls.log`` (one JSON line: tool, argv, time) for tests to
read. Every answer comes from captured real outputs and real package data in
``/var/lib/gpu-sandbox/fixtures/`` (cited in tests/fixtures/SOURCES.md), and every failure is the
real tool's failure, with its message and exit code:

- the package tools know exactly the packages of the profile's release (``packages.txt``: name,
  version, the packages it pulls in, whether it ships nvidia-smi or an nvidia.ko); an unknown
  name or verb fails as apt-get, yum or dnf fail. Installing simulates the effect in
  ``state.json``: a DKMS package gives a loadable module only where the headers of the running
  kernel are installed, a precompiled kmod always; a package that ships nvidia-smi puts it on PATH;
- ``ubuntu-drivers`` replays the host's captured ``ubuntu-drivers devices`` and installs the way
  ubuntu-drivers-common's own code does (its exit status included);
- ``nvidia-smi`` answers queries from rows built from captures of the profile's GPU, with the
  loaded driver's version and the CUDA version nvidia-smi shows for that driver branch;
- ``lspci`` replays its capture, with the kernel driver lines as the driver state makes them.
"""

from __future__ import annotations

import fcntl
import fnmatch
import io
import json
import os
import re
import struct
import subprocess
import sys
import time

ROOT = "/var/lib/gpu-sandbox"
STATE = f"{ROOT}/state.json"
STANDIN = "/usr/local/lib/gpu-sandbox/standin.py"
# nvidia-smi exit codes are NVML return codes.
FAIL_RC = {"not_loaded": 9, "nvml_mismatch": 18, "no_devices": 6, "gpu_lost": 15,
           "unknown_error": 255}


class State:
    def __init__(self) -> None:
        self.fd = os.open(STATE, os.O_RDWR)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        with open(STATE) as f:
            self.data = json.load(f)
        self.before = json.dumps(self.data, sort_keys=True)

    def save(self) -> None:
        if json.dumps(self.data, sort_keys=True) == self.before:
            return  # a read-only call leaves the host's files as they were
        tmp = STATE + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.chmod(tmp, os.stat(STATE).st_mode)  # a login that is not root reads it too
        os.replace(tmp, STATE)

    def close(self) -> None:
        os.close(self.fd)


def log_call(tool: str, argv: list[str]) -> None:
    with open(f"{ROOT}/calls.log", "a") as f:
        f.write(json.dumps({"tool": tool, "argv": argv, "time": time.time(),
                            "uid": os.geteuid()}) + "\n")


# What the privileged tools answer a login that is not root (tests/fixtures/login/, captured
# from Debian's apt 2.6.1 as `nobody`; kmod's modprobe reports init_module's EPERM as
# "could not insert '<module>': Operation not permitted" (kmod tools/modprobe.c); systemctl's
# reboot without polkit's consent fails with sd-bus's "Interactive authentication required."
# (systemd src/systemctl, the logind call's error)). Exit codes as the tools'.
NOT_ROOT = {
    ("apt-get", "update"): ("login/apt-get-update-nonroot-debian12.txt", 100),
    ("apt-get", "install"): ("login/apt-get-install-nonroot-debian12.txt", 100),
    ("apt-mark", "hold"): ("login/apt-mark-hold-nonroot-debian12.txt", 100),
}


def refuse_non_root(tool: str, args: list[str]) -> int | None:
    """The real tool's failure for a login that is not root; None where it may go on."""
    if os.geteuid() == 0:
        return None
    name = "apt-get" if tool == "apt" else tool
    verb = next((a for a in apt_words(args)), "") if name in ("apt-get", "apt-mark") else ""
    if (name, verb) in NOT_ROOT:
        fx, rc = NOT_ROOT[(name, verb)]
        sys.stderr.write(fixture(fx))
        return rc
    if name == "modprobe" and not any(a.startswith("-") for a in args):
        err(*(f"modprobe: ERROR: could not insert '{m}': Operation not permitted" for m in args))
        return 1
    if name in ("reboot", "shutdown"):
        err("Call to Reboot failed: Interactive authentication required.")
        return 1
    return None


def fixture(name: str) -> str:
    with open(f"{ROOT}/fixtures/{name}", encoding="utf-8") as f:
        return f.read()


def err(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# the kernel's identity: uname from the profile's captured `uname -a`


def kernel_release() -> str:
    return os.uname().release if not os.path.exists(f"{ROOT}/fixtures/uname.txt") else \
        fixture("uname.txt").split()[2]


def uname(args: list[str], st: dict) -> int:
    """``Linux NODE RELEASE VERSION... MACHINE PROCESSOR PLATFORM GNU/Linux``: the kernel fields
    replay the capture, the node name is this host's own."""
    words = fixture("uname.txt").split()
    # `uname -a` leaves out the processor and the hardware platform where they are "unknown"
    # (Debian, EL10: "... x86_64 GNU/Linux"; Ubuntu, EL7-9: "... x86_64 x86_64 x86_64 GNU/Linux")
    full = words[-4] == words[-3] == words[-2]
    machine = words[-4] if full else words[-2]
    release, version = words[2], " ".join(words[3:-4] if full else words[3:-2])
    fields = {"-s": "Linux", "-n": os.uname().nodename, "-r": release, "-v": version,
              "-m": machine, "-p": words[-3] if full else "unknown",
              "-i": words[-2] if full else "unknown", "-o": words[-1]}
    long = {"--kernel-name": "-s", "--nodename": "-n", "--kernel-release": "-r",
            "--kernel-version": "-v", "--machine": "-m", "--processor": "-p",
            "--hardware-platform": "-i", "--operating-system": "-o", "--all": "-a"}
    flags: list[str] = []
    for a in args or ["-s"]:
        a = long.get(a, a)
        if not re.fullmatch(r"-[snrvmpioa]+", a):
            err(f"uname: invalid option -- '{a.lstrip('-')[:1]}'",
                "Try 'uname --help' for more information.")
            return 1
        flags += [f"-{c}" for c in a[1:]]
    order = ["-s", "-n", "-r", "-v", "-m", "-p", "-i", "-o"]
    wanted = order if "-a" in flags else [f for f in order if f in flags]
    if "-a" in flags and not full:
        wanted = [f for f in wanted if f not in ("-p", "-i")]
    print(" ".join(fields[f] for f in wanted))
    return 0


# ---------------------------------------------------------------------------------------------
# the package data of the profile's release


class Pkg:
    def __init__(self, line: str) -> None:
        words = line.split()
        self.name, self.version = words[0], words[1]
        attrs = dict(w.split("=", 1) for w in words[2:])
        self.arch = attrs.get("arch", "amd64")
        self.repo = attrs.get("repo", "")
        self.epoch = attrs.get("epoch", "0")
        self.deps = [d for d in attrs.get("dep", "").split(",") if d]
        self.ships = set(attrs.get("ships", "").split(",")) - {""}
        self.modules = [m for m in attrs.get("module", "").split(",") if m]
        self.enables = attrs.get("enables", "")

    @property
    def upstream(self) -> str:
        """The driver version in the package version: 580.126.20 in 580.126.20-0ubuntu0.20.04.1."""
        return self.version.split("-")[0]

    def nvra(self) -> str:
        return f"{self.name}-{self.version}.{self.arch}"

    def rpm_names(self) -> set[str]:
        """Every spelling yum and dnf accept for it: name, name.arch, name-version[-release][.arch]."""
        v, r = (self.version.split("-", 1) + [""])[:2]
        out = {self.name, f"{self.name}.{self.arch}", f"{self.name}-{v}", f"{self.name}-{v}-{r}",
               f"{self.name}-{v}-{r}.{self.arch}", f"{self.name}-{self.epoch}:{v}-{r}"}
        return out


DEBIAN_AREAS = ("main", "contrib", "non-free", "non-free-firmware")


def catalog() -> list[Pkg]:
    if not os.path.exists(f"{ROOT}/fixtures/packages.txt"):
        return []
    return [Pkg(ln) for ln in fixture("packages.txt").splitlines()
            if ln.strip() and not ln.startswith("#")]


def apt_catalog() -> list[Pkg]:
    """What apt knows: a package of a Debian archive area only where the host's sources enable
    that area for its release (apt has no index of the others: "Unable to locate package")."""
    pkgs = catalog()
    if not any(p.repo in DEBIAN_AREAS for p in pkgs):
        return pkgs
    areas = enabled_areas()
    return [p for p in pkgs if p.repo not in DEBIAN_AREAS or p.repo in areas]


def enabled_areas() -> set[str]:
    """Archive areas the sources enable for this release (codename, -updates, -security), in
    both formats apt reads: one-line sources.list and deb822 .sources."""
    osr = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', open("/etc/os-release").read(), re.M))
    cn = osr.get("VERSION_CODENAME", "")
    found: set[str] = set()
    d = "/etc/apt/sources.list.d"
    paths = ["/etc/apt/sources.list"] + (sorted(os.path.join(d, n) for n in os.listdir(d))
                                         if os.path.isdir(d) else [])
    for path in paths:
        if not os.path.isfile(path):
            continue
        text = open(path, encoding="utf-8", errors="replace").read()
        if path.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, re.M))
                if fields.get("Enabled", "yes") != "no" and any(
                        x == cn or x.startswith(cn + "-") for x in fields.get("Suites", "").split()):
                    found |= set(fields.get("Components", "").split())
        elif path.endswith(".list"):
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line).split()
                if len(words) >= 4 and words[0] == "deb" and (
                        words[2] == cn or words[2].startswith(cn + "-")):
                    found |= set(words[3:])
    return found


def installed(st: dict) -> dict[str, dict]:
    return st.setdefault("pkgdb", {}).setdefault("installed", {})


def closure(st: dict, chosen: list[Pkg], pick) -> tuple[list[Pkg], list[tuple[str, Pkg]]]:  # type: ignore[no-untyped-def]
    """What installing ``chosen`` sets up (``pick(name)`` resolves a dependency, None when no
    enabled repository has it), dependencies first, and the (dependency, needed by) it lacks."""
    db = installed(st)
    new: list[Pkg] = []
    lacking: list[tuple[str, Pkg]] = []
    seen: set[str] = set()

    def add(p: Pkg) -> None:
        if p.name in seen:
            return
        seen.add(p.name)
        for d in p.deps:
            dep = pick(d)
            if dep is not None:
                add(dep)
            elif d not in db:
                lacking.append((d, p))
        if p.name not in db:
            new.append(p)
    for p in chosen:
        add(p)
    return new, lacking


def commit(st: dict, new: list[Pkg]) -> None:
    db = installed(st)
    for p in new:
        db[p.name] = {"version": p.version, "arch": p.arch, "epoch": p.epoch, "repo": p.repo,
                      "ships": sorted(p.ships)}
        if p.enables:
            pkgdb = st["pkgdb"]
            pkgdb["enabled"] = sorted(set(pkgdb.get("enabled", [])) | {p.enables})
    settle(st)


def settle(st: dict) -> None:
    """The effect of what is installed: nvidia-smi on PATH, an nvidia.ko for the running kernel."""
    db = installed(st)
    kr = kernel_release()
    smi = [n for n, p in db.items() if "nvidia-smi" in p["ships"]]
    if smi and not os.path.lexists("/usr/bin/nvidia-smi"):
        os.makedirs("/usr/bin", exist_ok=True)
        os.symlink(STANDIN, "/usr/bin/nvidia-smi")
    for name, p in db.items():
        if "nvidia.ko" not in p["ships"]:
            continue
        if name.startswith("linux-modules-nvidia-"):
            # Canonical's prebuilt modules: the version is the kernel's; the driver's is the
            # version of the kernel-common package they come with
            if not name.endswith(kr):
                continue
            path = f"/lib/modules/{kr}/kernel/nvidia/nvidia.ko"
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "a").close()
            common = [q for n, q in db.items() if n.startswith("nvidia-kernel-common-")]
            st["driver"]["signed"] = True
            st["driver"]["installed"] = (common[0] if common else p)["version"].split("-")[0]
            st["driver"]["packages"] = sorted(set(st["driver"]["packages"]) | {name})
            continue
        if "dkms" in name:
            # DKMS builds for the running kernel only where its headers are there (Ubuntu's
            # dkms postinst skips the build with a notice otherwise)
            apt_headers = f"linux-headers-{kr}" in db
            el_devel = db.get("kernel-devel", {}).get("version") == kr.rsplit(".", 1)[0] \
                and "dkms" in db
            if not (apt_headers or el_devel):
                continue
            path = f"/lib/modules/{kr}/updates/dkms/nvidia.ko" if apt_headers else \
                f"/lib/modules/{kr}/extra/nvidia.ko.xz"
        else:  # ELRepo's kABI-tracking kmod: precompiled, linked into weak-updates
            path = f"/lib/modules/{kr}/extra/nvidia/nvidia.ko"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "a").close()
        # Canonical's linux-modules-nvidia-* are signed with its key; a DKMS build is not
        st["driver"]["signed"] = "dkms" not in name
        st["driver"]["installed"] = p["version"].split("-")[0]
        st["driver"]["packages"] = sorted(set(st["driver"]["packages"]) | {name})


# ---------------------------------------------------------------------------------------------
# apt-get, dpkg-query, apt-mark (messages and exit codes of apt 2.6.1 / dpkg 1.21 on Debian 12)


def apt_words(args: list[str]) -> list[str]:
    """The non-option arguments (the verb, then packages); "-o Name=value" pairs skipped."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-o", "-c", "-t"):
            skip = True
        elif not a.startswith("-"):
            out.append(a)
    return out


def apt_name(spec: str) -> str:
    """``pkg=version``, ``pkg/release`` and ``pkg:arch`` name the package ``pkg``."""
    return re.split(r"[=/:]", spec, maxsplit=1)[0]


def apt_get(args: list[str], st: dict) -> int:
    words = apt_words(args)
    if not words:
        print("apt 2.6.1 (amd64)\nUsage: apt-get [options] command")
        return 1
    verb, pkgs = words[0], words[1:]
    if verb in ("update",):
        # apt-get update takes /var/lib/apt/lists/lock and does not wait for it
        if apt_locked("/var/lib/apt/lists/lock", "apt-update-lists-lock-held.txt"):
            return 100
        print("Reading package lists... Done")
        return 0
    if verb in ("install", "reinstall", "remove", "purge"):
        # the dpkg frontend lock: waited for as long as DPkg::Lock::Timeout says, else refused
        deadline = time.time() + lock_timeout(args)
        while lock_holder("/var/lib/dpkg/lock-frontend") is not None and time.time() < deadline:
            time.sleep(0.2)
        if apt_locked("/var/lib/dpkg/lock-frontend", "apt-get-install-frontend-lock-held.txt"):
            return 100
    if verb in ("upgrade", "dist-upgrade", "autoremove", "clean", "autoclean", "check"):
        print("Reading package lists... Done\nBuilding dependency tree... Done\n"
              "Reading state information... Done")
        return 0
    if verb in ("install", "reinstall", "remove", "purge"):
        print("Reading package lists...\nBuilding dependency tree...\nReading state information...")
        cat = {p.name: p for p in apt_catalog()}
        cat.update(listed(st, pkgs))
        wrong = [s for s in pkgs if "=" in s and apt_name(s) in cat
                 and cat[apt_name(s)].version != s.split("=", 1)[1]]
        if wrong:
            err(*(f"E: Version '{s.split('=', 1)[1]}' for '{apt_name(s)}' was not found"
                  for s in wrong))
            return 100
        missing = [s for s in pkgs if apt_name(s) not in cat]
        if missing:
            err(*(f"E: Unable to locate package {s}" for s in missing))
            return 100
        if "-s" in args or "--simulate" in args:  # what it would do; nothing changes
            for s in pkgs:
                print(f"Inst {apt_name(s)} ({cat[apt_name(s)].version})")
            return 0
        if verb in ("remove", "purge"):
            for s in pkgs:
                installed(st).pop(apt_name(s), None)
            return 0
        db = installed(st)
        for s in pkgs:  # another version of one asked by version is replaced
            if "=" in s and apt_name(s) in db and db[apt_name(s)]["version"] != cat[apt_name(s)].version:
                db.pop(apt_name(s))
        for s in pkgs:
            if apt_name(s) in db:
                print(f"{apt_name(s)} is already the newest version ({db[apt_name(s)]['version']}).")
        new, _ = closure(st, [cat[apt_name(s)] for s in pkgs], cat.get)
        commit(st, new)
        for p in new:
            print(f"Setting up {p.name} ({p.version}) ...")
        return 0
    err(f"E: Invalid operation {verb}")
    return 100


FLOCK = "hhqqi4x"  # struct flock on Linux (x86_64, aarch64): type, whence, start, len, pid


def lock_holder(path: str) -> int | None:
    """The process holding a write lock on ``path``, as apt asks the kernel (F_GETLK)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(FLOCK, fcntl.F_WRLCK, 0, 0, 0, 0))
        kind, _, _, _, pid = struct.unpack(FLOCK, got)
        return None if kind == fcntl.F_UNLCK else pid
    finally:
        os.close(fd)


def apt_locked(lock: str, capture: str) -> bool:
    """apt's refusal while another process holds ``lock``: the captured message, with this
    holder's pid and name as apt fills them in."""
    pid = lock_holder(lock)
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        name = "?"
    text = re.sub(r"held by process \d+ \([^)]*\)", f"held by process {pid} ({name})",
                  fixture(capture))
    for line in text.splitlines():
        print(line, file=sys.stdout if line.startswith("Reading") else sys.stderr)
    return True


def lock_timeout(args: list[str]) -> float:
    """``-o DPkg::Lock::Timeout=N``: how long apt-get waits for the dpkg frontend lock."""
    for a, b in zip(args, args[1:], strict=False):
        if a == "-o" and b.lower().startswith("dpkg::lock::timeout="):
            return float(b.split("=", 1)[1])
    return 0.0


def apt_cache(args: list[str], st: dict) -> int:
    """``policy NAME...``: the installed and candidate versions apt 2.x prints for a name its
    enabled repositories have, nothing on stdout for one they do not ("N: Unable to locate
    package" on stderr, exit 0). ``madison NAME``: the captured listing a profile gives (the
    fabric manager's builds in NVIDIA's repository)."""
    words = apt_words(args)
    verb, names = (words[0], words[1:]) if words else ("", [])
    if verb == "madison":
        for name in names:
            listing = (st.get("fabric") or {}).get("madison", {}).get(name)
            if listing:
                print(fixture(listing), end="")
        return 0
    if verb != "policy":
        print(f"sandbox: `apt-cache {' '.join(args)}` is not replayed", file=sys.stderr)
        return 100
    cat = {p.name: p for p in apt_catalog()}
    db = installed(st)
    for name in names:
        p = cat.get(name)
        if p is None:
            err(f"N: Unable to locate package {name}")
            continue
        have = db.get(name, {}).get("version", "(none)")
        print(f"{name}:\n  Installed: {have}\n  Candidate: {p.version}\n  Version table:\n"
              f"     {p.version} 500")
    return 0


def listed(st: dict, specs: list[str]) -> dict[str, Pkg]:
    """Packages a profile lists by their captured ``apt-cache madison`` output (the fabric
    manager's several builds in NVIDIA's repository): the build asked for, else the first listed."""
    out: dict[str, Pkg] = {}
    for spec in specs:
        name = apt_name(spec)
        listing = (st.get("fabric") or {}).get("madison", {}).get(name)
        if not listing:
            continue
        versions = [ln.split("|")[1].strip() for ln in fixture(listing).splitlines() if "|" in ln]
        want = spec.split("=", 1)[1] if "=" in spec else versions[0]
        if want in versions:
            out[name] = Pkg(f"{name} {want} repo=cuda")
    return out


def dpkg_query(args: list[str], st: dict) -> int:
    fmt = "${binary:Package}\t${Version}\n"
    patterns: list[str] = []
    show = False
    it = iter(args)
    for a in it:
        if a in ("-W", "--show"):
            show = True
        elif a in ("-f", "--showformat"):
            fmt = next(it, "")
        elif a.startswith("--showformat="):
            fmt = a.split("=", 1)[1]
        elif a.startswith("-"):
            err(f"dpkg-query: error: unknown option {a}")
            return 2
        else:
            patterns.append(a)
    if not show:
        err("dpkg-query: error: need an action option")
        return 2
    db = installed(st)
    names = sorted(n for n in db if not patterns or any(fnmatch.fnmatchcase(n, p) for p in patterns))
    for n in names:
        p = db[n]
        line = (fmt.replace("${Package}", n).replace("${binary:Package}", n)
                .replace("${Version}", p["version"]).replace("${Status}", "install ok installed")
                .replace("${db:Status-Abbrev}", "ii ").replace("\\n", "\n").replace("\\t", "\t"))
        sys.stdout.write(line)
    rc = 0
    for p in patterns:
        if not any(fnmatch.fnmatchcase(n, p) for n in db):
            err(f"dpkg-query: no packages found matching {p}")
            rc = 1
    return rc


def apt_mark(args: list[str], st: dict) -> int:
    words = apt_words(args)
    verb, names = (words[0], words[1:]) if words else ("", [])
    known = {p.name for p in apt_catalog()} | set(installed(st))
    if verb in ("hold", "unhold"):
        missing = [n for n in names if n not in known]
        if missing or not names:
            err(*(f"E: Unable to locate package {n}" for n in missing), "E: No packages found")
            return 100
        held = set(st.get("held", []))
        for n in names:
            if verb == "hold":
                print(f"{n} already set on hold." if n in held else f"{n} set on hold.")
                held.add(n)
            else:
                print(f"Canceled hold on {n}." if n in held else f"{n} was already not on hold.")
                held.discard(n)
        st["held"] = sorted(held)
        return 0
    if verb == "showhold":
        for n in st.get("held", []):
            print(n)
        return 0
    err(f"E: Invalid operation {verb}")
    return 100


# ---------------------------------------------------------------------------------------------
# ubuntu-drivers: ubuntu-drivers-common as Ubuntu 20.04 ships it (1:0.9.0~0.20.04.x, branch
# "focal" of github.com/canonical/ubuntu-drivers-common)


def ud_drivers() -> list[tuple[str, bool]]:
    """(package, recommended) of the captured `ubuntu-drivers devices`, builtin ones left out."""
    out = []
    for ln in fixture("ubuntu-drivers-devices.txt").splitlines():
        m = re.match(r"driver\s*: (\S+) - (.*)$", ln)
        if m and "builtin" not in m.group(2):
            out.append((m.group(1), "recommended" in m.group(2)))
    return out


def ud_flavour(pkg: str) -> str | None:
    """NvidiaPkgNameInfo: nvidia-driver-580-server-open -> 580-server-open."""
    m = re.match(r"nvidia-driver-(\d+)(.*)$", pkg)
    if not m:
        return None
    rest = m.group(2)
    return m.group(1) + ("-server" if "-server" in rest else "") + ("-open" if "-open" in rest else "")


def ud_filter(spec: str, drivers: list[tuple[str, bool]]) -> list[str]:
    """gpgpu_install_filter: 'nvidia:580-server' allows packages matching 'nvidia*580-server';
    no version: the recommended one."""
    m = re.match(r"(.+):([0-9]+)(.*)$", spec)
    if m:
        vendor, flavour = m.group(1), m.group(2) + m.group(3)
    elif re.match(r"[a-z]+", spec):
        vendor, flavour = spec, ""
    elif re.match(r"[0-9]+", spec):
        vendor, flavour = "nvidia", spec
    else:
        vendor, flavour = "nvidia", ""
    pattern = f"{vendor}*{flavour}" if flavour else f"{vendor}*"
    return [p for p, rec in drivers if fnmatch.fnmatchcase(p, pattern) and (flavour or rec)]


def ubuntu_drivers(args: list[str], st: dict) -> int:
    verb = next((a for a in args if not a.startswith("-")), "")
    gpgpu = "--gpgpu" in args
    if verb == "devices":
        for ln in fixture("ubuntu-drivers-devices.txt").splitlines():
            print(ln, file=sys.stderr if ln.startswith(("ERROR:root:", "udevadm ")) else sys.stdout)
        return 0
    if verb == "list":
        cat = {p.name for p in catalog()}
        for p, _ in ud_drivers():
            meta = f"nvidia-headless-no-dkms-{ud_flavour(p)}"
            if gpgpu and meta in cat:
                print(meta)
            elif not gpgpu:
                print(p)
        return 0
    if verb in ("install", "autoinstall"):
        spec = next((a for a in args[args.index(verb) + 1:] if not a.startswith("-")), "")
        matched = ud_filter(spec, ud_drivers())
        if not matched:
            print("No drivers found for installation.")
            return 0  # the `install` command drops install_gpgpu's return value: exit 0
        cat = {p.name for p in catalog()}
        db = installed(st)
        if gpgpu:
            to_install, candidate = [], None
            for p in matched:
                candidate = f"nvidia-headless-no-dkms-{ud_flavour(p)}"
                candidate = candidate if candidate in cat else None
                print(candidate)
                if candidate and candidate not in db:
                    to_install.append(candidate)
            if candidate:
                # linux-modules-nvidia-<flavour>-<kernel flavour>: none in the release's data
                print(None)
            if not to_install:
                print("All the available drivers are already installed.")
                return 0
            cmd = ["apt-get", "install", "-o", "DPkg::options::=--force-confnew",
                   "--no-install-recommends", "-y", *to_install]
        else:
            cmd = ["apt-get", "install", "-o", "DPkg::options::=--force-confnew", "-y", matched[0]]
        st_path = STATE
        # apt-get runs as its own process, as ubuntu-drivers runs it: our state is saved first
        with open(st_path + ".tmp", "w") as f:
            json.dump(st, f, indent=1)
        os.chmod(st_path + ".tmp", os.stat(st_path).st_mode)
        os.replace(st_path + ".tmp", st_path)
        subprocess.call(cmd, env={**os.environ, "GPU_SANDBOX_STATE_LOCKED": "1"})
        with open(st_path) as f:
            st.clear()
            st.update(json.load(f))
        return 0  # ubuntu-drivers ignores apt-get's exit status too
    print(f"Usage: ubuntu-drivers [OPTIONS] COMMAND [ARGS]...\nTry 'ubuntu-drivers --help' for help.\n\n"
          f"Error: No such command '{verb}'.", file=sys.stderr)
    return 2


# ---------------------------------------------------------------------------------------------
# yum (CentOS 7, yum 3) and dnf (Rocky 9, dnf 4; its yum is dnf too), rpm


def el_flavor(st: dict) -> str:
    return "yum3" if st.get("release") == "centos-7" else "dnf4"


def repo_files() -> dict[str, dict[str, str]]:
    """Every [section] of /etc/yum.repos.d/*.repo with its keys."""
    out: dict[str, dict[str, str]] = {}
    d = "/etc/yum.repos.d"
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if not name.endswith(".repo"):
            continue
        section = None
        for ln in open(os.path.join(d, name), encoding="utf-8", errors="replace"):
            ln = ln.strip()
            if ln.startswith("[") and ln.endswith("]"):
                section = ln[1:-1]
                out[section] = {}
            elif section and "=" in ln and not ln.startswith("#"):
                k, v = ln.split("=", 1)
                out[section][k.strip()] = v.strip()
    return out


VAULT = re.compile(r"https?://vault\.centos\.org/(7\.9\.2009|centos/7)/(os|updates|extras|centosplus)/"
                   r"(\$basearch|x86_64)/?$")


def centos7_repos_fail() -> bool:
    """CentOS 7 after its EOL: mirrorlist.centos.org and mirror.centos.org are gone; only the vault
    answers. yum fails on the first enabled repo it cannot reach, as the captures show."""
    for rid, kv in repo_files().items():
        if kv.get("enabled", "1") != "1":
            continue
        if "mirrorlist" in kv and "baseurl" not in kv:
            sys.stdout.write(fixture("yum-centos7-eol-mirrorlist-unreachable.txt"))
            return True
        url = kv.get("baseurl", "")
        if url and not VAULT.match(url) and "elrepo" not in url:
            real = url.replace("$releasever", "7").replace("$basearch", "x86_64").rstrip("/")
            print(f"{real}/repodata/repomd.xml: [Errno 14] HTTP Error 404 - Not Found\n"
                  f"Trying other mirror.")
            err(f"Cannot find a valid baseurl for repo: {rid}/7/x86_64")
            return True
    return False


def el_available(st: dict) -> list[Pkg]:
    """The packages of the enabled repositories; of a module, those of its enabled stream (or the
    default stream, latest-dkms)."""
    enabled = set(st.get("pkgdb", {}).get("enabled", []))
    if el_flavor(st) == "yum3":
        has_base = bool(repo_files())
        repos = ({"base", "updates", "extras"} if has_base else set()) | enabled | {"url"}
    else:  # Rocky's own repos are configured on every Rocky host
        repos = {"baseos", "appstream", "extras"} | enabled
    streams = st.get("pkgdb", {}).get("modules", {})
    out = []
    for p in catalog():
        if p.repo not in repos:
            continue
        if p.modules:
            wanted = f"nvidia-driver:{streams.get('nvidia-driver', 'latest-dkms')}"
            if wanted not in p.modules:
                continue
        out.append(p)
    return out


def el_resolve(name: str, avail: list[Pkg]) -> Pkg | None:
    if name.startswith(("https://", "http://")):
        base = name.rsplit("/", 1)[-1]
        return next((p for p in avail if p.repo == "url" and base.startswith(p.name + "-")), None)
    return next((p for p in avail if name in p.rpm_names()), None)


def yum(args: list[str], st: dict) -> int:
    flavor = el_flavor(st)
    words = [a for a in args if not a.startswith("-")]
    verb, rest = (words[0], words[1:]) if words else ("", [])
    db = installed(st)
    plugins = set(st.get("pkgdb", {}).get("enabled", [])) & {"versionlock", "config-manager"}
    known = {"install", "remove", "erase", "update", "upgrade", "list", "info", "search",
             "makecache", "clean", "repolist", "provides", "check-update", "reinstall"}
    known |= {"module"} if flavor == "dnf4" else set()
    tool = "yum" if flavor == "yum3" else "dnf"
    if verb not in known | plugins:
        print(f"No such command: {verb}. Please use /usr/bin/{tool} --help")
        if flavor == "dnf4":
            print(f"It could be a DNF plugin command, try: \"dnf install 'dnf-command({verb})'\"")
        return 1
    if flavor == "yum3" and verb in ("install", "update", "makecache", "list") and centos7_repos_fail():
        return 1
    avail = el_available(st)
    if verb == "install":
        chosen, missing, already = [], [], []
        for name in rest:
            p = el_resolve(name, avail)
            if p is None:
                missing.append(name)
            elif p.name in db:
                already.append(p)
            else:
                chosen.append(p)
        for p in already:
            print(f"Package {p.nvra()} already installed and latest version" if flavor == "yum3"
                  else f"Package {p.nvra()} is already installed.")
        if flavor == "dnf4" and missing:
            for name in missing:
                print(f"No match for argument: {name}")
            err(f"Error: Unable to find a match: {' '.join(missing)}")
            return 1
        for name in missing:
            print(f"No package {name} available.")
        if not chosen:
            if missing:
                err("Error: Nothing to do")
                return 1
            print("Nothing to do" if flavor == "yum3" else
                  "Dependencies resolved.\nNothing to do.\nComplete!")
            return 0
        names = {p.name: p for p in avail}
        new, lacking = closure(st, chosen, names.get)
        if lacking:
            dep, by = lacking[0]
            err("Error: ", f" Problem: conflicting requests\n  - nothing provides {dep} needed by "
                f"{by.name}-{by.epoch}:{by.version}.{by.arch}")
            return 1
        commit(st, new)
        print("Installed:\n" + "".join(f"  {p.nvra()}\n" for p in new) + "\nComplete!")
        return 0
    if verb == "list":
        # `list [available] NAME`: what the enabled repositories (or the rpmdb) have of it
        names = [n for n in rest if n not in ("available", "installed", "all")]
        found = [p for n in names for p in avail if n in p.rpm_names()] + \
            [n for n in names if n in db]
        if not found:
            err("Error: No matching Packages to list")
            return 1
        for p in found:
            print(p if isinstance(p, str) else f"{p.name}.{p.arch}  {p.version}  {p.repo}")
        return 0
    if verb == "module":
        sub = rest[:1]
        if sub == ["reset"]:
            for spec in rest[1:]:
                st["pkgdb"].setdefault("modules", {}).pop(spec.partition(":")[0], None)
            print("Dependencies resolved.\nNothing to do.\nComplete!")
            return 0
        if sub != ["enable"]:
            print(f"No such command: module {' '.join(sub)}")
            return 1
        streams = st["pkgdb"].setdefault("modules", {})
        for spec in rest[1:]:
            mod, _, stream = spec.partition(":")
            offered = {m for p in catalog() if p.repo in set(st["pkgdb"].get("enabled", []))
                       for m in p.modules}
            if spec not in offered:
                err("Error: Problems in request:", f"missing groups or modules: {spec}")
                return 1
            if streams.get(mod) not in (None, stream):
                text = fixture("dnf-module-enable-stream-switch.txt").replace(
                    "'nodejs'", f"'{mod}'").replace("'8'", f"'{streams[mod]}'").replace(
                    "'10'", f"'{stream}'")
                sys.stderr.write(text)
                return 1
            streams[mod] = stream
            print(f"Enabling module streams:\n {mod}  {stream}\n\nComplete!")
        return 0
    if verb == "config-manager":
        if "--set-enabled" in args:  # CRB and the like: enabled, as on every EL host here
            return 0
        if "--add-repo" not in rest and "--add-repo" not in args:
            return 0
        url = args[args.index("--add-repo") + 1]
        print(f"Adding repo from: {url}")
        if url == "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/cuda-rhel9.repo":
            st["pkgdb"]["enabled"] = sorted(set(st["pkgdb"].get("enabled", [])) | {"cuda"})
            return 0
        err(f"Curl error (6): Couldn't resolve host name for {url}")
        return 1
    if verb == "versionlock":
        sub, names = (rest[0], rest[1:]) if rest else ("list", [])
        if sub == "add":
            locked = set(st.get("held", []))
            count = 0
            for pattern in names:
                # a name or a glob over the installed packages' name and name-epoch:version
                # (NVIDIA's guide locks a branch with `dnf versionlock \\*nvidia\\*580\\*`)
                hits = [n for n, p in db.items() if fnmatch.fnmatchcase(n, pattern) or
                        fnmatch.fnmatchcase(f"{n}-{p['epoch']}:{p['version']}.{p['arch']}", pattern)]
                if not hits:
                    print(f"No package found for: {pattern}" if flavor == "yum3" else
                          f"Package {pattern} not installed.")
                for n in sorted(hits):
                    p = db[n]
                    v, r = p["version"].split("-", 1)
                    print(f"Adding versionlock on: {p['epoch']}:{n}-{v}-{r}" if flavor == "yum3"
                          else f"Adding versionlock on: {n}-{p['epoch']}:{v}-{r}.*")
                    locked.add(n)
                    count += 1
            if flavor == "yum3":
                print(f"versionlock added: {count}")
            st["held"] = sorted(locked)
            return 0 if count or flavor == "yum3" else 1
        if sub == "list":
            for n in st.get("held", []):
                print(n)
            return 0
    return 0


def rpm(args: list[str], st: dict) -> int:
    db = installed(st)
    if "--import" in args:
        return 0
    qf = None
    if "--qf" in args or "--queryformat" in args:
        i = args.index("--qf") if "--qf" in args else args.index("--queryformat")
        qf = args[i + 1]
        args = args[:i] + args[i + 2:]
    if not any(a.startswith("-q") for a in args):
        err("rpm: no operation specified" if args else "rpm: no arguments given for query")
        return 1
    names = [a for a in args if not a.startswith("-")]
    every = any("a" in a for a in args if a.startswith("-q"))

    def show(n: str) -> str:
        p = db[n]
        v, r = (p["version"].split("-", 1) + [""])[:2]
        if qf is None:
            return f"{n}-{v}-{r}.{p['arch']}\n"
        return (qf.replace("%{NAME}", n).replace("%{VERSION}", v).replace("%{RELEASE}", r)
                .replace("%{ARCH}", p["arch"]).replace("%{EPOCH}", p["epoch"])
                .replace("\\n", "\n"))
    if every:
        for n in sorted(db):
            if not names or any(fnmatch.fnmatchcase(n, g) for g in names):
                sys.stdout.write(show(n))
        return 0
    missing = 0
    for n in names:
        if n in db:
            sys.stdout.write(show(n))
        else:
            print(f"package {n} is not installed")
            missing += 1
    return min(missing, 255)


# ---------------------------------------------------------------------------------------------
# the GPU and the driver


def subst_versions(text: str, st: dict) -> str:
    """Replay a capture with the loaded driver's version and CUDA in place of the captured ones."""
    gpu = st["gpu"]
    loaded = st["driver"]["loaded"]
    if loaded and loaded != gpu["captured_driver"]:
        text = text.replace(gpu["captured_driver"], loaded)
        if gpu.get("captured_cuda"):
            new = st["driver_cuda"].get(loaded.split(".")[0])
            if new is None:
                raise SystemExit(f"sandbox: no captured nvidia-smi header of driver branch "
                                 f"{loaded.split('.')[0]} (nvidia-smi/driver-branch-cuda.yaml)")
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
            # a field no capture of this GPU holds is [N/A], as nvidia-smi prints what it lacks
            out.write(", ".join(str(row.get(f, "[N/A]")) for f in fields) + "\n")
        sys.stdout.write(out.getvalue())
        return 0
    if apps is not None:
        # the fields asked for, in their order, as nvidia-smi prints them (noheader): a process
        # runs on the GPU its state names (gpu_uuid), else on the first GPU
        first = (gpu["rows"][0].get("uuid") if gpu["rows"] else None) or "[N/A]"
        for p in st.get("processes", []):
            cells = {"gpu_uuid": p.get("gpu_uuid") or first, "pid": str(p["pid"]),
                     "process_name": p["name"], "name": p["name"],
                     "used_memory": f"{p['used_memory']} MiB",
                     "used_gpu_memory": f"{p['used_memory']} MiB"}
            sys.stdout.write(", ".join(cells.get(f.strip(), "[N/A]") for f in apps.split(","))
                             + "\n")
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
    """The capture, as lspci prints it in this state: without -k no per-device lines; with -k the
    NVIDIA GPU's "Kernel driver in use" is the driver that holds it now (nvidia once loaded,
    nouveau while nouveau is loaded, none else) and "Kernel modules" lists nvidia's modules only
    once a driver is installed. grep's "--" separators of a `grep -A` capture are not lspci's."""
    text = fixture(st["lspci"]) if st.get("lspci") else ""
    kernel = "-k" in args or any(re.fullmatch(r"-[a-z]*k[a-z]*", a) for a in args)
    out, nvidia_gpu = [], False
    for ln in text.splitlines():
        if ln == "--":
            continue
        if not ln.startswith(("\t", " ")):
            nvidia_gpu = "NVIDIA" in ln and bool(re.search(r"\[03[0-9a-f]{2}\]|VGA|3D controller", ln))
            out.append(ln)
            continue
        if not kernel:
            continue
        if nvidia_gpu and "Kernel driver in use:" in ln:
            holder = "nvidia" if st["driver"]["loaded"] else "nouveau" if st.get("nouveau") else None
            if holder:
                out.append(re.sub(r"in use: \S+", f"in use: {holder}", ln))
            continue
        if nvidia_gpu and "Kernel modules:" in ln and not st["driver"]["installed"]:
            mods = [m for m in ln.split(":", 1)[1].split(",") if not m.strip().startswith("nvidia_")
                    and m.strip() != "nvidia"]
            ln = ln.split(":", 1)[0] + ":" + ",".join(mods)
        out.append(ln)
    text = "".join(ln + "\n" for ln in out)
    if not any(a.startswith("-") and "nn" in a for a in args):
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
                      f"{kernel_release()}", file=sys.stderr)
                return 1
            if st.get("nouveau"):
                print("modprobe: ERROR: could not insert 'nvidia': No such device",
                      file=sys.stderr)
                return 1
            if st.get("secure_boot") == "enabled" and not drv.get("signed", True):
                # the kernel enforces module signatures: a DKMS build signed with no key it
                # trusts is refused, now and at every boot
                sys.stderr.write(fixture("modprobe-nvidia-key-rejected.txt"))
                return 1
            if drv["loaded"] and drv["loaded"] != drv["installed"]:
                print("modprobe: ERROR: could not insert 'nvidia': module in use by the "
                      "running driver " + drv["loaded"], file=sys.stderr)
                return 1
            drv["loaded"] = drv["installed"]
    return 0


def initramfs(args: list[str], st: dict) -> int:
    """update-initramfs -u / dracut -f: the next boot's initramfs takes /etc/modprobe.d as it is
    now (a nouveau blacklist only keeps nouveau out of the early boot once it is in there)."""
    d = "/etc/modprobe.d"
    files = [os.path.join(d, f) for f in os.listdir(d)] if os.path.isdir(d) else []
    st["initramfs_blacklists_nouveau"] = any(
        os.path.isfile(f) and re.search(r"^\s*blacklist\s+nouveau\b", open(f, errors="replace").read(), re.M)
        for f in files)
    if os.path.basename(sys.argv[0]) == "update-initramfs":
        print(f"update-initramfs: Generating /boot/initrd.img-{kernel_release()}")
    return 0


def reboot(args: list[str], st: dict) -> int:
    with open(f"{ROOT}/reboot-request", "w") as f:
        f.write(str(time.time()))
    return 0


def mokutil(args: list[str], st: dict) -> int:
    """``mokutil --sb-state``: the captured answer of a host with Secure Boot on."""
    if "--sb-state" in args and st.get("secure_boot") == "enabled":
        sys.stdout.write(fixture("mokutil-sb-state-enabled.txt"))
        return 0
    err("sandbox: only `mokutil --sb-state` on a Secure Boot host is replayed")
    return 1


def systemd_detect_virt(args: list[str], st: dict) -> int:
    print(st.get("virt", "none"))
    return 0 if st.get("virt", "none") != "none" else 1


TOOLS = {"nvidia-smi": nvidia_smi, "lspci": lspci, "lsmod": lsmod, "modprobe": modprobe,
         "apt-get": apt_get, "apt": apt_get, "apt-cache": apt_cache, "mokutil": mokutil,
         "ubuntu-drivers": ubuntu_drivers,
         "dpkg-query": dpkg_query, "apt-mark": apt_mark, "yum": yum, "dnf": yum, "rpm": rpm,
         "reboot": reboot, "shutdown": reboot, "systemd-detect-virt": systemd_detect_virt,
         "uname": uname, "update-initramfs": initramfs, "dracut": initramfs}


# --- Stopping a rented machine (autostop): a power-off (the platforms' APIs: platform_api.py) ----

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


TOOLS.update({"shutdown": shutdown})


def main() -> int:
    tool = os.path.basename(sys.argv[0])
    args = sys.argv[1:]
    log_call(tool, args)
    refused = refuse_non_root(tool, args)
    if refused is not None:
        return refused
    if tool == "uname":  # no state: called often, and by ubuntu-drivers' apt-get under its lock
        return uname(args, {})
    if tool == "reboot" or (tool == "shutdown" and ("-r" in args or "--reboot" in args)):
        return reboot(args, {})  # like systemctl reboot: ask, and return at once
    if os.environ.get("GPU_SANDBOX_STATE_LOCKED") == "1":
        # run by ubuntu-drivers, which holds the state lock and saved the state for us
        os.environ.pop("GPU_SANDBOX_STATE_LOCKED")
        with open(STATE) as f:
            data = json.load(f)
        rc = TOOLS[tool](args, data)
        with open(STATE + ".tmp", "w") as f:
            json.dump(data, f, indent=1)
        os.chmod(STATE + ".tmp", os.stat(STATE).st_mode)
        os.replace(STATE + ".tmp", STATE)
        return rc
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
