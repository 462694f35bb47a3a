"""The driver scripts as the product renders them (``provision.ops.driver.install_step`` and
``hold_step`` over templates/setup/driver.sh.j2 and driver_hold.sh.j2), run by real bash with a PATH
of recording stubs: the exact commands per distro family and per choice, the waits, the files
they write. No root and no sshd: the absolute paths the scripts write are moved under a temporary
root, and a script that would still touch one outside it is not run.

Each stub appends its name and argv to a log and answers as the test sets it up; the tools that
only compute (bash, sed, grep, seq, timeout) are the real ones, and sed edits a real copy of a
CentOS 7 CentOS-Base.repo (tests/fixtures/misc/centos-7-CentOS-Base.repo).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provision.facts.host import HostFacts, parse_facts
from provision.ops.driver import hold_step, install_step

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="runs bash scripts and reads /proc")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SEP = "\x1f"
# the tools a driver script may run that only compute: the real ones
REAL = ("bash", "sed", "grep", "seq", "timeout", "cat", "cp", "mkdir", "rm", "mv", "readlink",
        "sort")
# where the scripts write: moved under the test's root
WRITES = ("/etc/", "/var/")
OUTSIDE = re.compile(r"(?<![\w./:$-])/(usr|lib|lib64|boot|run|opt|root|srv|home|sys|proc)/")

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
        "cloud-init": "",
        "fuser": "exit 1",  # nobody holds a lock
        "modprobe": "" if module_loads else "exit 1",
        "nvidia-smi": "" if module_loads else "exit 9",
    }
    per = {
        "ubuntu": {"apt-get": "", "ubuntu-drivers": "", "update-initramfs": "", "dpkg-query": "",
                   "apt-mark": ""},
        "debian": {"apt-get": "", "update-initramfs": "", "dpkg-query": "", "apt-mark": ""},
        "el7": {"yum": "", "rpm": "", "dracut": ""},
        "el9": {"dnf": "", "yum": "", "rpm": "", "dracut": ""},
    }[family]
    return {**common, **per, **extra}


BLACKLIST = "blacklist nouveau\noptions nouveau modeset=0\n"
APT = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]


def apt_prefix(kernel: str = UBUNTU_KERNEL) -> list[list[str]]:
    return [["cloud-init", "status", "--wait"], [*APT, "update", "-q"],
            [*APT, "install", "-y", "-q", f"linux-headers-{kernel}"]]


TAIL_LOADED = [["modprobe", "nvidia"], ["nvidia-smi"]]


@pytest.mark.parametrize("branch,open_modules,package", [
    (580, True, "nvidia-driver-580-server-open"),
    (580, False, "nvidia-driver-580-server"),
    (550, False, "nvidia-driver-550-server"),
    (470, False, "nvidia-driver-470-server"),
])
def test_ubuntu_installs_the_branch_package_even_with_ubuntu_drivers(
        tmp_path: Path, branch: int, open_modules: bool, package: str) -> None:
    """ubuntu-drivers is there but not trusted: `install --gpgpu` exits 0 having installed
    nothing, and its headless package has no nvidia-smi. The branch package brings both."""
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL))
    r = host.run(install_step(UBUNTU, branch, open_modules, "install", "why").body or "")
    assert r.returncode == 0, r.stderr
    assert host.calls("uname") == [*apt_prefix(), [*APT, "install", "-y", "-q", package],
                                   ["update-initramfs", "-u"], *TAIL_LOADED]
    assert r.stdout.splitlines()[-1] == "DRIVER_LOADED"
    assert (host.root / "etc/modprobe.d/blacklist-nouveau.conf").read_text() == BLACKLIST


@pytest.mark.parametrize("branch,open_modules,package", [
    (580, True, "nvidia-driver-580-server-open"),
    (580, False, "nvidia-driver-580-server"),
    (470, False, "nvidia-driver-470-server"),
])
def test_ubuntu_without_ubuntu_drivers(tmp_path: Path, branch: int, open_modules: bool,
                                       package: str) -> None:
    s = stubs("ubuntu", kernel=UBUNTU_KERNEL, module_loads=False)
    del s["ubuntu-drivers"]
    host = Host(tmp_path, s)
    r = host.run(install_step(UBUNTU, branch, open_modules, "install", "why").body or "")
    assert r.returncode == 0, r.stderr
    assert host.calls("uname") == [*apt_prefix(), [*APT, "install", "-y", "-q", package],
                                   ["update-initramfs", "-u"], ["modprobe", "nvidia"]]
    assert r.stdout.splitlines()[-1] == "NEEDS_REBOOT (the module cannot be loaded until the next boot)"
    assert (host.root / "etc/modprobe.d/blacklist-nouveau.conf").read_text() == BLACKLIST


def test_debian_installs_its_one_driver_package(tmp_path: Path) -> None:
    host = Host(tmp_path, stubs("debian", kernel="6.1.0-18-cloud-amd64"))
    r = host.run(install_step(DEBIAN, 580, True, "install", "why").body or "")
    assert r.returncode == 0, r.stderr
    assert host.calls("uname") == [*apt_prefix("6.1.0-18-cloud-amd64"),
                                   [*APT, "install", "-y", "-q", "nvidia-driver"],
                                   ["update-initramfs", "-u"], *TAIL_LOADED]
    assert r.stdout.splitlines()[-1] == "DRIVER_LOADED"


def test_missing_headers_warn_and_go_on(tmp_path: Path) -> None:
    """No linux-headers package for the running kernel (a custom or an old kernel): apt-get
    fails as it does, the script says so and goes on to the driver."""
    missing = (f'for a in "$@"; do [ "$a" = linux-headers-{UBUNTU_KERNEL} ] && '
               f'{{ echo "E: Unable to locate package $a" >&2; exit 100; }}; done; exit 0')
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL, **{"apt-get": missing}))
    r = host.run(install_step(UBUNTU, 580, True, "install", "why").body or "")
    assert r.returncode == 0, r.stderr
    assert f"E: Unable to locate package linux-headers-{UBUNTU_KERNEL}" in r.stderr
    assert f"warning: no linux-headers-{UBUNTU_KERNEL} package (DKMS may fail)" in r.stdout
    assert host.calls("uname") == [*apt_prefix(),
                                   [*APT, "install", "-y", "-q", "nvidia-driver-580-server-open"],
                                   ["update-initramfs", "-u"], *TAIL_LOADED]


def test_a_failing_driver_install_stops_the_script(tmp_path: Path) -> None:
    fail = '[ "$3" = install ] && [ "$6" = nvidia-driver ] && { echo "E: boom" >&2; exit 100; }; exit 0'
    host = Host(tmp_path, stubs("debian", kernel="6.1.0-18-cloud-amd64", **{"apt-get": fail}))
    r = host.run(install_step(DEBIAN, 580, True, "install", "why").body or "")
    assert r.returncode == 100
    assert host.calls("uname")[-1] == [*APT, "install", "-y", "-q", "nvidia-driver"]
    assert "DRIVER_LOADED" not in r.stdout and "NEEDS_REBOOT" not in r.stdout


def centos_repo(host: Host) -> Path:
    repo = host.root / "etc/yum.repos.d/CentOS-Base.repo"
    repo.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "misc/centos-7-CentOS-Base.repo", repo)
    return repo


@pytest.mark.parametrize("branch,kmod,x11", [
    (550, "kmod-nvidia", "nvidia-x11-drv"),
    (580, "kmod-nvidia", "nvidia-x11-drv"),
    (470, "kmod-nvidia-470xx", "nvidia-x11-drv-470xx"),
])
def test_centos7_elrepo(tmp_path: Path, branch: int, kmod: str, x11: str) -> None:
    host = Host(tmp_path, stubs("el7", kernel=EL7_KERNEL))
    repo = centos_repo(host)
    original = repo.read_text()
    r = host.run(install_step(CENTOS7, branch, False, "install", "why").body or "")
    assert r.returncode == 0, r.stderr
    assert host.calls("uname") == [
        ["cloud-init", "status", "--wait"],
        ["rpm", "--import", "https://www.elrepo.org/RPM-GPG-KEY-elrepo.org"],
        ["yum", "install", "-y", "https://www.elrepo.org/elrepo-release-7.el7.elrepo.noarch.rpm",
         "yum-plugin-versionlock"],
        ["yum", "install", "-y", kmod, x11],
        ["dracut", "-f"], *TAIL_LOADED]
    assert (host.root / "etc/modprobe.d/blacklist-nouveau.conf").read_text() == BLACKLIST
    assert (repo.parent / "CentOS-Base.repo.bak").read_text() == original


def test_centos7_repos_move_to_the_vault(tmp_path: Path) -> None:
    """The real CentOS-Base.repo, rewritten: no mirrorlist (mirrorlist.centos.org is gone) and every
    baseurl on vault.centos.org/7.9.2009/<repo>/$basearch/, the vault's layout."""
    host = Host(tmp_path, stubs("el7", kernel=EL7_KERNEL))
    repo = centos_repo(host)
    host.run(install_step(CENTOS7, 550, False, "install", "why").body or "")
    text = repo.read_text()
    assert not re.search(r"^mirrorlist=", text, re.M)
    assert re.findall(r"^baseurl=.*$", text, re.M) == [
        f"baseurl=https://vault.centos.org/7.9.2009/{r}/$basearch/"
        for r in ("os", "updates", "extras", "centosplus")]
    # nothing else in the file changed
    assert [ln for ln in text.splitlines() if not ln.startswith(("baseurl=", "#mirrorlist="))] == \
        [ln for ln in (FIXTURES / "misc/centos-7-CentOS-Base.repo").read_text().splitlines()
         if not ln.startswith(("mirrorlist=", "#baseurl="))]


