"""The driver step on sandbox hosts: the branch the release's archive has, installed with the
distro's tools after the package manager's locks are free; a reboot only where one helps (a NEW
boot id), nvidia-smi verified, the branch's packages held; refusals before anything is installed
where the module could not load (Secure Boot), and containers never touched."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox

APT = ["-o", "DPkg::Lock::Timeout=600"]
BLACKLIST = "blacklist nouveau\noptions nouveau modeset=0\n"
KERNEL = "5.4.0-216-generic"  # misc/uname-a-ubuntu20.04-5.4.0-216-vm.txt
HELD_550 = ["libnvidia-cfg1-550-server", "libnvidia-common-550-server",
            "libnvidia-compute-550-server",
            "libnvidia-decode-550-server", "libnvidia-encode-550-server",
            "libnvidia-extra-550-server", "libnvidia-fbc1-550-server", "libnvidia-gl-550-server",
            "nvidia-compute-utils-550-server", "nvidia-dkms-550-server",
            "nvidia-driver-550-server", "nvidia-firmware-550-server-550.163.01",
            "nvidia-kernel-common-550-server", "nvidia-kernel-source-550-server",
            "nvidia-utils-550-server", "xserver-xorg-video-nvidia-550-server"]


def changes(info: harness.HostInfo, tools: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """What these tools were asked to change, in order (`apt-mark showhold`, apt's dry runs,
    `dnf versionlock list` and `dnf repolist` only read)."""
    return [(c["tool"], c["argv"]) for c in info.calls()
            if c["tool"] in tools and c["argv"] != ["showhold"] and "-s" not in c["argv"]
            and c["argv"][:2] != ["versionlock", "list"] and c["argv"][:1] != ["repolist"]]


def test_ubuntu_2004_gets_the_branch_its_archive_has(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Ubuntu 20.04's archive ends at branch 550 (580 is jammy and later: asked for it, apt
    answers "Unable to locate package"): the running kernel's headers, then
    nvidia-driver-550-server, DKMS builds the module; nouveau holds the GPU, so the blacklist goes
    into the initramfs and the host reboots into the driver; every 550 package is held."""
    info = hosts.fresh("ubuntu-20.04-nodriver", ubuntu_drivers=None, reboot_delay=2)
    try:
        boot = facts_json(info, gp_home)["boot_id"]
        plan = gpu_provision("-H", info.inventory, "plan", home=gp_home, cwd=tmp_path)
        assert "install branch 550 from Ubuntu's archive" in plan.stdout, plan.stdout
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "rebooting (the module cannot load without it)" in r.stdout
        assert "driver 550.163.01 loaded (CUDA <= 12.4)" in r.stdout
        f = facts_json(info, gp_home)
        assert f["boot_id"] != boot and f["nvidia_state"] == "ok" and not f["nouveau_loaded"]
        assert changes(info, ("apt-get", "update-initramfs", "modprobe", "reboot", "apt-mark")) == [
            ("apt-get", [*APT, "update", "-q"]),
            ("apt-get", [*APT, "install", "-y", "-q", f"linux-headers-{KERNEL}"]),
            ("apt-get", [*APT, "install", "-y", "-q", "nvidia-driver-550-server"]),
            ("update-initramfs", ["-u", "-k", "all"]),
            ("modprobe", ["nvidia"]),  # nouveau holds the GPU: No such device
            ("reboot", []),
            ("apt-mark", ["hold", *HELD_550]),
        ]
        assert info.state()["held"] == HELD_550
        assert info.state()["boots"] == 1
        assert info.path("/etc/modprobe.d/blacklist-nouveau.conf").read_text() == BLACKLIST
        # a second run finds the driver in place and does nothing
        again = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert again.returncode == 0 and "driver: nothing to do" in again.stdout
        assert info.state()["boots"] == 1
    finally:
        harness.stop(info.id)


