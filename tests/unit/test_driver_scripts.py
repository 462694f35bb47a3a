"""The driver scripts as the product renders them (``provision.ops.driver.install_step`` and
``hold_step`` over templates/setup/driver.sh.j2 and driver_hold.sh.j2, for the driver
``driver_pick.choose`` picks), run by real bash with a PATH of recording stubs: the exact
commands per route and per choice, the refusals before anything is installed, the waits for
the package manager's locks, the files they write. No root and no sshd: the absolute paths the
scripts write are moved under a temporary root, and a script that would still touch one outside
it is not run.

Each stub appends its name and argv to a log and answers as the test sets it up; the tools that
only compute (bash, sed, grep, seq, timeout) are the real ones, and sed edits a real copy of a
CentOS 7 CentOS-Base.repo (tests/fixtures/misc/centos-7-CentOS-Base.repo).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from provision.facts.host import HostFacts, parse_facts, parse_secure_boot
from provision.facts.osinfo import parse_os_release
from provision.ops.driver import hold_step, install_step, wait_context
from provision.ops.driver_pick import Pick, choose
from provision.remote.templating import render

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="runs bash scripts and reads /proc")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SEP = "\x1f"
# the tools a driver script may run that only compute: the real ones
REAL = ("bash", "sed", "grep", "seq", "timeout", "cat", "cp", "mkdir", "rm", "mv", "readlink",
        "sort", "awk", "tr", "head", "basename", "printf", "tail", "lslocks", "paste", "uniq", "mktemp")
# where the scripts write: moved under the test's root
WRITES = ("/etc/", "/var/", "/usr/src/", "/opt/rh/")
# (/proc is only read: who holds a lock; kernels' .config under /usr/src and GCC toolsets under
# /opt/rh are read, from the test's root)
OUTSIDE = re.compile(r"(?<![\w./:$-])/(usr(?!/src/)|lib|lib64|boot|run|opt(?!/rh/)|root|srv|home|sys)/")

UBUNTU_KERNEL = "5.4.0-216-generic"  # misc/uname-a-ubuntu20.04-5.4.0-216-vm.txt
EL7_KERNEL = "3.10.0-1160.el7.x86_64"  # misc/uname-a-centos7.9-3.10.0-1160.txt
EL9_KERNEL = "5.14.0-503.40.1.el9_5.x86_64"  # misc/uname-a-rocky9.5-5.14.0-503.40.1.txt


def facts(os_release: str) -> HostFacts:
    """HostFacts of a host whose os-release is the captured ``os_release`` file, reached as
    root (a login through sudo gets the same bodies: the runtime runs them as root)."""
    text = (FIXTURES / "os-release" / os_release).read_text()
    return parse_facts({"v": 1, "probes": {"os_release": {"rc": 0, "out": text},
                                           "uid": {"rc": 0, "out": "0"}}})


UBUNTU, DEBIAN = facts("ubuntu-20.04.1-rented-vm.txt"), facts("debian-12.txt")
CENTOS7, ROCKY9 = facts("centos-7.txt"), facts("rocky-9.5.txt")
UBUNTU24, RHEL7 = facts("ubuntu-24.04.txt"), facts("rhel-7.0.txt")
ALMA10, RHEL9, OL = facts("almalinux-10.0.txt"), facts("rhel-9.6.txt"), facts("oracle-linux-7.5.txt")
AMPERE, HOPPER, PASCAL, KEPLER = [(8, 6)], [(9, 0)], [(6, 1)], [(3, 7)]
DEBIAN_KERNEL = "6.1.0-37-cloud-amd64"  # misc/uname-a-debian12-6.1.0-37-cloud.txt


def step_for(f: HostFacts, caps: list[tuple[int, int]], **kw: object) -> str:
    """The install body the plan would run: the driver choose() picks for these GPUs here."""
    return install_step(f, choose(caps, f), "install", "why", **kw).body or ""  # type: ignore[arg-type]


class Host:
    """A temporary root, a stub for each tool in ``stubs`` (name -> bash snippet run after the
    call is logged; "" answers nothing and exits 0) and a PATH of those stubs and the real
    computing tools only, so `command -v` finds exactly what the test put there."""

    def __init__(self, tmp: Path, stubs: dict[str, str]) -> None:
        self.root = tmp / "root"
        self.bin = tmp / "bin"
        self.log = tmp / "calls.log"
        self.result = tmp / "result.json"
        for d in (self.root / "etc/modprobe.d", self.root / "var/lib/dpkg", self.bin):
            d.mkdir(parents=True, exist_ok=True)
        self.log.write_text("")
        for tool in REAL:
            real = shutil.which(tool)
            assert real, f"{tool} is needed to run the driver scripts"
            (self.bin / tool).symlink_to(real)
        for name, body in stubs.items():
            path = self.bin / name
            path.write_text(f'#!{shutil.which("bash")}\n'
                            f'{{ printf %s {name}; for a in "$@"; do printf "\\x1f%s" "$a"; done; echo; }} >> "$STUB_LOG"\n'
                            f"{body}\n")
            path.chmod(0o755)

    def rooted(self, body: str) -> str:
        """The script with the paths it writes moved under this root; refuses one that still
        names a system path (it would touch this machine)."""
        stray = [m.group(0) for m in OUTSIDE.finditer(body)]
        assert not stray, f"the script names system paths the test does not move: {stray}"
        for prefix in WRITES:
            body = re.sub(r"(?<![\w./:$-])" + re.escape(prefix), f"{self.root}{prefix}", body)
        return body

    def run(self, body: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        # RESULT: where the step runtime has a body write what it reports
        env = {"PATH": str(self.bin), "STUB_LOG": str(self.log), "HOME": str(self.root),
               "LC_ALL": "C", "ROOT": str(self.root), "RESULT": str(self.result)}
        return subprocess.run([str(self.bin / "bash"), "-c", self.rooted(body)], env=env,
                              capture_output=True, text=True, timeout=timeout)

    def calls(self, *skip: str) -> list[list[str]]:
        rows = [ln.split(SEP) for ln in self.log.read_text().splitlines()]
        return [r for r in rows if r[0] not in skip]



def stubs(family: str, *, kernel: str, module_loads: bool = True, **extra: str) -> dict[str, str]:
    """The stubs a host of ``family`` has, answering as a host where the install works."""
    common = {
        "uname": f'[ "$1" = -r ] && echo {kernel}',
        "cloud-init": 'echo "status: done"',
        "modprobe": "" if module_loads else "exit 1",
        "nvidia-smi": "" if module_loads else "exit 9",
    }
    per = {
        "ubuntu": {"apt-get": "", "apt-cache": "", "update-initramfs": "", "dpkg-query": "",
                   "apt-mark": ""},
        "debian": {"apt-get": "", "apt-cache": "", "update-initramfs": "", "dpkg-query": "",
                   "apt-mark": ""},
        "el7": {"yum": "", "rpm": "", "dracut": ""},
        "el9": {"dnf": "", "yum": "", "rpm": "", "dracut": "", "subscription-manager": "",
                "arch": "echo x86_64"},
    }[family]
    return {**common, **per, **extra}


def policy(candidates: dict[str, str], archive_drivers: bool = True) -> str:
    """An apt-cache stub answering `apt-cache policy NAME` as apt 2.x prints it: the candidate
    version of a name the repositories have, "(none)" for one they know but cannot install,
    nothing at all for a name no repository knows ("N: Unable to locate package" is apt's
    stderr, and the exit status 0). Ubuntu's driver metapackages (nvidia-driver-550-server...)
    are there unless ``archive_drivers`` is False."""
    if archive_drivers:
        candidates = {**candidates, "nvidia-driver-[0-9]*": "550.163.01-0ubuntu0.20.04.1"}
    cases = "".join(f'  {name}) printf "%s:\\n  Installed: (none)\\n  Candidate: %s\\n" "$2" '
                    f'{version};;\n' for name, version in candidates.items())
    return (f'[ "$1" = policy ] || exit 0\ncase "$2" in\n{cases}'
            '  *) echo "N: Unable to locate package $2" >&2;;\nesac\nexit 0')


BLACKLIST = "blacklist nouveau\noptions nouveau modeset=0\n"
APT = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
TAIL_LOADED = [["update-initramfs", "-u", "-k", "all"], ["modprobe", "nvidia"], ["nvidia-smi"]]
FOCAL_550 = "550.163.01-0ubuntu0.20.04.1"


def installs(host: Host) -> list[list[str]]:
    """What the script asked the package tools to change, in order."""
    return [c for c in host.calls() if c[0] in ("apt-get", "dnf", "yum", "rpm", "apt-mark",
                                                 "subscription-manager")
            and not (c[0] == "dnf" and c[1:3] in (["-q", "list"], ["versionlock", "list"]))
            and not (c[0] == "dnf" and c[1:2] == ["repolist"]) and c[:2] != ["rpm", "-qa"]
            and "--assumeno" not in c
            and c[:2] != ["apt-mark", "showhold"]
            and not (c[0] == "yum" and c[1:3] == ["-q", "list"])]


# --- Ubuntu: the release's branch, prebuilt signed modules first, DKMS otherwise -------------


def test_ubuntu_2004_builds_branch_550_with_dkms(tmp_path: Path) -> None:
    """Focal's archive has no prebuilt modules for this kernel here: the running kernel's
    headers (and the flavour's, for the kernels updates bring), then nvidia-driver-550-server,
    whose nvidia-dkms builds the module."""
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, **{"apt-cache": policy({
        f"linux-headers-{UBUNTU_KERNEL}": "5.4.0-216.236",
        "linux-headers-generic": "5.4.0.216.208"})}))
    r = host.run(step_for(UBUNTU, AMPERE))
    assert r.returncode == 0, r.stderr
    assert installs(host) == [
        [*APT, "update", "-q"],
        [*APT, "install", "-y", "-q", f"linux-headers-{UBUNTU_KERNEL}", "linux-headers-generic"],
        [*APT, "install", "-y", "-q", "nvidia-driver-550-server"]]
    assert f"no prebuilt modules for kernel {UBUNTU_KERNEL}" in r.stdout
    assert r.stdout.splitlines()[-1] == "DRIVER_LOADED"
    assert (host.root / "etc/modprobe.d/blacklist-nouveau.conf").read_text() == BLACKLIST


def test_ubuntu_prefers_canonicals_signed_prebuilt_modules(tmp_path: Path) -> None:
    """The archive has linux-modules-nvidia for the running kernel: those (and the flavour's
    metapackage), the driver's libraries without DKMS and nvidia-utils; no headers, no DKMS
    package (its module would take precedence in updates/)."""
    kernel = "6.8.0-45-generic"
    host = Host(tmp_path, stubs("ubuntu", kernel=kernel, **{"apt-cache": policy({
        f"linux-modules-nvidia-580-server-open-{kernel}": "6.8.0-45.45+1",
        "linux-modules-nvidia-580-server-open-generic": "6.8.0-45.45+1"})}))
    r = host.run(step_for(UBUNTU24, HOPPER))
    assert r.returncode == 0, r.stderr
    chosen = [f"linux-modules-nvidia-580-server-open-{kernel}",
              "linux-modules-nvidia-580-server-open-generic",
              "nvidia-headless-no-dkms-580-server-open", "nvidia-utils-580-server"]
    assert installs(host) == [[*APT, "update", "-q"], [*APT, "install", "-s", "-y", "-q", *chosen],
                              [*APT, "install", "-y", "-q", *chosen]]
    assert not [c for c in host.calls() if any("dkms" in a and "no-dkms" not in a for a in c)]


def archive(candidates: dict[str, str], depends: dict[str, str],
            versions: dict[str, list[str]]) -> str:
    """An apt-cache stub for an archive: `policy NAME` as policy() answers it, `show NAME` with
    the package's Depends line, `madison NAME` listing each version the archive has."""
    shows = "".join(f'  {name}) printf "Package: %s\\nDepends: %s\\n" "$2" {shlex.quote(dep)};;\n'
                    for name, dep in depends.items())
    lists = "".join(f'  {name}) printf "%s\\n" {" ".join(shlex.quote(f"{name} | {v} | http://archive.ubuntu.com/ubuntu noble-updates/restricted amd64 Packages") for v in vs)};;\n'
                    for name, vs in versions.items())
    return (f'case "$1" in\n show) case "$2" in\n{shows} esac; exit 0;;\n'
            f' madison) case "$2" in\n{lists} esac; exit 0;;\nesac\n'
            + policy(candidates))


# noble's archive as packages.ubuntu.com shows it: the per-kernel modules of an older kernel ABI
# still depend on the point release they were built with, the flavour's metapackage on the newest
NEWEST, OLDER = "580.95.05", "580.82.07"
SKEW_KERNEL = "6.8.0-45-generic"


def skewed(versions: list[str]) -> dict[str, str]:
    modules = f"linux-modules-nvidia-580-server-open-{SKEW_KERNEL}"
    meta = "linux-modules-nvidia-580-server-open-generic"
    return {"apt-cache": archive(
        {modules: "6.8.0-45.45+1", meta: "6.8.0-60.63+1",
         f"linux-headers-{SKEW_KERNEL}": "6.8.0-45.45", "linux-headers-generic": "6.8.0-60.60"},
        {modules: f"nvidia-kernel-common-580-server ({OLDER}), linux-image-{SKEW_KERNEL}",
         meta: f"linux-modules-nvidia-580-server-open-6.8.0-60-generic, "
               f"nvidia-kernel-common-580-server (>= {NEWEST})"},
        {"nvidia-headless-no-dkms-580-server-open": [f"{v}-0ubuntu0.24.04.1" for v in versions],
         "nvidia-utils-580-server": [f"{v}-0ubuntu0.24.04.1" for v in versions]})}


def test_ubuntu_on_an_older_kernel_takes_the_driver_its_modules_were_built_for(
        tmp_path: Path) -> None:
    """A VM not rebooted since the last kernel update: its kernel's modules were built with an
    older point release than the newest userspace (whose exact dependencies would make apt exit
    100). The userspace of that release is installed beside them, and the flavour's metapackage,
    which asks for the newest, is left out, saying so."""
    host = Host(tmp_path, stubs("ubuntu", kernel=SKEW_KERNEL, **skewed([NEWEST, OLDER])))
    r = host.run(step_for(UBUNTU24, HOPPER))
    assert r.returncode == 0, r.stderr
    chosen = [f"linux-modules-nvidia-580-server-open-{SKEW_KERNEL}",
              f"nvidia-headless-no-dkms-580-server-open={OLDER}-0ubuntu0.24.04.1",
              f"nvidia-utils-580-server={OLDER}-0ubuntu0.24.04.1"]
    assert installs(host) == [[*APT, "update", "-q"], [*APT, "install", "-s", "-y", "-q", *chosen],
                              [*APT, "install", "-y", "-q", *chosen]]
    assert (f"kernel {SKEW_KERNEL} is not the newest: linux-modules-nvidia-580-server-open-generic "
            f"asks for driver {NEWEST}, its modules for {OLDER}") in r.stdout
    # every package of the branch pinned to that release: apt takes the newest of a dependency
    pin = (host.root / "etc/apt/preferences.d/gpu-provision-nvidia-580").read_text()
    assert f"Package: /-580-server/\nPin: version {OLDER}-*\nPin-Priority: 1001\n" in pin


@pytest.mark.parametrize("secure_boot", [False, True])
def test_ubuntu_modules_whose_driver_left_the_archive_build_or_refuse(
        tmp_path: Path, secure_boot: bool) -> None:
    """The archive no longer has the point release the kernel's modules were built for: without
    Secure Boot DKMS builds the newest for this kernel; with it, nothing is installed, and the
    refusal says why and what to do."""
    host = Host(tmp_path, stubs("ubuntu", kernel=SKEW_KERNEL, **skewed([NEWEST])))
    r = host.run(step_for(replace(UBUNTU24, secure_boot=secure_boot), HOPPER))
    why = f"its modules were built for driver {OLDER}, which the archive no longer has"
    if secure_boot:
        assert r.returncode == 3 and installs(host) == [[*APT, "update", "-q"]]
        assert why in r.stderr and "apt-get install linux-generic, reboot into it" in r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert why in r.stdout and installs(host)[1:] == [
        [*APT, "install", "-y", "-q", f"linux-headers-{SKEW_KERNEL}", "linux-headers-generic"],
        [*APT, "install", "-y", "-q", "nvidia-driver-580-server-open"]]


# apt 2.x on a source signed with a key it no longer trusts (the CUDA repository's key revoked in
# 2022: NVIDIA/gpu-driver-container's Dockerfiles run `apt-key del 7fa2af80` before fetching it)
STALE_SOURCE = ("W: GPG error: https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/"
                "x86_64  InRelease: The following signatures couldn't be verified because the "
                "public key is not available: NO_PUBKEY A4B469963BF863CC\n"
                "E: The repository 'https://developer.download.nvidia.com/compute/cuda/repos/"
                "ubuntu2004/x86_64  InRelease' is not signed.")


@pytest.mark.parametrize("resolves", [True, False])
def test_an_unrelated_source_failing_apt_update_does_not_end_the_step(
        tmp_path: Path, resolves: bool) -> None:
    """`apt-get update` exits 100 for one stale source: the step goes on with what the other
    sources gave, and where the driver's packages then do not resolve, the refusal names it."""
    update = (f'case " $* " in *" update "*) printf "%s\\n" {shlex.quote(STALE_SOURCE)} >&2; '
              'exit 100;; esac; exit 0')
    candidates = {f"linux-headers-{UBUNTU_KERNEL}": "5.4.0-216.236"} if resolves else {}
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, **{
        "apt-get": update, "apt-cache": policy(candidates)}))
    r = host.run(step_for(UBUNTU, AMPERE))
    assert "apt-get update failed for some sources (above): going on" in r.stdout
    if resolves:
        assert r.returncode == 0, r.stderr
        assert installs(host)[-1] == [*APT, "install", "-y", "-q", "nvidia-driver-550-server"]
        return
    assert r.returncode == 3
    assert "(apt-get update failed for some sources: E: The repository 'https://developer." \
        "download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64  InRelease' is not signed." \
        in r.stderr