@pytest.mark.parametrize("open_modules,stream,package", [
    (True, "nvidia-driver:580-open", "nvidia-open"),
    (False, "nvidia-driver:580-dkms", "cuda-drivers"),
])
def test_el9_cuda_repo(tmp_path: Path, open_modules: bool, stream: str, package: str) -> None:
    host = Host(tmp_path, stubs("el9", kernel=EL9_KERNEL, module_loads=False))
    r = host.run(install_step(ROCKY9, 580, open_modules, "install", "why").body or "")
    assert r.returncode == 0, r.stderr
    assert host.calls("uname") == [
        ["cloud-init", "status", "--wait"],
        ["dnf", "install", "-y", "epel-release", "dnf-plugins-core", "python3-dnf-plugin-versionlock"],
        ["dnf", "config-manager", "--add-repo",
         "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/cuda-rhel9.repo"],
        ["dnf", "install", "-y", f"kernel-devel-{EL9_KERNEL}", "kernel-headers", "dkms"],
        ["dnf", "module", "enable", "-y", stream],
        ["dnf", "install", "-y", package],
        ["dracut", "-f"], ["modprobe", "nvidia"]]
    assert r.stdout.splitlines()[-1].startswith("NEEDS_REBOOT")


def test_el9_no_kernel_devel_warns_and_goes_on(tmp_path: Path) -> None:
    nomatch = (f'[ "$3" = kernel-devel-{EL9_KERNEL} ] && {{ echo "No match for argument: $3"; '
               f'echo "Error: Unable to find a match: $3" >&2; exit 1; }}; exit 0')
    host = Host(tmp_path, stubs("el9", kernel=EL9_KERNEL, dnf=nomatch))
    r = host.run(install_step(ROCKY9, 580, True, "install", "why").body or "")
    assert r.returncode == 0, r.stderr
    assert f"warning: no kernel-devel-{EL9_KERNEL}" in r.stdout
    assert ["dnf", "install", "-y", "nvidia-open"] in host.calls()


