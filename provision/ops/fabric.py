"""The NVSwitch fabric manager: on HGX/DGX boards with NVSwitch, nvidia-fabricmanager of exactly
the loaded driver's version, held, enabled and running. A step of its own after the driver's,
so a driver that is already there but whose fabric manager is missing, stopped or of another
version is mended too; only on hosts we may touch (a container's belongs to the platform).

Package names (NVIDIA's gpu-driver-container install scripts, Ubuntu's archive): apt from
NVIDIA's CUDA repo ``nvidia-fabricmanager-<branch>`` before R580 and ``nvidia-fabricmanager``
from R580 on (the branch name turned into a virtual package there), Ubuntu's archive
``nvidia-fabricmanager-<branch>``; the two publish different revision suffixes, so the body
takes whichever entry of ``apt-cache madison`` has the driver's upstream version. dnf/yum from
NVIDIA's repo: ``nvidia-fabric-manager-<version>`` before R580, ``nvidia-fabricmanager-<version>``
from R580 on.
"""

from __future__ import annotations

from typing import Any

from ..facts.fabric import fabric_ready, fabric_summary, fm_packages
from ..facts.host import HostFacts
from ..remote.templating import render
from .driver import family, wait_context
from .step import Outcome, Step, dict_result, inputs_hash, nothing

FABRIC_WAIT = 180  # seconds: the fabric takes about a minute to come up after the start
ERR_802 = "until it runs, CUDA fails on every GPU with error 802 \"system not yet initialized\""


def read_fabric(result: Any) -> Outcome:
    return Outcome(data=dict_result(result, "fabric-manager"))


def fabric_step(facts: HostFacts, touchable: bool) -> Step | None:
    """None on hosts without NVSwitches."""
    if not facts.nvswitches and not facts.nvlink5:
        return None
    fm = facts.fabric_manager
    fabric = fabric_summary(facts.fabric)
    board = (f"NVSwitch board ({len(facts.nvswitches)} NVSwitches on the PCI bus)"
             if facts.nvswitches else f"NVLink5 board ({facts.nvlink5})")
    if not touchable:
        bad = fabric_ready(facts.fabric) is False
        return nothing("fabric-manager", f"{board}: the fabric manager runs on the platform's "
                       "host, never touched here" + (f"; {fabric}" if fabric else "")
                       + (f": {ERR_802.replace('until it runs', 'until it completes')}; ask "
                          "the provider" if bad else ""))
    if not facts.nvswitches:
        return nothing("fabric-manager", f"{board}: its NVSwitches sit behind ConnectX-7 bridges "
                       "and need nvidia-fabricmanager and NVLSM of the driver's version, with the "
                       "InfiniBand modules (mlx5_ib, ib_umad) loaded; gpu-provision does not "
                       "install those: follow NVIDIA's Fabric Manager guide for NVLink5")
    if facts.nvidia_state != "ok" or not facts.driver:
        return nothing("fabric-manager", f"{board}: nvidia-fabricmanager of exactly the driver's "
                       "version follows once the driver answers")
    driver = facts.driver
    if fm is not None and fm.version == driver and fm.running:
        return nothing("fabric-manager", f"{board}: nvidia-fabricmanager {driver} running (the "
                       f"driver's version)" + (f"; {fabric}" if fabric else ""))
    if fm is None or fm.version is None:
        why = "nvidia-fabricmanager is not installed"
    elif fm.version != driver:
        why = (f"nvidia-fabricmanager is {fm.version}, not the driver's {driver} (it refuses to "
               "start)")
    else:
        why = f"nvidia-fabricmanager {driver} is installed but {fm.active or 'not running'}"
    install = fm is None or fm.version != driver
    fam = family(facts)
    packages = fm_packages(fam, driver)
    # the install waits for cloud-init and the package manager's locks as the driver's does
    body = render("setup/fabricmanager.sh.j2", family=fam, packages=packages, driver=driver,
                  install=install, wait=FABRIC_WAIT, **wait_context(fam))
    action = (f"install nvidia-fabricmanager {driver}, hold it and start it" if install
              else "enable and start nvidia-fabricmanager")
    return Step("fabric-manager", f"{board}: {why}; {ERR_802}", action=action, body=body,
                inputs=inputs_hash(driver=driver, install=install, packages=packages),
                read=read_fabric, needs_root=True)