def test_ubuntu_secure_boot_without_prebuilt_modules_is_refused_before_installing(
        tmp_path: Path) -> None:
    """Secure Boot on and no signed module package for this kernel: a DKMS build would be
    rejected at load, so nothing is installed and no reboot is asked for."""
    f = replace(UBUNTU, secure_boot=True)
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, **{"apt-cache": policy({
        f"linux-headers-{UBUNTU_KERNEL}": "5.4.0-216.236"})}))
    r = host.run(step_for(f, AMPERE))
    assert r.returncode == 3
    assert installs(host) == [[*APT, "update", "-q"]]
    assert (f"Secure Boot is enabled and Ubuntu's signed prebuilt module package "
            f"linux-modules-nvidia-550-server-{UBUNTU_KERNEL} cannot be used for the running "
            f"kernel {UBUNTU_KERNEL} (the archive has none for the running kernel)") in r.stderr
    assert not host.result.exists()


@pytest.mark.parametrize("f,caps,kernel,candidates", [
    (UBUNTU, AMPERE, UBUNTU_KERNEL, {}),
    (DEBIAN, AMPERE, DEBIAN_KERNEL, dict.fromkeys(
        ["nvidia-driver", "nvidia-kernel-dkms", "firmware-nvidia-gsp", "nvidia-smi", "libcuda1"],
        "535.261.03-1")),
])
def test_missing_headers_are_refused_before_installing(
        tmp_path: Path, f: HostFacts, caps: list[tuple[int, int]], kernel: str,
        candidates: dict[str, str]) -> None:
    """An image older than its archive: no headers for the running kernel. DKMS could build
    nothing and a reboot comes back to the same kernel: refused, with what to do."""
    host = Host(tmp_path, stubs("ubuntu", kernel=kernel, **{"apt-cache": policy(candidates)}))
    (host.root / "etc").mkdir(parents=True, exist_ok=True)
    (host.root / "etc/os-release").write_text((FIXTURES / "os-release/debian-12.txt").read_text())
    r = host.run(step_for(f, caps))
    assert r.returncode == 3
    assert f"the configured repositories have no linux-headers-{kernel}" in r.stderr
    assert "a reboot would come back to the same kernel" in r.stderr
    assert [c for c in installs(host) if "install" in c] == []


