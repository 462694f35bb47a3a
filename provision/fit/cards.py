"""Which cards hold a job, and at what price: every GPU the datasheet table knows
(provision/tables/gpu_perf.yaml, memory_gb) and every priced offer (the inventories'
``gpu`` + ``price_per_hour``, and the reports built from published prices in
``bench/published/``), each with the number of cards it takes, the headroom left, and the
price for that many; cheapest first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from ..config.shipped import data_file
from ..config.yamlspec import fast_load
from .memory import Estimate, estimate

COUNTS = (1, 2, 4, 8)  # the machine sizes platforms rent


@dataclass(frozen=True)
class Offer:
    """A card model one can rent: its memory and, where known, a price for one card."""

    gpu: str  # the datasheet table's name ("RTX 4090", "H100")
    memory_gb: float
    price_per_hour: float | None = None  # one card
    currency: str | None = None
    platform: str | None = None
    source: str | None = None  # the inventory or published file the price comes from


@dataclass(frozen=True)
class Card:
    """One row of the answer."""

    gpu: str
    memory_gb: float
    count: int  # cards it takes (or --gpus)
    fits: bool
    need_gb: float  # per card
    headroom_gb: float  # per card: memory left (negative: short by)
    price_per_hour: float | None  # for ``count`` cards
    currency: str | None
    platform: str | None
    source: str | None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@cache
def datasheet() -> dict[str, float]:
    """GPU name fragment -> memory (GiB), from gpu_perf.yaml."""
    raw = fast_load(data_file("gpu_perf.yaml").read_text(encoding="utf-8"))["gpus"]
    return {name: float(v["memory_gb"]) for name, v in raw.items() if v.get("memory_gb")}


def card_name(text: str) -> str | None:
    """The datasheet table's name for a GPU as nvidia-smi or an inventory writes it
    ("NVIDIA H100 80GB HBM3" -> "H100"; longest fragment first, "H100 PCIe" before "H100")."""
    low = text.lower()
    return next((k for k in sorted(datasheet(), key=len, reverse=True) if k.lower() in low), None)


MEMORY_IN_NAME = re.compile(r"(\d+)\s*GB", re.I)


def published_offers(reports: Iterable[tuple[str, Mapping[str, Any]]]) -> list[Offer]:
    """Offers from bench reports built from published prices (their ``price_per_hour`` is for
    the report's GPUs together)."""
    out = []
    for source, r in reports:
        gpus = r.get("gpus") or []
        price = r.get("price_per_hour")
        name = card_name(str(gpus[0])) if gpus else None
        if not name or price is None:
            continue
        memory = r.get("memory_gb") or datasheet()[name]
        out.append(Offer(gpu=name, memory_gb=float(memory),
                         price_per_hour=float(price) / len(gpus), currency=r.get("currency"),
                         platform=r.get("platform"), source=Path(source).name))
    return out


CLAIM = re.compile(r"\s*(.*?\S)(?:\s*[x×]\s*(\d+))?\s*")


def inventory_offers(inventories: Iterable[tuple[str, Mapping[str, Any]]]) -> list[Offer]:
    """Offers from inventory files with ``gpu: RTX 4090 x2`` and ``price_per_hour`` (for the
    whole machine)."""
    out = []
    for source, data in inventories:
        claim, price = data.get("gpu"), data.get("price_per_hour")
        m = CLAIM.fullmatch(str(claim or ""))
        if not claim or price is None or not m:
            continue
        name = card_name(m.group(1))
        if not name:
            continue
        stated = MEMORY_IN_NAME.search(m.group(1))
        count = int(m.group(2) or 1)
        out.append(Offer(gpu=name, memory_gb=float(stated.group(1)) if stated else
                         datasheet()[name], price_per_hour=float(price) / count,
                         currency=data.get("currency"), platform=data.get("platform"),
                         source=Path(source).name))
    return out


def all_offers(priced: Iterable[Offer]) -> list[Offer]:
    """The priced offers, and every datasheet card no priced offer covers (price unknown)."""
    offers = list(priced)
    covered = {(o.gpu, o.memory_gb) for o in offers}
    offers += [Offer(gpu=g, memory_gb=m) for g, m in datasheet().items() if (g, m) not in covered]
    return offers


def rank(est: Estimate, offers: Iterable[Offer], need_gb: float | None = None,
         fixed: bool = False) -> list[Card]:
    """Each offer with the fewest cards (1, 2, 4, 8, or exactly the job's count when ``fixed``)
    that hold the job; those that fit first, cheapest for that many cards first, unpriced after
    (smallest first), then those that do not fit (closest first). ``need_gb``: a measured need
    per card, for the job's count of cards, instead of the estimate."""
    per_count: dict[int, float] = {}

    def need(n: int) -> float:
        if n not in per_count:
            per_count[n] = estimate(est.shape, replace(est.job, gpus=n)).total_gb \
                if n != est.job.gpus else est.total_gb
        return per_count[n]

    counts = (est.job.gpus,) if fixed or need_gb is not None else COUNTS
    if need_gb is not None:
        per_count[est.job.gpus] = need_gb
    rows = []
    for o in offers:
        n = next((c for c in counts if need(c) <= o.memory_gb), counts[-1])
        per = need(n)
        rows.append(Card(gpu=o.gpu, memory_gb=o.memory_gb, count=n, fits=per <= o.memory_gb,
                         need_gb=round(per, 2), headroom_gb=round(o.memory_gb - per, 2),
                         price_per_hour=round(o.price_per_hour * n, 4)
                         if o.price_per_hour is not None else None,
                         currency=o.currency, platform=o.platform, source=o.source))

    def key(c: Card) -> tuple[Any, ...]:
        return (not c.fits, c.price_per_hour is None, c.currency or "", c.price_per_hour or 0,
                c.count, c.memory_gb if c.fits else -c.headroom_gb, c.gpu)
    return sorted(rows, key=key)
