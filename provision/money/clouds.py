"""Which cloud a VM runs on, and whether a power-off from inside it ends the bill there.

A pure reading of what the host reported (DMI values, Xen's hypervisor uuid, the instance's
life cycle from AWS's instance metadata) against ``clouds.yaml``. autostop refuses a shutdown
where it would leave the machine billed (Azure, Alibaba, Tencent, DigitalOcean, IBM, Hetzner,
Vultr, Scaleway) or would
delete it (an AWS one-time Spot instance), and ``cost`` promises a saving only where it is known.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from ..config.shipped import data_file

DMI_NAMES = ("sys_vendor", "product_name", "chassis_asset_tag", "board_vendor")


@dataclass(frozen=True)
class Cloud:
    name: str
    shutdown: str  # ends | refused | maybe
    why: str
    spot: str = ""  # the refusal for a Spot instance (AWS)


@dataclass(frozen=True)
class Verdict:
    cloud: str | None  # None: not a cloud we know
    refused: str | None  # why a shutdown from inside must not be used here
    billing_ends: bool | None  # True: known to end the compute billing; None: not known
    note: str


@cache
def _table() -> tuple[tuple[Cloud, tuple[Mapping[str, str], ...]], ...]:
    data = yaml.safe_load(data_file("clouds.yaml").read_text())
    return tuple((Cloud(c["name"], c["shutdown"], " ".join(str(c["why"]).split()),
                        " ".join(str(c.get("spot") or "").split())),
                  tuple(c["match"])) for c in data["clouds"])


def _matches(entry: Mapping[str, str], seen: Mapping[str, str]) -> bool:
    return all(fnmatch.fnmatch(seen.get(k, "").strip().lower(), str(pat).lower())
               for k, pat in entry.items())


def identify(seen: Mapping[str, str]) -> Cloud | None:
    """The cloud whose DMI (or hypervisor uuid) the host showed, if any."""
    for cloud, entries in _table():
        if any(_matches(e, seen) for e in entries):
            return cloud
    return None


def shutdown_verdict(seen: Mapping[str, Any]) -> Verdict:
    """What a shutdown from inside does here. ``seen``: the DMI values by name,
    ``hypervisor_uuid`` and ``life_cycle`` (AWS instance metadata, "" when not asked or not
    answered)."""
    values = {k: str(v or "") for k, v in seen.items()}
    cloud = identify(values)
    if cloud is None:
        return Verdict(None, None, None, "the cloud is not known (no DMI a known cloud shows): "
                       "a power-off ends the bill only where the provider stops billing a "
                       "powered-off machine")
    if cloud.shutdown == "refused":
        return Verdict(cloud.name, f"{cloud.name}: {cloud.why}", False, "")
    if cloud.shutdown == "maybe":  # set; what it saves is not known here
        return Verdict(cloud.name, None, None, f"{cloud.name}: {cloud.why}")
    if cloud.spot and values.get("life_cycle", "").strip() == "spot":
        return Verdict(cloud.name, cloud.spot, False, "")
    note = f"{cloud.name}: {cloud.why}"
    if cloud.spot and not values.get("life_cycle"):
        note += ("; the instance metadata did not say whether this is a Spot instance (a "
                 "one-time Spot instance is deleted by a shutdown)")
    return Verdict(cloud.name, None, True, note)