@pytest.mark.parametrize("answer,code,words", [
    ("modprobe: ERROR: could not insert 'nvidia': Key was rejected by service", 4,
     "the kernel rejected the driver's module: Secure Boot is enabled"),
    (f"modprobe: FATAL: Module nvidia not found in directory /lib/modules/{UBUNTU_KERNEL}", 5,
     f"no nvidia module for the running kernel {UBUNTU_KERNEL}"),
])
def test_no_reboot_is_asked_where_none_can_help(tmp_path: Path, answer: str, code: int,
                                                words: str) -> None:
    """modprobe's own words decide: a rejected signing key, or no module built for the running
    kernel, come back after a reboot; the step fails with what to do instead of rebooting."""
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, module_loads=False,
                                modprobe=f'echo "{answer}" >&2; exit 1', **{
                                    "apt-cache": policy({f"linux-headers-{UBUNTU_KERNEL}": "x"})}))
    r = host.run(step_for(UBUNTU, AMPERE))
    assert r.returncode == code
    assert answer in r.stdout and words in r.stderr
    assert "NEEDS_REBOOT" not in r.stdout and not host.result.exists()


def test_nouveau_holding_the_gpu_asks_for_the_reboot(tmp_path: Path) -> None:
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, module_loads=False, modprobe=(
        "echo \"modprobe: ERROR: could not insert 'nvidia': No such device\" >&2; exit 1"),
        **{"apt-cache": policy({f"linux-headers-{UBUNTU_KERNEL}": "x"})}))
    step = install_step(UBUNTU, choose(AMPERE, UBUNTU), "install", "why")
    r = host.run(step.body or "")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "NEEDS_REBOOT (the module cannot be loaded until the next boot)"
    assert step.read(json.loads(host.result.read_text())).reboot is True


# --- Debian: non-free, non-free-firmware and contrib, enabled where the image has main only -----

DEBIAN_SOURCES = "misc/debian12-debian.sources-main-only.txt"
AREAS = "contrib non-free non-free-firmware"


# the archive area each package of the Debian routes is in (packages.debian.org bookworm)
DEBIAN_AREAS = {"nvidia-driver": "non-free", "nvidia-kernel-dkms": "non-free",
                "nvidia-smi": "non-free", "libcuda1": "non-free",
                "nvidia-open-kernel-dkms": "contrib", "firmware-nvidia-gsp": "non-free-firmware",
                "nvidia-tesla-470-driver": "non-free", "nvidia-tesla-470-kernel-dkms": "non-free",
                "nvidia-tesla-470-smi": "non-free", "libnvidia-tesla-470-cuda1": "non-free"}


def debian_host(tmp_path: Path, sources: str = DEBIAN_SOURCES, **extra: str) -> Host:
    """A Debian 12 host whose sources enable main only; apt-cache knows a driver package once
    its archive area is in the sources (as apt knows what its enabled areas list)."""
    listed = "\n".join(
        f'  {name}) grep -Eq "^Components:.* {area}( |$)" "$ROOT"/etc/apt/sources.list.d/*.sources '
        f'&& printf "{name}:\\n  Candidate: 535.261.03-1\\n";;' for name, area in DEBIAN_AREAS.items())
    cache = (f'[ "$1" = policy ] || exit 0\ncase "$2" in\n{listed}\n'
             f'  linux-headers-{DEBIAN_KERNEL}) printf "  Candidate: 6.1.140-1\\n";;\n'
             f'  *) echo "N: Unable to locate package $2" >&2;;\nesac\nexit 0')
    host = Host(tmp_path, stubs("debian", kernel=DEBIAN_KERNEL, **{"apt-cache": cache, **extra}))
    (host.root / "etc/apt/sources.list.d").mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / sources, host.root / "etc/apt/sources.list.d/debian.sources")
    (host.root / "etc/os-release").write_text((FIXTURES / "os-release/debian-12.txt").read_text())
    return host


def test_debian_upgraded_from_11_gets_the_firmware_area_too(tmp_path: Path) -> None:
    """A Debian 12 upgraded from 11 keeps "main contrib non-free": the driver has a candidate,
    its GSP firmware (non-free-firmware) has none, and that is enough to enable the areas."""
    host = debian_host(tmp_path)
    src = host.root / "etc/apt/sources.list.d/debian.sources"
    src.write_text(src.read_text().replace("Components: main", "Components: main contrib non-free"))
    r = host.run(step_for(DEBIAN, AMPERE))
    assert r.returncode == 0, r.stderr
    assert "no firmware-nvidia-gsp in the configured repositories: enabling" in r.stdout
    assert "Components: main contrib non-free non-free-firmware" in src.read_text()
    assert installs(host)[-1] == [*APT, "install", "-y", "-q", "nvidia-driver",
                                  "nvidia-kernel-dkms", "firmware-nvidia-gsp", "nvidia-smi",
                                  "libcuda1"]


def test_debian_enables_the_archive_areas_the_driver_is_in(tmp_path: Path) -> None:
    host = debian_host(tmp_path)
    r = host.run(step_for(DEBIAN, AMPERE))
    assert r.returncode == 0, r.stderr
    assert (f"no nvidia-driver nvidia-kernel-dkms firmware-nvidia-gsp nvidia-smi libcuda1 in the "
            f"configured repositories: enabling {AREAS} for bookworm") in r.stdout
    sources = (host.root / "etc/apt/sources.list.d/debian.sources").read_text()
    original = (FIXTURES / DEBIAN_SOURCES).read_text()
    assert sources == original.replace("Components: main", f"Components: main {AREAS}")
    assert (host.root / "var/backups/debian.sources.before-gpu-provision").read_text() == original
    driver = ["nvidia-driver", "nvidia-kernel-dkms", "firmware-nvidia-gsp", "nvidia-smi", "libcuda1"]
    assert installs(host) == [
        [*APT, "update", "-q"], [*APT, "update", "-q"],
        [*APT, "install", "-s", "-y", "-q", f"linux-headers-{DEBIAN_KERNEL}", *driver],
        [*APT, "install", "-y", "-q", f"linux-headers-{DEBIAN_KERNEL}"],
        [*APT, "install", "-y", "-q", *driver]]
    # a second run finds them there and leaves the file as it is
    host.run(step_for(DEBIAN, AMPERE))
    assert (host.root / "etc/apt/sources.list.d/debian.sources").read_text() == sources


def test_debian_builds_the_driver_for_the_kernel_that_boots_next_too(tmp_path: Path) -> None:
    """unattended-upgrades installed a newer kernel that is not booted yet (the usual state of a
    fresh Debian GPU VM): its headers go beside the running kernel's, with the flavour's
    metapackage, so DKMS builds the driver for the kernel the reboot comes up in; without them
    the refusal says to reboot into it first, before anything is installed."""
    newer = "6.1.0-41-cloud-amd64"
    images = (f'printf "linux-image-{DEBIAN_KERNEL} ii \\nlinux-image-{newer} ii \\n'
              f'linux-image-6.1.0-9-cloud-amd64 rc \\n"')
    sources = 'grep -q "non-free" "$ROOT/etc/apt/sources.list.d/debian.sources"'
    for has_headers in (True, False):
        cache = (f'[ "$1" = policy ] || exit 0\ncase "$2" in\n'
                 f'  nvidia-driver|nvidia-kernel-dkms|firmware-nvidia-gsp|nvidia-smi|libcuda1) {sources} && printf "  Candidate: 535.261.03-1\\n";;\n'
                 f'  linux-headers-{DEBIAN_KERNEL}|linux-headers-cloud-amd64) printf "  Candidate: 6.1.158-1\\n";;\n'
                 + (f'  linux-headers-{newer}) printf "  Candidate: 6.1.158-1\\n";;\n' if has_headers else "")
                 + '  *) echo "N: Unable to locate package $2" >&2;;\nesac\nexit 0')
        host = debian_host(tmp_path / str(has_headers), **{"apt-cache": cache, "dpkg-query": images})
        r = host.run(step_for(DEBIAN, AMPERE))
        if not has_headers:
            assert r.returncode == 3 and f"kernel {newer} is installed and boots next" in r.stderr
            assert [c for c in installs(host) if "install" in c] == []
            continue
        assert r.returncode == 0, r.stderr
        assert [*APT, "install", "-y", "-q", f"linux-headers-{DEBIAN_KERNEL}",
                f"linux-headers-{newer}", "linux-headers-cloud-amd64"] in installs(host)
        assert ["update-initramfs", "-u", "-k", "all"] in host.calls()


