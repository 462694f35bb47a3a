"""The NVIDIA driver: install with the distro's tools, reboot only when the module cannot load,
then hold it. Only on hosts we may touch."""

from __future__ import annotations

from functools import partial
from typing import Any

from ..errors import ProvisionError
from ..facts.host import HostFacts
from ..remote.templating import render
from .privilege import as_login
from .step import Outcome, Step, dict_result, inputs_hash

CENTOS_VAULT = "https://vault.centos.org/7.9.2009"
REBOOT_BODY = ("echo 'NEEDS_REBOOT (NVML does not match the loaded module)'\n"
               "echo '{\"reboot\": true}' > \"$RESULT\"")


# Enterprise Linux and its rebuilds by os-release ID: ELRepo serves release 7, NVIDIA's CUDA repo
# 8 to 10. Others of the yum family that call themselves "like rhel" (Amazon Linux 2 says
# ID_LIKE="centos rhel fedora" with VERSION_ID 2; Alibaba Cloud Linux, openEuler, TencentOS)
# number their releases otherwise and are served by neither.
EL_IDS = ("rhel", "centos", "rocky", "almalinux", "ol")


def family(facts: HostFacts) -> str:
    """``apt``, ``el7`` (yum + ELRepo) or ``el`` (dnf + NVIDIA's repo)."""
    if facts.os.family == "apt":
        return "apt"
    el = facts.os.id in EL_IDS
    if el and facts.os.major == 7:
        return "el7"
    if el and facts.os.major in (8, 9, 10):
        return "el"
    raise ValueError(f"no driver install path for {facts.os.label}")


def read_driver(result: Any) -> Outcome:
    """The body says whether the module loaded, or needs the next boot."""
    return Outcome(reboot=bool(dict_result(result, "driver").get("reboot")))


def confirm_driver(facts: HostFacts) -> str:
    """After the driver step (and its reboot): nvidia-smi must answer."""
    if facts.nvidia_state != "ok":
        raise ProvisionError(f"after the driver step nvidia-smi reports: {facts.nvidia_detail}; "
                             "see logs/ and `gpu-provision doctor`")
    return f"driver {facts.driver} loaded (CUDA <= {facts.driver_cuda})"


def install_step(facts: HostFacts, branch: int, open_modules: bool, action: str,
                 reason: str) -> Step:
    fam = family(facts)
    kmod, x11 = ("kmod-nvidia-470xx", "nvidia-x11-drv-470xx") if branch == 470 else \
        ("kmod-nvidia", "nvidia-x11-drv")
    # Debian ships one branch as "nvidia-driver"; Ubuntu without ubuntu-drivers has per-branch names
    apt_package = "nvidia-driver" if facts.os.id == "debian" else \
        f"nvidia-driver-{branch}-server{'-open' if open_modules else ''}"
    body = render("setup/driver.sh.j2", family=fam, branch=str(branch), open_modules=open_modules,
                  apt_package=apt_package, kmod=kmod, x11=x11, vault=CENTOS_VAULT,
                  el=str(facts.os.major or 9))
    return Step("driver", reason, action=action, body=body,
                inputs=inputs_hash(branch=branch, open=open_modules, os=facts.os.id),
                read=read_driver, settle=confirm_driver,
                then=partial(hold_step, branch=branch, open_modules=open_modules), needs_root=True)


def reboot_step(facts: HostFacts, reason: str) -> Step:
    """The driver's libraries were upgraded under the loaded module: the next boot loads the
    matching one."""
    return Step("driver", reason, action="reboot", body=REBOOT_BODY,
                inputs=inputs_hash(boot=facts.boot_id), read=read_driver, settle=confirm_driver,
                needs_root=True)  # the body only asks; the reboot the engine then runs needs root


def hold_step(facts: HostFacts, branch: int, open_modules: bool) -> Step:
    fam = family(facts)
    if fam == "apt":
        fallback = ("nvidia-driver" if facts.os.id == "debian" else
                    f"nvidia-driver-{branch}-server{'-open' if open_modules else ''}")
        pattern = (f"^(nvidia-driver|nvidia-dkms|nvidia-kernel|nvidia-utils|libnvidia-compute)"
                   f".*{branch}|^nvidia-driver$")
    else:
        fallback = ("kmod-nvidia-470xx" if branch == 470 else "kmod-nvidia") if fam == "el7" \
            else ("nvidia-open" if open_modules else "cuda-drivers")
        pattern = ""
    body = render("setup/driver_hold.sh.j2", family=fam, pattern=pattern, fallback=fallback)
    return as_login(Step("driver-hold", "so unattended upgrades cannot replace the driver under a "
                         "running job", action=f"hold the driver packages ({fallback})", body=body,
                         inputs=inputs_hash(branch=branch), needs_root=True), facts)