def test_with_ubuntu_drivers_the_branch_package_is_installed_and_booted_into(  # type: ignore[no-untyped-def]
        hosts: Hosts, gp_home, tmp_path) -> None:
    info = hosts.fresh("ubuntu-20.04-nodriver", reboot_delay=1)
    try:
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        calls = [(c["tool"], c["argv"]) for c in info.calls()]
        # ubuntu-drivers is there but not asked: the branch's own package is
        assert not [c for c in calls if c[0] == "ubuntu-drivers" and "install" in c[1]]
        assert ("apt-get", [*APT, "install", "-y", "-q", "nvidia-driver-550-server"]) in calls
        loaded = r.returncode == 0 and facts_json(info, gp_home)["nvidia_state"] == "ok"
        assert loaded and "rebooting (the module cannot load without it)" in r.stdout, \
            r.stdout + r.stderr
    finally:
        harness.stop(info.id)


def test_secure_boot_without_signed_modules_is_refused_before_installing(  # type: ignore[no-untyped-def]
        hosts: Hosts, gp_home, tmp_path) -> None:
    """Secure Boot on (mokutil says so): focal's archive has no Canonical-signed module package
    for this kernel, and a DKMS build would be rejected. Nothing is installed, nothing reboots,
    and the user reads what to do."""
    info = hosts.fresh("ubuntu-20.04-nodriver", ubuntu_drivers=None, secure_boot="enabled")
    try:
        plan = gpu_provision("-H", info.inventory, "plan", home=gp_home, cwd=tmp_path)
        # (the words of the table's wrapped cell, without its borders)
        assert "Secure Boot is on: only Canonical's signed prebuilt modules load" in \
            " ".join(w for w in plan.stdout.split() if w != "│"), plan.stdout
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode != 0
        said = " ".join(r.stdout.split() + r.stderr.split())
        assert (f"Secure Boot is enabled and Ubuntu's signed prebuilt module package "
                f"linux-modules-nvidia-550-server-{KERNEL}") in said
        assert "exit code 3" in said and "rebooting" not in said
        assert changes(info, ("apt-get", "reboot", "modprobe")) == [
            ("apt-get", [*APT, "update", "-q"])]
        assert info.state()["boots"] == 0 and not info.state()["pkgdb"]["installed"]
    finally:
        harness.stop(info.id)