@pytest.mark.parametrize("kernel", ["6.1.0-27-cloud-amd64", "6.12.48+deb13-cloud-amd64"])
def test_debian_debug_symbols_never_boot_and_the_flavour_is_read_on_every_release(
        tmp_path: Path, kernel: str) -> None:
    """A newer image's debug symbols (linux-image-<kr>-dbg) are not a kernel that boots next;
    the flavour's headers metapackage is found from bookworm's and trixie's kernel names."""
    images = f'printf "linux-image-{kernel} ii \\nlinux-image-{kernel}-dbg ii \\n"'
    sources = 'grep -q "non-free" "$ROOT/etc/apt/sources.list.d/debian.sources"'
    cache = (f'[ "$1" = policy ] || exit 0\ncase "$2" in\n'
             f'  nvidia-driver|nvidia-kernel-dkms|firmware-nvidia-gsp|nvidia-smi|libcuda1) {sources} && printf "  Candidate: 535.261.03-1\\n";;\n'
             f'  linux-headers-{kernel}|linux-headers-cloud-amd64) printf "  Candidate: 1\\n";;\n'
             '  *) echo "N: Unable to locate package $2" >&2;;\nesac\nexit 0')
    host = debian_host(tmp_path, **{"apt-cache": cache, "dpkg-query": images,
                                    "uname": f'[ "$1" = -r ] && echo {kernel}'})
    r = host.run(step_for(DEBIAN, AMPERE))
    assert r.returncode == 0, r.stderr
    assert [*APT, "install", "-y", "-q", f"linux-headers-{kernel}",
            "linux-headers-cloud-amd64"] in installs(host)


def test_el_builds_the_driver_for_grubbys_default_kernel_too(tmp_path: Path) -> None:
    """A `dnf update` left a newer kernel as the default boot entry: its devel package is
    installed with the running kernel's, and DKMS builds the driver for it after the install
    (NVIDIA's package builds for the running kernel only)."""
    newer = "5.14.0-570.el9.x86_64"
    host = Host(tmp_path, stubs("el9", kernel=EL9_KERNEL, grubby=f"echo /boot/vmlinuz-{newer}",
                                dkms=f'[ "$1" = status ] && echo "nvidia-open/580.95.05, {newer}, '
                                     'x86_64: installed"; exit 0'))
    r = host.run(step_for(ROCKY9, HOPPER))
    assert r.returncode == 0, r.stderr
    assert ["dnf", "install", "-y", f"kernel-devel-{EL9_KERNEL}", f"kernel-devel-{newer}",
            "kernel-headers", "dkms"] in installs(host)
    calls = host.calls()
    assert calls.index(["dkms", "autoinstall", "-k", newer]) > max(
        i for i, c in enumerate(calls) if c[:3] == ["dnf", "install", "-y"])
    assert calls.index(["dracut", "--regenerate-all", "-f"]) < calls.index(
        ["dkms", "autoinstall", "-k", newer])
    # a DKMS that built nothing of ours for it (another module's failure, or none): said, exit 5
    host = Host(tmp_path / "none", stubs("el9", kernel=EL9_KERNEL,
                                         grubby=f"echo /boot/vmlinuz-{newer}", dkms="exit 11"))
    r = host.run(step_for(ROCKY9, HOPPER))
    assert r.returncode == 5 and f"DKMS did not build the driver for kernel {newer}" in r.stderr


def test_debian_kepler_takes_the_tesla_470_driver(tmp_path: Path) -> None:
    host = debian_host(tmp_path, **{"apt-cache": policy({
        **dict.fromkeys(["nvidia-tesla-470-driver", "nvidia-tesla-470-kernel-dkms",
                         "nvidia-tesla-470-smi", "libnvidia-tesla-470-cuda1"], "470.256.02-1~deb12u1"),
        f"linux-headers-{DEBIAN_KERNEL}": "6.1.140-1"})})
    r = host.run(step_for(DEBIAN, KEPLER))
    assert r.returncode == 0, r.stderr
    assert installs(host)[-1] == [*APT, "install", "-y", "-q", "nvidia-tesla-470-driver",
                                  "nvidia-tesla-470-kernel-dkms", "nvidia-tesla-470-smi",
                                  "libnvidia-tesla-470-cuda1"]


def test_debian_without_the_driver_even_then_is_refused(tmp_path: Path) -> None:
    host = debian_host(tmp_path, **{"apt-cache": policy({})})
    r = host.run(step_for(DEBIAN, AMPERE))
    assert r.returncode == 3
    assert ("nvidia-driver nvidia-kernel-dkms firmware-nvidia-gsp nvidia-smi libcuda1 still "
            "not in the configured repositories after enabling") in r.stderr
    assert [c for c in installs(host) if "install" in c] == []


# --- Enterprise Linux: NVIDIA's repository, EPEL and CRB per distro -------------------------


def test_rocky_9_resets_the_module_before_enabling_the_branchs_stream(tmp_path: Path) -> None:
    host = Host(tmp_path, stubs("el9", kernel=EL9_KERNEL))
    r = host.run(step_for(ROCKY9, HOPPER))
    assert r.returncode == 0, r.stderr
    assert installs(host) == [
        ["dnf", "install", "-y", "dnf-plugins-core", "python3-dnf-plugin-versionlock"],
        ["dnf", "config-manager", "--set-enabled", "crb"],
        ["dnf", "install", "-y", "epel-release"],
        ["dnf", "config-manager", "--add-repo",
         "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/cuda-rhel9.repo"],
        ["dnf", "install", "-y", f"kernel-devel-{EL9_KERNEL}", "kernel-headers", "dkms"],
        ["dnf", "module", "reset", "-y", "nvidia-driver"],
        ["dnf", "module", "enable", "-y", "nvidia-driver:580-open"],
        ["dnf", "install", "-y", "nvidia-open"]]


def test_rhel_on_grace_takes_epel_latest_crb_and_the_sbsa_repository(tmp_path: Path) -> None:
    f = replace(RHEL9, arch="aarch64")
    host = Host(tmp_path, stubs("el9", kernel="5.14.0-570.12.1.el9_6.aarch64", arch="echo aarch64"))
    r = host.run(step_for(f, HOPPER))
    assert r.returncode == 0, r.stderr
    assert installs(host)[1:4] == [
        ["subscription-manager", "repos", "--enable", "codeready-builder-for-rhel-9-aarch64-rpms"],
        ["dnf", "install", "-y", "https://dl.fedoraproject.org/pub/epel/epel-release-latest-9.noarch.rpm"],
        ["dnf", "config-manager", "--add-repo",
         "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/sbsa/cuda-rhel9.repo"]]


def test_oracle_linux_takes_its_own_epel_and_uek_headers(tmp_path: Path) -> None:
    f = replace(OL, os=parse_os_release('ID="ol"\nVERSION_ID="9.6"\nID_LIKE="fedora"\n'))
    kernel = "6.12.0-100.28.2.2.el9uek.x86_64"  # NVIDIA's Oracle Linux page names this UEK 8
    host = Host(tmp_path, stubs("el9", kernel=kernel))
    r = host.run(step_for(f, PASCAL))
    assert r.returncode == 0, r.stderr
    assert installs(host)[1:3] == [["dnf", "config-manager", "--set-enabled", "ol9_codeready_builder"],
                                   ["dnf", "install", "-y", "oracle-epel-release-el9"]]
    assert ["dnf", "install", "-y", f"kernel-uek-devel-{kernel}", "kernel-headers", "dkms"] in installs(host)
    assert ["dnf", "module", "enable", "-y", "nvidia-driver:580-dkms"] in installs(host)
    assert installs(host)[-1] == ["dnf", "install", "-y", "cuda-drivers"]


def _repolist(*ids: str) -> str:
    """A dnf stub answering `dnf repolist all` with these repository ids (as dnf 4 prints it:
    a header, then id, name and status columns), and `config-manager --set-enabled` of an id
    it does not define as dnf does ("No matching repo to modify", exit 1)."""
    rows = "".join(f"{i:<60} {i} name{' ' * 4}disabled\\n" for i in ids)
    known = "|".join(ids) or "-"
    return (f'if [ "$1" = repolist ]; then printf "repo id{" " * 54}repo name    status\\n{rows}"; '
            'elif [ "$1 $2" = "config-manager --set-enabled" ]; then '
            f'case "$3" in {known}) ;; *) echo "Error: No matching repo to modify: $3." >&2; exit 1;; esac; '
            "fi; exit 0")


@pytest.mark.parametrize("cloud, crb", [
    # PerfKitBenchmarker linux_packages (GCP RHEL 9), Azure's RHUI repo file, AWS's
    ("gcp", "rhui-codeready-builder-for-rhel-9-x86_64-rhui-rpms"),
    ("azure", "codeready-builder-for-rhel-9-x86_64-rhui-rpms"),
    ("aws", "codeready-builder-for-rhel-9-rhui-rpms")])
def test_rhel_on_a_clouds_rhui_enables_the_crb_id_that_cloud_defines(
        tmp_path: Path, cloud: str, crb: str) -> None:
    """Pay-as-you-go RHEL is not registered: subscription-manager has nothing, and each cloud's
    RHUI names CodeReady Builder its own way; the id the host defines is enabled, never the
    extended-support, beta or debug ones beside it."""
    listed = ("rhel-9-for-x86_64-baseos-eus-rhui-rpms", crb.replace("rpms", "debug-rpms"),
              crb.replace("-rhel-9-", "-rhel-9-beta-"), crb, f"{crb.replace('rpms', 'source-rpms')}")
    host = Host(tmp_path, stubs("el9", kernel=EL9_KERNEL, dnf=_repolist(*listed),
                                **{"subscription-manager": "exit 1"}))
    r = host.run(step_for(RHEL9, HOPPER))
    assert r.returncode == 0, r.stderr
    assert installs(host)[1] == ["dnf", "config-manager", "--set-enabled", crb]
    assert not [c for c in host.calls() if c[0] == "subscription-manager"]


