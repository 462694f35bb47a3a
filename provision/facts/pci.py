"""``lspci`` (plain or ``-nn``) -> the NVIDIA display/3D controllers on the bus."""

from __future__ import annotations

import re
from dataclasses import dataclass

_CLASS = re.compile(r"^(?P<slot>[0-9a-fA-F:./]+)\s+(?P<cls>VGA compatible controller|3D controller|"
                    r"Display controller)(?: \[03\d\d\])?: (?P<desc>.*)$")


@dataclass(frozen=True)
class PciGpu:
    slot: str
    name: str  # "GA102 [GeForce RTX 3090]"
    device_id: str | None  # "2204" with -nn, else None


def parse_lspci(text: str) -> tuple[PciGpu, ...]:
    """NVIDIA GPUs (vendor 10de) in lspci output; other vendors and audio functions are dropped."""
    gpus = []
    for line in text.splitlines():
        m = _CLASS.match(line.strip())
        if not m:
            continue
        desc = m.group("desc")
        ids = re.search(r"\[10de:([0-9a-fA-F]{4})\]", desc)
        if not ids and not desc.startswith("NVIDIA Corporation"):
            continue
        name = re.sub(r"\s*\[[0-9a-fA-F]{4}:[0-9a-fA-F]{4}\]", "", desc)
        name = re.sub(r"\s*\(rev [0-9a-fA-F]+\)$", "", name).removeprefix("NVIDIA Corporation ")
        gpus.append(PciGpu(slot=m.group("slot"), name=name.strip(),
                           device_id=ids.group(1).lower() if ids else None))
    return tuple(gpus)