def test_a_rejected_signing_key_asks_for_no_reboot(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Secure Boot enforced by the kernel but nothing on the host says so (no mokutil: Azure
    Trusted Launch images): the DKMS module is built, and modprobe answers "Key was rejected by
    service". The step fails with that and what to do; no reboot, which would change nothing."""
    info = hosts.fresh("ubuntu-20.04-nodriver", ubuntu_drivers=None, nouveau=False,
                       secure_boot="enabled", mokutil=False)
    try:
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode != 0
        said = " ".join(r.stdout.split() + r.stderr.split())
        assert "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service" in said
        assert "the kernel rejected the driver's module: Secure Boot is enabled" in said
        assert "mokutil --import /var/lib/shim-signed/mok/MOK.der" in said
        assert "rebooting" not in said and info.state()["boots"] == 0
        assert not [c for c in info.calls() if c["tool"] == "reboot"]
    finally:
        harness.stop(info.id)


def test_the_daily_apt_jobs_lock_is_waited_for(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Right after a boot apt's daily job holds /var/lib/apt/lists/lock: apt-get update would
    fail ("Could not get lock ... It is held by process N"). The step waits, naming the holder,
    and goes on once it is done."""
    info = hosts.fresh("ubuntu-20.04-nodriver", ubuntu_drivers=None, nouveau=False)
    holder = subprocess.Popen(
        ["nsenter", "--mount", "--uts", "-t", str(info.pid), "chroot", str(Path(info.root) / "merged"),
         "python3", "-c", "import fcntl, time\nf = open('/var/lib/apt/lists/lock', 'w')\n"
         "fcntl.lockf(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(8)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout and holder.stdout.readline() == "held\n"
        released = time.time() + 8
        # what apt-get itself answers meanwhile
        asked = harness.in_host(info, "apt-get", "update", check=False)
        assert asked.returncode == 100
        assert f"E: Could not get lock /var/lib/apt/lists/lock. It is held by process {holder.pid}" \
            in asked.stderr
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert holder.wait(timeout=30) == 0  # it finished on its own: nothing killed it
        log = info.path("/root/.gpu-provision/logs/driver.log").read_text()
        assert f"waiting for /var/lib/apt/lists/lock, held by process {holder.pid} (python3 -c" in log
        updates = [c for c in info.calls("apt-get") if c["argv"][-2:] == ["update", "-q"]]
        assert updates and updates[0]["time"] > released - 1  # only once the holder let go
    finally:
        holder.kill()
        holder.wait()
        harness.stop(info.id)


DEBIAN_AREAS = "contrib non-free non-free-firmware"
DEBIAN_KERNEL = "6.1.0-37-cloud-amd64"  # misc/uname-a-debian12-6.1.0-37-cloud.txt


def test_debian_12_enables_the_areas_the_driver_is_in(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A Debian 12 cloud image enables main only: apt knows no nvidia-driver. The step adds
    contrib, non-free and non-free-firmware to the release's entries, then installs bookworm's
    535 from them; the GPUs are Ampere, and 535 predates NVIDIA's open-modules default."""
    info = hosts.fresh("debian-12-nodriver")
    try:
        assert harness.in_host(info, "apt-get", "install", "-y", "nvidia-driver",
                               check=False).stderr == "E: Unable to locate package nvidia-driver\n"
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "driver 535.261.03 loaded (CUDA <= 12.2)" in r.stdout
        sources = info.path("/etc/apt/sources.list.d/debian.sources").read_text()
        original = (harness.FIXTURES / "misc/debian12-debian.sources-main-only.txt").read_text()
        assert sources == original.replace("Components: main", f"Components: main {DEBIAN_AREAS}")
        assert changes(info, ("apt-get", "apt-mark")) == [
            ("apt-get", ["install", "-y", "nvidia-driver"]),  # asked above, refused
            ("apt-get", [*APT, "update", "-q"]), ("apt-get", [*APT, "update", "-q"]),
            ("apt-get", [*APT, "install", "-y", "-q", f"linux-headers-{DEBIAN_KERNEL}"]),
            ("apt-get", [*APT, "install", "-y", "-q", "nvidia-driver", "nvidia-kernel-dkms",
                         "firmware-nvidia-gsp", "nvidia-smi", "libcuda1"]),
            ("apt-mark", ["hold", "firmware-nvidia-gsp", "libcuda1", "libnvidia-ml1",
                          "nvidia-alternative", "nvidia-driver", "nvidia-driver-bin",
                          "nvidia-driver-libs", "nvidia-kernel-dkms", "nvidia-smi"])]
    finally:
        harness.stop(info.id)


def test_centos7_elrepo_without_reboot(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    info = hosts.fresh("centos-7")
    try:
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "rebooting" not in r.stdout  # nothing held the GPU: modprobe loaded it
        assert "driver 550.144.03 loaded (CUDA <= 12.4)" in r.stdout
        assert changes(info, ("rpm", "yum", "dracut", "modprobe", "reboot")) == [
            ("rpm", ["--import", "https://www.elrepo.org/RPM-GPG-KEY-elrepo.org"]),
            ("yum", ["install", "-y", "https://www.elrepo.org/elrepo-release-7.el7.elrepo.noarch.rpm",
                     "yum-plugin-versionlock"]),
            # ELRepo's el7 tree still offers it (else: refused, before installing)
            ("yum", ["-q", "list", "available", "kmod-nvidia"]),
            ("yum", ["install", "-y", "kmod-nvidia", "nvidia-x11-drv"]),
            ("dracut", ["--regenerate-all", "-f"]),
            ("modprobe", ["nvidia"]),
            ("yum", ["versionlock", "add", "kmod-nvidia*", "nvidia-x11-drv*"]),
        ]
        # the repos now live on the vault (the stock mirrorlist no longer answers)
        repo = info.path("/etc/yum.repos.d/CentOS-Base.repo").read_text()
        assert "baseurl=https://vault.centos.org/7.9.2009/os/$basearch/" in repo
        assert "\nmirrorlist=" not in repo
        # the module and the libraries, not only the kmod
        assert info.state()["held"] == ["kmod-nvidia", "nvidia-x11-drv"]
        assert info.state()["boots"] == 0
        f = facts_json(info, gp_home)
        assert (f["nvidia_state"], f["driver"], f["driver_cuda"]) == ("ok", "550.144.03", "12.4")
    finally:
        harness.stop(info.id)


def test_rocky_resets_an_enabled_stream_before_the_branchs(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An earlier driver left the module's default stream enabled: enabling 580-open without a
    reset is refused by dnf ("It is not possible to switch enabled streams of a module"). The
    step resets the module first; the version lock then covers every package of the branch."""
    info = hosts.fresh("rocky-9-h100", driver=None, lspci="lspci/lspci-nn-8xh200-sxm.txt",
                       lspci_lines=1)
    try:
        state_file = info.path("/var/lib/gpu-sandbox/state.json")
        st = json.loads(state_file.read_text())
        st["pkgdb"]["modules"] = {"nvidia-driver": "latest-dkms"}
        state_file.write_text(json.dumps(st))
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert changes(info, ("dnf", "dracut", "modprobe", "reboot")) == [
            ("dnf", ["install", "-y", "dnf-plugins-core", "python3-dnf-plugin-versionlock"]),
            ("dnf", ["config-manager", "--set-enabled", "crb"]),
            ("dnf", ["install", "-y", "epel-release"]),
            ("dnf", ["config-manager", "--add-repo", "https://developer.download.nvidia.com/"
                     "compute/cuda/repos/rhel9/x86_64/cuda-rhel9.repo"]),
            ("dnf", ["-q", "list", "kernel-devel-5.14.0-503.40.1.el9_5.x86_64"]),
            ("dnf", ["install", "-y", "kernel-devel-5.14.0-503.40.1.el9_5.x86_64",
                     "kernel-headers", "dkms"]),
            ("dnf", ["module", "reset", "-y", "nvidia-driver"]),
            ("dnf", ["module", "enable", "-y", "nvidia-driver:580-open"]),
            ("dnf", ["install", "-y", "nvidia-open"]),
            ("dracut", ["--regenerate-all", "-f"]),
            ("modprobe", ["nvidia"]),
            ("dnf", ["versionlock", "add", "*nvidia*580*"]),
        ]
        assert info.state()["held"] == ["kmod-nvidia-open-dkms", "nvidia-driver",
                                        "nvidia-driver-cuda", "nvidia-open"]
        assert "driver 580.126.20 loaded (CUDA <= 13.0)" in r.stdout
        # DKMS built the open module for the running kernel: kernel-devel and dkms were there
        assert harness.in_host(info, "test", "-e", "/lib/modules/5.14.0-503.40.1.el9_5.x86_64/extra/"
                               "nvidia.ko.xz", check=False).returncode == 0
    finally:
        harness.stop(info.id)


def test_container_driver_is_never_touched(hosts: Hosts, gp_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    info = hosts.fresh("autodl", failure="not_loaded",
                       failure_fixture="nvidia-smi/fail-couldnt-communicate-gcp-debian11.txt")
    try:
        r = gpu_provision("-H", info.inventory, "driver", home=gp_home, cwd=tmp_path)
        assert r.returncode == 2  # the plan is blocked: nothing can go ahead as asked
        assert "driver belongs to the platform: never touched" in r.stdout + r.stderr
        tools = {c["tool"] for c in info.calls()}
        assert not tools & {"apt-get", "ubuntu-drivers", "modprobe", "reboot", "apt-mark",
                            "update-initramfs"}
    finally:
        harness.stop(info.id)
