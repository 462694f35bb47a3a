"""What the PyTorch mirror served when the torch step last read it: the cache files the step
writes under ``~/.gpu-provision/index/`` (one JSON line per mirror and variant, see
``provision.wheels.simpleindex``), read back by the facts script in its one execution."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class IndexCache:
    url: str  # "<base>/<variant>/"
    base: str
    variant: str
    arch: str
    at: float  # the host's clock when it was read
    read: tuple[str, ...]  # the projects whose pages were read
    served: Mapping[str, Mapping[str, tuple[str, ...]]]  # project -> release -> python tags

    def as_entry(self) -> dict[str, Any]:
        """The shape ``simpleindex.pick`` takes."""
        return {"url": self.url, "base": self.base, "variant": self.variant, "at": self.at,
                "read": list(self.read),
                "served": {p: {v: list(t) for v, t in r.items()} for p, r in self.served.items()}}


def parse_index_cache(text: str) -> tuple[IndexCache, ...]:
    """One cache entry per JSON line; lines that are not one (a half-written file) are skipped:
    the next torch step reads the mirror again anyway."""
    out = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
            out.append(IndexCache(
                url=str(d["url"]), base=str(d["base"]).rstrip("/"), variant=str(d["variant"]),
                arch=str(d.get("arch", "")), at=float(d.get("at") or 0),
                read=tuple(str(p) for p in d.get("read", ())),
                served={str(p): {str(v): tuple(str(t) for t in tags) for v, tags in r.items()}
                        for p, r in (d.get("served") or {}).items()}))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return tuple(out)