def test_rhel_without_any_crb_goes_on_and_says_so(tmp_path: Path) -> None:
    host = Host(tmp_path, stubs("el9", kernel=EL9_KERNEL, dnf=_repolist("rhel-9-baseos-rhui-rpms"),
                                **{"subscription-manager": "exit 1"}))
    r = host.run(step_for(RHEL9, HOPPER))
    assert r.returncode == 0, r.stderr
    assert "no CodeReady Builder repository is defined on this host" in r.stdout
    assert not [c for c in installs(host) if c[:3] == ["dnf", "config-manager", "--set-enabled"]]
    assert installs(host)[-1] == ["dnf", "install", "-y", "nvidia-open"]


def test_an_installed_driver_of_another_flavour_is_switched_with_its_locks_released(
        tmp_path: Path) -> None:
    """An image with the 550 proprietary driver from NVIDIA's repository and its version locks:
    the locks of 550 go, the stream is switched as NVIDIA's guide switches flavours (module
    switch-to --allowerasing) and the install may erase the conflicting kmod."""
    rpm = ('[ "$1" = -qa ] && printf "kmod-nvidia-latest-dkms-550.163.01\\nnvidia-driver-550.163.01\\n"; '
           "exit 0")
    # dnf's own answers on such a host: a plain install conflicts, a plain enable of another
    # stream is refused
    dnf = ('[ "$1 $2" = "versionlock list" ] && printf "Last metadata expiration check: 0:01:02 ago.\\n'
           'kmod-nvidia-latest-dkms-3:550.163.01-1.el9.*\\nnvidia-driver-3:550.163.01-1.el9.*\\n'
           'nvidia-driver-cuda-3:580.95.05-1.el9.*\\n"; '
           'case "$*" in "install -y nvidia-open") printf "Error: \\n Problem: package '
           'kmod-nvidia-open-dkms-3:580.95.05-1.el9.x86_64 from cuda-rhel9-x86_64 conflicts with '
           'kmod-nvidia-latest-dkms provided by kmod-nvidia-latest-dkms-3:550.163.01-1.el9.x86_64 from '
           "@System\\n(try to add '--allowerasing' to command line to replace conflicting packages)\\n\" >&2; "
           'exit 1;; "module enable -y nvidia-driver:580-open") echo "Error: It is not possible to '
           'switch enabled streams of a module unless explicitly enabled via configuration option '
           'module_stream_switch." >&2; exit 1;; esac; exit 0')
    host = Host(tmp_path, stubs("el9", kernel=EL9_KERNEL, rpm=rpm, dnf=dnf))
    r = host.run(step_for(ROCKY9, HOPPER))
    assert r.returncode == 0, r.stderr
    assert installs(host)[-3:] == [
        ["dnf", "versionlock", "delete", "kmod-nvidia-latest-dkms-3:550.163.01-1.el9.*",
         "nvidia-driver-3:550.163.01-1.el9.*"],
        ["dnf", "-y", "module", "switch-to", "nvidia-driver:580-open", "--allowerasing"],
        ["dnf", "install", "-y", "--allowerasing", "nvidia-open"]]
    assert "replacing the installed driver packages: kmod-nvidia-latest-dkms-550.163.01" in r.stdout


UEK8 = "6.12.0-100.28.2.2.el9uek.x86_64"  # NVIDIA's Oracle Linux page
UEK8_CC = "gcc (GCC) 14.2.1 20250110 (Red Hat 14.2.1-7)"
SYSTEM_GCC = "gcc (GCC) 11.5.0 20240719 (Red Hat 11.5.0-5.0.1)"
OL9 = replace(OL, os=parse_os_release('ID="ol"\nVERSION_ID="9.6"\nID_LIKE="fedora"\n'))


def _uek_host(tmp_path: Path, toolset: str | None, dkms_version: str = "3.0.12") -> Host:
    """An Oracle Linux 9 host on UEK 8 as NVIDIA's page shows it: the kernel's .config names GCC
    14, the system gcc is 11, and gcc-toolset-14 (when present: ``toolset`` is what its gcc
    prints) is in /opt/rh. The dkms stub keeps the PATH its builds ran with."""
    host = Host(tmp_path, stubs(
        "el9", kernel=UEK8, gcc=f'echo "{SYSTEM_GCC}"',
        dkms=(f'[ "$1" = --version ] && echo "dkms-{dkms_version}"; '
              '[ "$1" = build ] && echo "$PATH" > "$ROOT/dkms-build-path"; '
              '[ "$1" = status ] && echo "nvidia-open/580.95.05, $3, x86_64: installed"; exit 0')))
    cfg = host.root / f"usr/src/kernels/{UEK8}/.config"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(f'CONFIG_CC_VERSION="x"\nCONFIG_CC_VERSION_TEXT="{UEK8_CC}"\nCONFIG_CC_IS_GCC=y\n')
    if toolset is not None:
        gcc = host.root / "opt/rh/gcc-toolset-14/root/usr/bin/gcc"
        gcc.parent.mkdir(parents=True)
        gcc.write_text(f'#!{shutil.which("bash")}\necho "{toolset}"\n')
        gcc.chmod(0o755)
    return host


@pytest.mark.parametrize("toolset", [
    UEK8_CC,
    # a later build of the toolset than the kernel's (kernel-uek-devel requires it unversioned):
    # the same major release, fine for Kbuild
    "gcc (GCC) 14.2.1 20250328 (Red Hat 14.2.1-9)"])
def test_oracle_uek_builds_the_driver_with_the_kernels_gcc_toolset(tmp_path: Path,
                                                                   toolset: str) -> None:
    host = _uek_host(tmp_path, toolset=toolset)
    r = host.run(step_for(OL9, HOPPER))
    assert r.returncode == 0, r.stderr
    assert f"kernel {UEK8} was built with {UEK8_CC}, not the system's {SYSTEM_GCC}" in r.stdout
    dkms = [c for c in host.calls() if c[0] == "dkms" and c[1] not in ("status", "--version")]
    # NVIDIA's open DKMS package registers itself as nvidia-open (dkms-open-nvidia.spec)
    assert dkms == [["dkms", "build", "--force", "nvidia-open/580.95.05", "-k", UEK8],
                    ["dkms", "install", "--force", "nvidia-open/580.95.05", "-k", UEK8]]
    path = (host.root / "dkms-build-path").read_text().strip()
    assert path.split(":")[0] == f"{host.root}/opt/rh/gcc-toolset-14/root/usr/bin"
    # after the driver's own install, which built with the system compiler
    names = [c[0] for c in host.calls()]
    assert names.index("dkms", names.index("dkms") + 1) > max(
        i for i, c in enumerate(host.calls()) if c[:3] == ["dnf", "install", "-y"] and "nvidia-open" in c)


def test_oracle_uek_without_its_toolset_is_refused_before_the_driver(tmp_path: Path) -> None:
    host = _uek_host(tmp_path, toolset=None)
    r = host.run(step_for(OL9, HOPPER))
    assert r.returncode == 3
    assert f'kernel {UEK8} was built with "{UEK8_CC}"' in r.stderr
    assert "dnf install gcc-toolset-14" in r.stderr
    assert not [c for c in installs(host) if "nvidia-open" in c]


def test_oracle_uek_with_a_dkms_that_sets_its_own_path_is_refused(tmp_path: Path) -> None:
    """DKMS before 3.0.4 resets PATH (dell/dkms e09f306): the toolset could not reach it."""
    host = _uek_host(tmp_path, toolset=UEK8_CC, dkms_version="2.8.8")
    r = host.run(step_for(OL9, HOPPER))
    assert r.returncode == 3
    assert "dkms 2.8.8 sets its own PATH" in r.stderr and "dnf update dkms" in r.stderr
    assert not [c for c in installs(host) if "nvidia-open" in c]


def test_el_on_the_aarch64_64k_kernel_takes_its_own_devel_package(tmp_path: Path) -> None:
    kernel = "5.14.0-570.12.1.el9_6.aarch64+64k"
    f = replace(ROCKY9, arch="aarch64")
    host = Host(tmp_path, stubs("el9", kernel=kernel, arch="echo aarch64"))
    r = host.run(step_for(f, HOPPER))
    assert r.returncode == 0, r.stderr
    assert ["dnf", "install", "-y", "kernel-64k-devel-5.14.0-570.12.1.el9_6.aarch64",
            "kernel-headers", "dkms"] in installs(host)


def test_el10_locks_the_branch_without_module_streams(tmp_path: Path) -> None:
    kernel = "6.12.0-55.9.1.el10_0.x86_64"  # misc/uname-a-alma10-6.12.0-55.9.1.txt
    host = Host(tmp_path, stubs("el9", kernel=kernel))
    r = host.run(step_for(ALMA10, HOPPER))
    assert r.returncode == 0, r.stderr
    assert not [c for c in host.calls() if c[:2] == ["dnf", "module"]]
    assert installs(host)[-2:] == [["dnf", "versionlock", "add", "*nvidia*580*"],
                                   ["dnf", "install", "-y", "nvidia-open"]]
    assert ["dnf", "config-manager", "--add-repo", "https://developer.download.nvidia.com/"
            "compute/cuda/repos/rhel10/x86_64/cuda-rhel10.repo"] in installs(host)


def test_el_without_kernel_devel_for_the_running_kernel_is_refused(tmp_path: Path) -> None:
    nomatch = (f'[ "$2 $3" = "list kernel-devel-{EL9_KERNEL}" ] && '
               '{ echo "Error: No matching Packages to list" >&2; exit 1; }; exit 0')
    host = Host(tmp_path, stubs("el9", kernel=EL9_KERNEL, dnf=nomatch))
    r = host.run(step_for(ROCKY9, HOPPER))
    assert r.returncode == 3
    assert f"the configured repositories have no kernel-devel-{EL9_KERNEL}" in r.stderr
    assert not [c for c in installs(host) if "nvidia-open" in c or "dkms" in c]


