"""The NVIDIA driver: install the branch ``driver_pick`` chose with the distro's tools, reboot
only when a reboot can help (the module cannot load while nouveau holds the GPU or an older
module is loaded), then hold it. Only on hosts we may touch."""

from __future__ import annotations

from functools import partial
from typing import Any

from ..errors import ProvisionError
from ..facts.host import HostFacts
from ..remote.templating import render
from .driver_pick import EL_IDS, NoDriver, Pick, table
from .privilege import as_login
from .step import Outcome, Step, dict_result, inputs_hash

CENTOS_VAULT = "https://vault.centos.org/7.9.2009"
REBOOT_BODY = ("echo 'NEEDS_REBOOT (NVML does not match the loaded module)'\n"
               "echo '{\"reboot\": true}' > \"$RESULT\"")
# How long a step waits for cloud-init and for the package manager's locks before it gives up
# naming the holder (the daily apt job after a boot usually ends within minutes).
WAIT_LIMIT = 600
# What holds each package manager: apt's and dpkg's fcntl locks, dnf's and yum's pid files.
LOCKS = {"apt": ("/var/lib/apt/lists/lock", "/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock",
                 "/var/cache/apt/archives/lock"),
         "el7": ("/var/run/yum.pid",),
         "el": ("/var/cache/dnf/metadata_lock.pid", "/var/lib/dnf/rpmdb_lock.pid",
                "/var/run/yum.pid")}


def family(facts: HostFacts) -> str:
    """``apt``, ``el7`` (yum + ELRepo) or ``el`` (dnf + NVIDIA's repository): which package
    manager the host's driver steps speak."""
    if facts.os.family == "apt":
        return "apt"
    el = facts.os.id in EL_IDS
    if el and facts.os.major == 7:
        return "el7"
    if el and facts.os.major in (8, 9, 10):
        return "el"
    raise ValueError(f"no driver install path for {facts.os.label}")


def wait_context(fam: str, limit: int = WAIT_LIMIT) -> dict[str, Any]:
    """What templates/setup/_pkg_wait.sh.j2 needs."""
    return {"locks": LOCKS[fam], "wait_limit": limit}


def read_driver(result: Any) -> Outcome:
    """The body says whether the module loaded, or needs the next boot."""
    return Outcome(reboot=bool(dict_result(result, "driver").get("reboot")))


def confirm_driver(facts: HostFacts) -> str:
    """After the driver step (and its reboot): nvidia-smi must answer."""
    if facts.nvidia_state != "ok":
        raise ProvisionError(f"after the driver step nvidia-smi reports: {facts.nvidia_detail}; "
                             "see logs/ and `gpu-provision doctor`")
    return f"driver {facts.driver} loaded (CUDA <= {facts.driver_cuda})"


def packages(pick: Pick) -> list[str]:
    """The packages the route installs for this pick (Ubuntu's are chosen on the host: the
    prebuilt modules where the archive has them for the running kernel)."""
    spec = table()["routes"][pick.route].get("packages", {})
    names = spec.get(str(pick.branch)) or spec["open" if pick.open else "proprietary"]
    return [str(n) for n in names]


def install_step(facts: HostFacts, pick: Pick, action: str, reason: str,
                 wait_limit: int = WAIT_LIMIT) -> Step:
    route = table()["routes"][pick.route]
    el = facts.os.major or 0
    context: dict[str, Any] = {
        "route": pick.route, "branch": pick.branch, "signed_only": pick.signed_only,
        "os_id": facts.os.id, "el": el, "vault": CENTOS_VAULT, "mok_key": route["mok_key"],
        "base": str(route.get("base", "")).format(branch=pick.branch,
                                                   open="-open" if pick.open else ""),
        "packages": [] if pick.route == "ubuntu" else packages(pick),
        "components": route.get("components", []),
        # where the release's archive cannot serve: said in a refusal the host finds
        "otherwise": str(table()["releases"].get(pick.release, {}).get("otherwise", "")),
        "stream": f"{pick.branch}-{'open' if pick.open else 'dkms'}",
        "cuda_repo": "",
        **wait_context(family(facts), wait_limit)}
    if "repo" in route:
        arch = route["arch"].get(facts.arch or "x86_64")
        if arch is None:
            raise NoDriver(f"NVIDIA's CUDA repository has no {facts.arch} build for "
                                 f"{facts.os.label} (it serves {', '.join(route['arch'])})")
        context["cuda_repo"] = route["repo"].format(el=el, arch=arch)
    body = render("setup/driver.sh.j2", **context)
    return Step("driver", reason, action=action, body=body,
                inputs=inputs_hash(branch=pick.branch, open=pick.open, route=pick.route,
                                   os=facts.os.id, signed=pick.signed_only),
                read=read_driver, settle=confirm_driver,
                then=partial(hold_loaded, branch=pick.branch), needs_root=True)


def reboot_step(facts: HostFacts, reason: str) -> Step:
    """The driver's libraries were upgraded under the loaded module: the next boot loads the
    matching one."""
    return Step("driver", reason, action="reboot", body=REBOOT_BODY,
                inputs=inputs_hash(boot=facts.boot_id), read=read_driver, settle=confirm_driver,
                needs_root=True)  # the body only asks; the reboot the engine then runs needs root


def hold_loaded(facts: HostFacts, branch: int) -> Step:
    """The hold once the driver answers: of the branch that loaded (a transitional package of
    the archive can bring a newer one than the branch asked for), else the one installed."""
    loaded = (facts.driver or "").split(".")[0]
    return hold_step(facts, int(loaded) if loaded.isdigit() else branch)


def hold_step(facts: HostFacts, branch: int) -> Step:
    """Every package of the installed branch held, the module's and the libraries' alike, so an
    unattended upgrade cannot replace the driver under a running job (NVML mismatch)."""
    fam = family(facts)
    body = render("setup/driver_hold.sh.j2", family=fam, branch=str(branch),
                  **wait_context(fam))
    what = {"apt": f"every installed package of branch {branch}; with prebuilt modules, the "
                   "kernel's metapackages too",
            "el7": "kmod-nvidia* and nvidia-x11-drv*"}.get(fam, f"*nvidia*{branch}*")
    return as_login(Step("driver-hold", "so unattended upgrades cannot replace the driver under a "
                         "running job", action=f"hold the driver packages ({what})", body=body,
                         inputs=inputs_hash(branch=branch), needs_root=True), facts)