def test_cloud_init_is_waited_for_only_where_it_exists(tmp_path: Path) -> None:
    s = stubs("debian", kernel="6.1.0-18-cloud-amd64")
    del s["cloud-init"]
    host = Host(tmp_path, s)
    r = host.run(install_step(DEBIAN, 580, True, "install", "why").body or "")
    assert r.returncode == 0, r.stderr
    assert "cloud-init" not in [c[0] for c in host.calls()]


def test_a_held_dpkg_lock_is_waited_for(tmp_path: Path) -> None:
    """A real process holds /var/lib/dpkg/lock-frontend open (as unattended-upgrades does on a
    fresh rental). The script polls `fuser` every 5 s; here `sleep` is a stub that records the
    wait and returns at once, and at its second call asks the holder to let go and waits until it
    has closed the file: apt-get runs only after that, once `fuser` finds the lock free."""
    lock = tmp_path / "root/var/lib/dpkg/lock-frontend"
    let_go, gone = tmp_path / "let-go", tmp_path / "gone"
    fuser = ('for d in /proc/[0-9]*/fd/*; do [ "$(readlink "$d" 2>/dev/null)" = "$1" ] && '
             '{ echo "$1: ${d#/proc/}"; exit 0; }; done; exit 1')
    sleep = (f'[ "$(grep -c "^sleep" "$STUB_LOG")" -ge 2 ] && [ ! -e {let_go} ] && '
             f'{{ : > {let_go}; for _ in $(seq 1 2000); do [ -e {gone} ] && break; '
             f'read -rt 0.01 <> <(:) || true; done; }}; exit 0')
    host = Host(tmp_path, stubs("debian", kernel="6.1.0-18-cloud-amd64", fuser=fuser, sleep=sleep))
    lock.touch()
    holder = subprocess.Popen([sys.executable, "-c", f"""if True:
        import fcntl, os, time
        f = open({str(lock)!r}, "w")
        fcntl.lockf(f, fcntl.LOCK_EX)
        print("held", flush=True)
        while not os.path.exists({str(let_go)!r}):
            time.sleep(0.01)
        f.close()
        open({str(gone)!r}, "w").close()
        time.sleep(60)"""], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout and holder.stdout.readline() == "held\n"
        started = time.monotonic()
        r = host.run(install_step(DEBIAN, 580, True, "install", "why").body or "")
        assert r.returncode == 0, r.stderr
        assert time.monotonic() - started < 30
        assert holder.poll() is None  # it let go of the lock; it was not killed
    finally:
        holder.kill()
        holder.wait()
    calls = [c[0] if c[0] != "sleep" else " ".join(c) for c in host.calls("uname")]
    first_apt = calls.index("apt-get")
    assert calls[:first_apt] == ["cloud-init", "fuser", "sleep 5", "fuser", "sleep 5", "fuser"]
    assert r.stdout.count(f"waiting for the package manager lock ({lock})") == 2
    assert gone.exists()


def dpkg_lists(*packages: str) -> str:
    """A dpkg-query stub that, like dpkg-query -W, prints the installed ``packages`` matching its
    patterns in package-name order (as dpkg-query 1.21 on Debian 12 does) and fails for a pattern
    that matches none."""
    names = " ".join(sorted(packages))
    return ('pats=(); while [ $# -gt 0 ]; do case "$1" in -W) ;; -f) shift;; *) pats+=("$1");; '
            f'esac; shift; done; rc=0; for n in {names}; do for p in "${{pats[@]}}"; do '
            'case "$n" in $p) printf "%s\\n" "$n"; break;; esac; done; done; '
            f'for p in "${{pats[@]}}"; do hit=0; for n in {names}; do case "$n" in $p) hit=1;; '
            'esac; done; [ $hit = 1 ] || { echo "dpkg-query: no packages found matching $p" >&2; '
            'rc=1; }; done; exit $rc')


# what `apt-get install nvidia-driver-580-server-open` installs on Ubuntu 20.04 (its Depends in
# tests/fixtures/packages/ubuntu-20.04.txt), and what ubuntu-drivers' gpgpu path installs
FULL_580_OPEN = ("libnvidia-cfg1-580-server", "libnvidia-compute-580-server",
                 "libnvidia-decode-580-server", "libnvidia-encode-580-server",
                 "libnvidia-extra-580-server", "libnvidia-fbc1-580-server", "libnvidia-gl-580-server",
                 "nvidia-compute-utils-580-server", "nvidia-dkms-580-server-open",
                 "nvidia-driver-580-server-open", "nvidia-kernel-common-580-server",
                 "nvidia-kernel-source-580-server-open", "nvidia-utils-580-server",
                 "xserver-xorg-video-nvidia-580-server", "nvidia-firmware-580-server-580.126.20")
HEADLESS_580_OPEN = ("libnvidia-cfg1-580-server", "libnvidia-compute-580-server",
                     "nvidia-compute-utils-580-server", "nvidia-headless-no-dkms-580-server-open",
                     "nvidia-kernel-common-580-server", "nvidia-kernel-source-580-server-open")


@pytest.mark.parametrize("installed,held", [
    (FULL_580_OPEN, ["libnvidia-compute-580-server", "nvidia-dkms-580-server-open",
                     "nvidia-driver-580-server-open", "nvidia-kernel-common-580-server",
                     "nvidia-kernel-source-580-server-open", "nvidia-utils-580-server"]),
    (HEADLESS_580_OPEN, ["libnvidia-compute-580-server", "nvidia-kernel-common-580-server",
                         "nvidia-kernel-source-580-server-open"]),
    ((), ["nvidia-driver-580-server-open"]),  # nothing found: the package it installed
])
def test_apt_hold(tmp_path: Path, installed: tuple[str, ...], held: list[str]) -> None:
    host = Host(tmp_path, stubs("ubuntu", kernel=UBUNTU_KERNEL,
                                **{"dpkg-query": dpkg_lists(*installed)}))
    r = host.run(hold_step(UBUNTU, 580, True).body or "")
    assert r.returncode == 0, r.stderr
    assert host.calls() == [["dpkg-query", "-W", "-f", "${Package}\\n", "nvidia-*", "libnvidia-*"],
                            ["apt-mark", "hold", *held]]


def test_debian_hold_falls_back_to_nvidia_driver(tmp_path: Path) -> None:
    host = Host(tmp_path, stubs("debian", kernel="6.1.0-18-cloud-amd64",
                                **{"dpkg-query": dpkg_lists("nvidia-driver", "nvidia-kernel-dkms",
                                                            "libnvidia-ml1")}))
    r = host.run(hold_step(DEBIAN, 580, True).body or "")
    assert r.returncode == 0, r.stderr
    assert host.calls()[-1] == ["apt-mark", "hold", "nvidia-driver"]


@pytest.mark.parametrize("facts_,branch,open_modules,package,has_dnf", [
    (CENTOS7, 550, False, "kmod-nvidia", False),
    (CENTOS7, 470, False, "kmod-nvidia-470xx", False),
    (ROCKY9, 580, True, "nvidia-open", True),
    (ROCKY9, 580, False, "cuda-drivers", True),
])
def test_el_versionlock(tmp_path: Path, facts_: HostFacts, branch: int, open_modules: bool,
                        package: str, has_dnf: bool) -> None:
    host = Host(tmp_path, stubs("el9" if has_dnf else "el7", kernel=EL9_KERNEL))
    r = host.run(hold_step(facts_, branch, open_modules).body or "")
    assert r.returncode == 0, r.stderr
    assert host.calls() == [["yum", "versionlock", "add", package]]


def test_el7_versionlock_without_the_plugin_fails(tmp_path: Path) -> None:
    """yum 3 without yum-plugin-versionlock: 'No such command', and CentOS 7 has no dnf to fall
    back to: the hold step fails rather than reporting a hold that is not there."""
    nocmd = 'echo "No such command: $1. Please use /usr/bin/yum --help"; exit 1'
    host = Host(tmp_path, stubs("el7", kernel=EL7_KERNEL, yum=nocmd))
    r = host.run(hold_step(CENTOS7, 550, False).body or "")
    assert r.returncode == 127
    assert host.calls() == [["yum", "versionlock", "add", "kmod-nvidia"]]


def test_every_family_ends_with_its_marker_line(tmp_path: Path) -> None:
    for i, (f, fam) in enumerate(((UBUNTU, "ubuntu"), (DEBIAN, "debian"), (CENTOS7, "el7"),
                                  (ROCKY9, "el9"))):
        for loads, marker in ((True, "DRIVER_LOADED"), (False, "NEEDS_REBOOT (the module cannot "
                                                               "be loaded until the next boot)")):
            host = Host(tmp_path / f"{i}{loads}", stubs(fam, kernel=EL7_KERNEL, module_loads=loads))
            if fam == "el7":
                centos_repo(host)
            step = install_step(f, 580, True, "install", "why")
            r = host.run(step.body or "")
            assert r.returncode == 0, (fam, r.stderr)
            assert r.stdout.splitlines()[-1] == marker, fam
            # what the engine reads: a reboot is asked for exactly when the module did not load
            outcome = step.read(json.loads(host.result.read_text()))
            assert outcome.reboot is not loads, fam


def test_the_scripts_name_no_other_system_path() -> None:
    """What Host.rooted moves is all the scripts write: any other absolute path in them fails
    here before a test would run it against this machine."""
    for f, fam in ((UBUNTU, "apt"), (DEBIAN, "apt"), (CENTOS7, "el7"), (ROCKY9, "el")):
        for body in (install_step(f, 580, True, "install", "why").body, hold_step(f, 580, True).body):
            paths = set(re.findall(r"(?<![\w./:$-])(/[a-z][\w./*-]*)", body or ""))
            assert {p for p in paths if not p.startswith(WRITES) and p != "/dev/null"} == set(), fam