# --- EL7: ELRepo's kmods; the CentOS vault only for CentOS ------------------------------------


def centos_repo(host: Host) -> Path:
    repo = host.root / "etc/yum.repos.d/CentOS-Base.repo"
    repo.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "misc/centos-7-CentOS-Base.repo", repo)
    return repo


@pytest.mark.parametrize("caps,kmod,x11", [
    (AMPERE, "kmod-nvidia", "nvidia-x11-drv"),
    (KEPLER, "kmod-nvidia-470xx", "nvidia-x11-drv-470xx"),
])
def test_centos7_elrepo(tmp_path: Path, caps: list[tuple[int, int]], kmod: str, x11: str) -> None:
    host = Host(tmp_path, stubs("el7", kernel=EL7_KERNEL))
    repo = centos_repo(host)
    original = repo.read_text()
    r = host.run(step_for(CENTOS7, caps))
    assert r.returncode == 0, r.stderr
    assert installs(host) == [
        ["rpm", "--import", "https://www.elrepo.org/RPM-GPG-KEY-elrepo.org"],
        ["yum", "install", "-y", "https://www.elrepo.org/elrepo-release-7.el7.elrepo.noarch.rpm",
         "yum-plugin-versionlock"],
        ["yum", "install", "-y", kmod, x11]]
    assert ["yum", "-q", "list", "available", kmod] in host.calls()
    assert (repo.parent / "CentOS-Base.repo.bak").read_text() == original


def test_centos7_repos_move_to_the_vault(tmp_path: Path) -> None:
    """The real CentOS-Base.repo, rewritten: no mirrorlist (mirrorlist.centos.org is gone) and every
    baseurl on vault.centos.org/7.9.2009/<repo>/$basearch/, the vault's layout."""
    host = Host(tmp_path, stubs("el7", kernel=EL7_KERNEL))
    repo = centos_repo(host)
    host.run(step_for(CENTOS7, AMPERE))
    text = repo.read_text()
    assert not re.search(r"^mirrorlist=", text, re.M)
    assert re.findall(r"^baseurl=.*$", text, re.M) == [
        f"baseurl=https://vault.centos.org/7.9.2009/{r}/$basearch/"
        for r in ("os", "updates", "extras", "centosplus")]
    # nothing else in the file changed
    assert [ln for ln in text.splitlines() if not ln.startswith(("baseurl=", "#mirrorlist="))] == \
        [ln for ln in (FIXTURES / "misc/centos-7-CentOS-Base.repo").read_text().splitlines()
         if not ln.startswith(("mirrorlist=", "#baseurl="))]


def test_rhel7_gets_elrepos_550_and_no_vault(tmp_path: Path) -> None:
    host = Host(tmp_path, stubs("el7", kernel=EL7_KERNEL))
    repo = centos_repo(host)
    r = host.run(step_for(RHEL7, AMPERE))
    assert r.returncode == 0, r.stderr
    assert installs(host)[-1] == ["yum", "install", "-y", "kmod-nvidia", "nvidia-x11-drv"]
    assert repo.read_text() == (FIXTURES / "misc/centos-7-CentOS-Base.repo").read_text()


def test_an_elrepo_el7_tree_no_longer_served_is_refused(tmp_path: Path) -> None:
    gone = ('[ "$1 $2 $3" = "-q list available" ] && '
            '{ echo "Error: No matching Packages to list" >&2; exit 1; }; exit 0')
    host = Host(tmp_path, stubs("el7", kernel=EL7_KERNEL, yum=gone))
    centos_repo(host)
    r = host.run(step_for(CENTOS7, AMPERE))
    assert r.returncode == 3
    assert "ELRepo's el7 repository (http://elrepo.org/linux/elrepo/el7/) did not offer kmod-nvidia" \
        in r.stderr
    assert ["yum", "install", "-y", "kmod-nvidia", "nvidia-x11-drv"] not in host.calls()


# --- the package manager's locks ---------------------------------------------------------------


def hold_lock(path: Path, let_go: Path) -> subprocess.Popen[str]:
    """A real process holding an fcntl lock on ``path`` (as apt-get and unattended-upgrade do),
    until ``let_go`` exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    holder = subprocess.Popen([sys.executable, "-c", f"""if True:
        import fcntl, os, time
        f = open({str(path)!r}, "w")
        fcntl.lockf(f, fcntl.LOCK_EX)
        print("held", flush=True)
        while not os.path.exists({str(let_go)!r}):
            time.sleep(0.01)
        f.close()
        time.sleep(60)"""], stdout=subprocess.PIPE, text=True)
    assert holder.stdout and holder.stdout.readline() == "held\n"
    return holder


def test_apts_lists_lock_is_waited_for_naming_its_holder(tmp_path: Path) -> None:
    """The daily apt job holds /var/lib/apt/lists/lock right after a boot: the script finds
    the holder with lslocks (the real one, reading the kernel's lock table), says who it is,
    and runs apt-get only once the lock is free. `sleep` is a stub: at its second call it lets
    the holder go."""
    lock, let_go = tmp_path / "root/var/lib/apt/lists/lock", tmp_path / "let-go"
    sleep = f'[ "$(grep -c "^sleep" "$STUB_LOG")" -ge 2 ] && : > {let_go}; read -rt 0.2 <> <(:) || true'
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, sleep=sleep, **{
        "apt-cache": policy({f"linux-headers-{UBUNTU_KERNEL}": "x"})}))
    holder = hold_lock(lock, let_go)
    try:
        r = host.run(step_for(UBUNTU, AMPERE))
        assert r.returncode == 0, r.stderr
    finally:
        holder.kill()
        holder.wait()
    assert r.stdout.count(f"waiting for {lock}, held by process {holder.pid} ({sys.executable} -c") == 1
    calls = [c[0] for c in host.calls("uname", "cloud-init", "dpkg-query")]  # (reads)
    assert calls[:calls.index("apt-get")] == ["sleep", "sleep"]


def test_a_lock_held_past_the_limit_fails_naming_the_holder(tmp_path: Path) -> None:
    lock, let_go = tmp_path / "root/var/lib/dpkg/lock-frontend", tmp_path / "let-go"
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, sleep="read -rt 0.5 <> <(:) || true"))
    holder = hold_lock(lock, let_go)
    try:
        r = host.run(step_for(UBUNTU, AMPERE, wait_limit=1))
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 75
    assert (f"the package manager is still locked after 1s: {lock} is held by process "
            f"{holder.pid} ({sys.executable} -c") in r.stderr
    assert "apt-get" not in [c[0] for c in host.calls()]


# --- holds: every package of the branch, whatever its name --------------------------------


def dpkg_lists(*rows: str) -> str:
    """A dpkg-query stub answering `dpkg-query -W -f '${Package} ${Version}\\n'` with ``rows``
    ("name version"), in package-name order as dpkg-query does."""
    return "printf '%s\\n' " + " ".join(f"'{r}'" for r in sorted(rows))


def test_apt_hold_takes_every_package_of_the_branch_by_version(tmp_path: Path) -> None:
    """Ubuntu's names carry the branch, NVIDIA's repository's from 590 on do not, Debian's never
    did: what the branch installed is what has the branch's version."""
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, **{"dpkg-query": dpkg_lists(
        f"nvidia-driver-550-server {FOCAL_550}", f"libnvidia-compute-550-server {FOCAL_550}",
        f"nvidia-firmware-550-server-550.163.01 {FOCAL_550}",
        "linux-modules-nvidia-550-server-5.4.0-216-generic 5.4.0-216.236",
        "libnvidia-compute-470 470.256.02-0ubuntu0.20.04.1", "bash 5.0-6ubuntu1.2")}))
    r = host.run(hold_step(UBUNTU, 550).body or "")
    assert r.returncode == 0, r.stderr
    assert host.calls()[-1] == ["apt-mark", "hold", "libnvidia-compute-550-server",
                                "nvidia-driver-550-server", "nvidia-firmware-550-server-550.163.01"]


def test_apt_hold_on_prebuilt_modules_holds_the_kernel_with_them(tmp_path: Path) -> None:
    """Canonical's prebuilt modules: the flavour's kernel metapackages are held with the driver,
    or the next kernel update installs a kernel whose modules the held driver cannot take."""
    kernel = "6.8.0-45-generic"
    host = Host(tmp_path, stubs("ubuntu", kernel=kernel, **{"dpkg-query": dpkg_lists(
        "nvidia-headless-no-dkms-580-server-open 580.95.05-0ubuntu0.24.04.2",
        "nvidia-utils-580-server 580.95.05-0ubuntu0.24.04.2",
        "nvidia-kernel-common-580-server 580.95.05-0ubuntu0.24.04.2",
        f"linux-modules-nvidia-580-server-open-{kernel} 6.8.0-45.45+1",
        "linux-modules-nvidia-580-server-open-generic 6.8.0-45.45+1",
        "linux-generic 6.8.0.45.45", "linux-image-generic 6.8.0.45.45",
        "linux-headers-generic 6.8.0.45.45", "linux-image-6.8.0-45-generic 6.8.0-45.45")}))
    r = host.run(hold_step(UBUNTU24, 580).body or "")
    assert r.returncode == 0, r.stderr
    assert host.calls()[-1] == ["apt-mark", "hold", "nvidia-headless-no-dkms-580-server-open",
                                "nvidia-kernel-common-580-server", "nvidia-utils-580-server",
                                "linux-generic", "linux-headers-generic", "linux-image-generic"]
    assert "kernel updates (security fixes included) wait" in r.stdout
    # the next driver step lets go of exactly these
    assert (host.root / "var/lib/gpu-provision/held-kernel-metapackages").read_text().split() == [
        "linux-generic", "linux-headers-generic", "linux-image-generic"]


@pytest.mark.parametrize("rows,held", [
    # NVIDIA's repository from 590 on (driver installation guide, "Ubuntu 590 and later packages")
    (("libnvidia-compute 590.48.01-1ubuntu1", "nvidia-dkms-open 590.48.01-1ubuntu1",
      "nvidia-driver-pinning-590 590-1", "nvidia-open 590.48.01-1ubuntu1"),
     ["libnvidia-compute", "nvidia-dkms-open", "nvidia-open"]),
    # Debian's names
    (("libcuda1 535.261.03-1", "nvidia-driver 535.261.03-1", "nvidia-smi 535.261.03-1",
      "firmware-nvidia-gsp 535.261.03-1", "libnvidia-ml1 535.261.03-1", "dkms 3.0.10-8+deb12u1"),
     ["firmware-nvidia-gsp", "libcuda1", "libnvidia-ml1", "nvidia-driver", "nvidia-smi"]),
])
def test_apt_hold_follows_names_without_the_branch(tmp_path: Path, rows: tuple[str, ...],
                                                   held: list[str]) -> None:
    branch = int(rows[0].split()[1].split(".")[0])
    host = Host(tmp_path, stubs("debian", kernel=DEBIAN_KERNEL,
                                **{"dpkg-query": dpkg_lists(*rows)}))
    r = host.run(hold_step(DEBIAN, branch).body or "")
    assert r.returncode == 0, r.stderr
    assert host.calls()[-1] == ["apt-mark", "hold", *held]


def test_apt_hold_with_nothing_of_the_branch_fails(tmp_path: Path) -> None:
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL,
                                **{"dpkg-query": dpkg_lists("bash 5.0-6ubuntu1.2")}))
    r = host.run(hold_step(UBUNTU, 550).body or "")
    assert r.returncode == 1 and "no installed package of driver branch 550 to hold" in r.stderr
    assert "apt-mark" not in [c[0] for c in host.calls()]


@pytest.mark.parametrize("facts_,fam,lock", [
    (CENTOS7, "el7", ["yum", "versionlock", "add", "kmod-nvidia*", "nvidia-x11-drv*"]),
    (ROCKY9, "el9", ["dnf", "versionlock", "add", "*nvidia*580*"]),
    (ALMA10, "el9", ["dnf", "versionlock", "add", "*nvidia*580*"]),
])
def test_el_versionlock_covers_the_module_and_the_libraries(
        tmp_path: Path, facts_: HostFacts, fam: str, lock: list[str]) -> None:
    host = Host(tmp_path, stubs(fam, kernel=EL9_KERNEL))
    r = host.run(hold_step(facts_, 580).body or "")
    assert r.returncode == 0, r.stderr
    assert host.calls("cloud-init") == [lock]


def test_el7_versionlock_without_the_plugin_fails(tmp_path: Path) -> None:
    """yum 3 without yum-plugin-versionlock: 'No such command': the hold step fails rather than
    reporting a hold that is not there."""
    nocmd = 'echo "No such command: $1. Please use /usr/bin/yum --help"; exit 1'
    host = Host(tmp_path, stubs("el7", kernel=EL7_KERNEL, yum=nocmd))
    r = host.run(hold_step(CENTOS7, 550).body or "")
    assert r.returncode == 1


def test_the_scripts_name_no_other_system_path() -> None:
    """What Host.rooted moves is all the scripts write: any other absolute path in them fails
    here before a test would run it against this machine."""
    for f, caps in ((UBUNTU, AMPERE), (DEBIAN, AMPERE), (CENTOS7, KEPLER), (ROCKY9, HOPPER),
                    (ALMA10, HOPPER)):
        pick: Pick = choose(caps, f)
        for body in (install_step(f, pick, "install", "why").body, hold_step(f, pick.branch).body):
            paths = set(re.findall(r"(?<![\w./:$-])(/[a-z][\w./*-]*)", body or ""))
            assert {p for p in paths if not p.startswith((*WRITES, "/proc/")) and p != "/dev/null"} \
                == set(), f.os.label


# --- Secure Boot without mokutil: the UEFI variable itself ------------------------------------

EFIVAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


@pytest.mark.parametrize("value, state", [(1, True), (0, False)])
def test_secure_boot_is_read_from_the_uefi_variable_without_mokutil(
        tmp_path: Path, value: int, state: bool) -> None:
    """An image without mokutil (Debian and Rocky cloud images on Azure Trusted Launch): the
    facts probe reads the SecureBoot variable's value byte, after its 4 bytes of attributes, from
    efivarfs (here a tmpfs in a mount namespace of its own, where this machine has no EFI)."""
    text = (Path(__file__).resolve().parents[2] / "templates/facts/facts.sh.j2").read_text()
    probe = re.search(r"^early secure_boot '(.*)'$", text, re.MULTILINE)
    assert probe, "the facts script has a secure_boot probe"
    bin_ = tmp_path / "bin"  # the computing tools, no mokutil
    bin_.mkdir()
    for tool in ("bash", "od", "tr", "printf"):
        real = shutil.which(tool)
        assert real
        (bin_ / tool).symlink_to(real)
    var = f"/sys/firmware/efi/efivars/{EFIVAR}"
    setup = (f"mount -t tmpfs none /sys/firmware && mkdir -p /sys/firmware/efi/efivars && "
             f"printf '\\006\\000\\000\\000\\{value:03o}' > {var} && "
             f"PATH={bin_} bash -c {shlex.quote(probe.group(1))}")
    r = subprocess.run(["unshare", "-m", "bash", "-c", setup], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"efivar SecureBoot {value}"
    assert parse_secure_boot(r.stdout) is state
    assert parse_secure_boot("SecureBoot disabled\n") is False
    assert parse_secure_boot("EFI variables are not supported on this system\n") is None


# --- the states an image is in before its first apt call --------------------------------------


@pytest.mark.parametrize("status, waits", [
    # cloudinit/cmd/status.py, UXAppStatus
    ("not started", False), ("not run", False), ("running", True), ("done", False), ("error", False),
    ("degraded done", False), ("degraded running", True), ("disabled", False)])
def test_cloud_init_is_waited_for_only_while_it_runs(tmp_path: Path, status: str,
                                                      waits: bool) -> None:
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, **{
        "cloud-init": f'[ "$2" = --wait ] && exit 0; echo "status: {status}"',
        "apt-cache": policy({f"linux-headers-{UBUNTU_KERNEL}": "x"})}))
    r = host.run(step_for(UBUNTU, AMPERE))
    assert r.returncode == 0, r.stderr
    waited = ["cloud-init", "status", "--wait"] in host.calls()
    assert waited is waits
    assert ("waiting for cloud-init to finish" in r.stdout) is waits


def test_an_interrupted_dpkg_is_finished_before_apt_runs(tmp_path: Path) -> None:
    """An image whose dpkg was interrupted (a file in /var/lib/dpkg/updates/): every apt call
    would fail until `dpkg --configure -a`, which runs first."""
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, dpkg="", **{
        "apt-cache": policy({f"linux-headers-{UBUNTU_KERNEL}": "x"})}))
    (host.root / "var/lib/dpkg/updates").mkdir(parents=True)
    (host.root / "var/lib/dpkg/updates/0003").write_text("Package: libc6\n")
    r = host.run(step_for(UBUNTU, AMPERE))
    assert r.returncode == 0, r.stderr
    names = [c[:2] for c in host.calls("uname", "cloud-init")]
    assert names.index(["dpkg", "--force-confdef"]) < names.index(["apt-get", "-o"])
    assert "dpkg was interrupted on this image" in r.stdout


def test_a_clean_dpkg_is_left_alone(tmp_path: Path) -> None:
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, dpkg="", **{
        "apt-cache": policy({f"linux-headers-{UBUNTU_KERNEL}": "x"})}))
    (host.root / "var/lib/dpkg/updates").mkdir(parents=True)
    r = host.run(step_for(UBUNTU, AMPERE))
    assert r.returncode == 0, r.stderr
    assert not [c for c in host.calls() if c[0] == "dpkg"]


def test_a_dkms_build_failing_inside_apt_shows_its_make_log(tmp_path: Path) -> None:
    """nvidia-dkms' postinst fails, apt exits 100 and `set -e` ends the step: the build's own
    log is shown, not only apt's last line."""
    log = "var/lib/dkms/nvidia/550.163.01/build/make.log"
    fail = (f'case "$*" in *nvidia-driver-550-server*) mkdir -p "$ROOT/{Path(log).parent}"; '
            f'printf "cc1: error: unrecognized command-line option\\n" > "$ROOT/{log}"; '
            'echo "E: Sub-process /usr/bin/dpkg returned an error code (1)" >&2; exit 100;; esac')
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, **{
        "apt-get": fail, "apt-cache": policy({f"linux-headers-{UBUNTU_KERNEL}": "x"})}))
    r = host.run(step_for(UBUNTU, AMPERE))
    assert r.returncode == 100
    assert "cc1: error: unrecognized command-line option" in r.stderr
    assert f"{host.root}/{log}:" in r.stderr


def test_held_packages_of_another_branch_are_let_go_only_to_install(tmp_path: Path) -> None:
    """The image held its 535 driver: apt would refuse to change held packages (exit 100). They
    are let go right before the install, after every refusal (the hold step holds the new
    branch); a refusal leaves them held."""
    held = 'printf "libnvidia-compute-535-server\\nnvidia-driver-535-server\\nopenssl\\n"'
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, **{
        "apt-mark": f'[ "$1" = showhold ] && {held}; exit 0',
        "apt-cache": policy({f"linux-headers-{UBUNTU_KERNEL}": "x"})}))
    r = host.run(step_for(UBUNTU, AMPERE))
    assert r.returncode == 0, r.stderr
    changes = installs(host)
    unhold = ["apt-mark", "unhold", "libnvidia-compute-535-server", "nvidia-driver-535-server"]
    assert changes.index(unhold) == changes.index(
        [*APT, "install", "-y", "-q", f"linux-headers-{UBUNTU_KERNEL}"]) - 1
    refused = Host(tmp_path / "refused", stubs("ubuntu", kernel=UBUNTU_KERNEL, **{
        "apt-mark": f'[ "$1" = showhold ] && {held}; exit 0', "apt-cache": policy({})}))
    assert refused.run(step_for(UBUNTU, AMPERE)).returncode == 3
    assert not [c for c in refused.calls() if c[:2] == ["apt-mark", "unhold"]]


@pytest.mark.parametrize("kernel, installed, flavour", [
    # a jammy host on the 5.15 AWS kernel: linux-image-aws-lts-22.04, not the rolling linux-aws
    ("5.15.0-1072-aws", ("linux-image-aws 6.8.0.1021.21~22.04.1 rc",
                         "linux-image-aws-lts-22.04 5.15.0.1072.72 ii"), "aws-lts-22.04"),
    # HWE on jammy: the 6.8 generic kernel is linux-image-generic-hwe-22.04's
    ("6.8.0-45-generic", ("linux-image-generic 5.15.0.122.122 ii",
                          "linux-image-generic-hwe-22.04 6.8.0.45.45~22.04.27 ii"),
     "generic-hwe-22.04"),
    ("5.15.0-122-generic", ("linux-image-generic 5.15.0.122.122 ii",
                            "linux-image-generic-hwe-22.04 6.8.0.45.45~22.04.27 un"), "generic")])
def test_ubuntu_takes_the_flavour_of_the_installed_kernel_metapackage(
        tmp_path: Path, kernel: str, installed: tuple[str, ...], flavour: str) -> None:
    """As ubuntu-drivers does (detect.py, get_linux_modules_metapackage): the flavour is the
    installed linux-image metapackage's whose version is the running kernel's series, only
    packages dpkg has installed ("ii")."""
    rows = "printf '%s\\n' " + " ".join(f"'{r}'" for r in installed)
    host = Host(tmp_path, stubs("ubuntu", kernel=kernel, **{
        "dpkg-query": f'case "$*" in *linux-image-[a-z]*) {rows};; esac; exit 0',
        "apt-cache": policy({f"linux-headers-{kernel}": "x", f"linux-headers-{flavour}": "x"})}))
    r = host.run(step_for(UBUNTU24, AMPERE))
    assert r.returncode == 0, r.stderr
    assert [*APT, "install", "-y", "-q", f"linux-headers-{kernel}",
            f"linux-headers-{flavour}"] in installs(host)


# --- the fabric manager on apt: the driver's origin, its holds, multiverse ---------------------

FM_580 = "580.95.05"


def _fabric_body() -> str:
    return render("setup/fabricmanager.sh.j2", family="apt", driver=FM_580, install=True, wait=4,
                  packages=["nvidia-fabricmanager", "nvidia-fabricmanager-580"],
                  **wait_context("apt"))


def _fabric_host(tmp_path: Path, madison: dict[str, list[str]], apt_get: str = "") -> Host:
    """A Ubuntu host whose driver came from Ubuntu's archive (its revision -0ubuntu0.24.04.2),
    with NVIDIA's repository configured beside it: apt-cache madison lists both origins."""
    cases = "".join(f'  {n}) printf "%s\\n" ' + " ".join(f"'{n} | {v} | http://x noble/main amd64 Packages'"
                                                         for v in vs) + ";;\n"
                    for n, vs in madison.items())
    return Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, **{
        "dpkg-query": dpkg_lists(f"libnvidia-compute-580-server {FM_580}-0ubuntu0.24.04.2",
                                 f"nvidia-kernel-common-580-server {FM_580}-0ubuntu0.24.04.2"),
        "apt-cache": f'[ "$1" = madison ] || exit 0\ncase "$2" in\n{cases}esac\nexit 0',
        "apt-get": apt_get,
        "nv-fabricmanager": f'echo "Fabric Manager version is : {FM_580}"',
        "systemctl": 'echo active', "nvidia-smi": 'echo Completed'}))


def test_the_fabric_manager_of_the_drivers_own_origin_comes_first(tmp_path: Path) -> None:
    """NVIDIA's real nvidia-fabricmanager (from R580) is tried first by name, but the driver came
    from Ubuntu's archive: Ubuntu's nvidia-fabricmanager-580 of the same revision is taken."""
    host = _fabric_host(tmp_path, {
        "nvidia-fabricmanager": [f"{FM_580}-1"],
        "nvidia-fabricmanager-580": [f"{FM_580}-0ubuntu0.24.04.2", f"{FM_580}-1"]})
    r = host.run(_fabric_body())
    assert r.returncode == 0, r.stderr
    asked = [c for c in installs(host) if "install" in c]
    want = f"nvidia-fabricmanager-580={FM_580}-0ubuntu0.24.04.2"
    assert asked == [[*APT, "install", "-s", "-y", "-q", "--allow-downgrades", want],
                     [*APT, "install", "-y", "-q", "--allow-downgrades", want]]
    assert not [c for c in host.calls() if "--allow-change-held-packages" in c]


def test_a_fabric_manager_that_would_move_the_held_driver_is_refused(tmp_path: Path) -> None:
    """apt's own answer when the package needs the held driver libraries changed (exit 100):
    nothing is installed, and the refusal says why."""
    held = ('[ "$3" = install ] && case "$*" in *" -s "*) '
            'echo "E: Held packages were changed and -y was used without '
            '--allow-change-held-packages." >&2; exit 100;; esac; exit 0')
    host = _fabric_host(tmp_path, {"nvidia-fabricmanager": [f"{FM_580}-1"]}, apt_get=held)
    r = host.run(_fabric_body())
    assert r.returncode == 6
    assert "E: Held packages were changed" in r.stderr
    assert "cannot go beside the installed driver" in r.stderr
    assert [c for c in installs(host) if "install" in c and "-s" not in c] == []


def test_no_fabric_manager_of_the_drivers_version_names_multiverse(tmp_path: Path) -> None:
    host = _fabric_host(tmp_path, {"nvidia-fabricmanager": ["570.195.03-1"]})
    r = host.run(_fabric_body())
    assert r.returncode == 6
    assert "nvidia-fabricmanager: 570.195.03-1" in r.stderr
    assert "in multiverse (add-apt-repository multiverse" in r.stderr


def test_a_debian_archive_whose_driver_packages_moved_apart_is_refused_untouched(
        tmp_path: Path) -> None:
    """apt's own answer where the archive's packages of one driver do not install together
    (bookworm-security's driver and firmware 535.309.01 beside a module package that needs
    firmware-nvidia-gsp 535.261.03): the dry run says it, nothing is installed."""
    sim = ('case "$*" in *" install -s "*) printf "The following packages have unmet dependencies:\\n'
           ' nvidia-open-kernel-dkms : Depends: firmware-nvidia-gsp (= 535.261.03) but '
           '535.309.01-0+deb12u1 is to be installed\\nE: Unable to correct problems, you have held '
           'broken packages.\\n"; exit 100;; esac; exit 0')
    host = debian_host(tmp_path, **{"apt-get": sim})
    src = host.root / "etc/apt/sources.list.d/debian.sources"
    src.write_text(src.read_text().replace("Components: main", f"Components: main {AREAS}"))
    r = host.run(step_for(DEBIAN, AMPERE))
    assert r.returncode == 3
    assert "apt cannot install the driver's packages together" in r.stderr
    assert "Depends: firmware-nvidia-gsp (= 535.261.03)" in r.stderr
    assert "NVIDIA's CUDA repository for debian12" in r.stderr
    assert [c for c in installs(host) if "install" in c and "-s" not in c] == []


def test_holds_let_go_for_an_install_that_is_then_refused_are_held_again(tmp_path: Path) -> None:
    """Secure Boot, prebuilt modules that apt cannot install (the dry run fails): the holds let
    go for the dry run come back with the refusal, which changes nothing."""
    kernel = "6.8.0-45-generic"
    held = 'printf "nvidia-utils-580-server\\nlibnvidia-compute-580-server\\n"'
    sim = ('case "$*" in *" install -s "*) echo "E: Unable to correct problems, you have held '
           'broken packages." >&2; exit 100;; esac; exit 0')
    host = Host(tmp_path, stubs("ubuntu", kernel=kernel, **{
        "apt-mark": f'[ "$1" = showhold ] && {held}; exit 0', "apt-get": sim,
        "apt-cache": policy({f"linux-modules-nvidia-580-server-open-{kernel}": "6.8.0-45.45+1"})}))
    (host.root / "var/lib/gpu-provision").mkdir(parents=True)
    (host.root / "var/lib/gpu-provision/held-kernel-metapackages").write_text("linux-generic\n")
    r = host.run(step_for(replace(UBUNTU24, secure_boot=True), HOPPER))
    assert r.returncode == 3, r.stderr
    marks = [c for c in host.calls() if c[0] == "apt-mark" and c[1] != "showhold"]
    let_go = ["libnvidia-compute-580-server", "linux-generic", "nvidia-utils-580-server"]
    assert marks == [["apt-mark", "unhold", *let_go], ["apt-mark", "hold", *let_go]]


def test_ubuntu_without_the_branchs_driver_package_is_refused_before_the_headers(
        tmp_path: Path) -> None:
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, **{"apt-cache": policy(
        {f"linux-headers-{UBUNTU_KERNEL}": "5.4.0-216.236"}, archive_drivers=False)}))
    r = host.run(step_for(UBUNTU, AMPERE))
    assert r.returncode == 3
    assert "the configured repositories have no nvidia-driver-550-server" in r.stderr
    assert [c for c in installs(host) if "install" in c] == []
