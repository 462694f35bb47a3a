"""What to change when no card holds the job: each change re-estimated, with the cheapest card
that then fits."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ..errors import UsageError
from .cards import Card, Offer, rank
from .memory import Estimate, estimate


@dataclass(frozen=True)
class Change:
    flags: str  # what to pass instead, in the command line's words
    why: str
    total_gb: float  # per card after the change
    card: Card | None  # the cheapest card that then fits

    def as_json(self) -> dict[str, object]:
        return {"change": self.flags, "why": self.why, "total_gb": round(self.total_gb, 2),
                "card": self.card.as_json() if self.card else None}


def changes(est: Estimate, offers: Iterable[Offer]) -> list[Change]:
    """Single changes that shrink the job, most effective first."""
    job = est.job
    tries: list[tuple[str, str, dict[str, object]]] = []
    if job.training and job.batch > 1:
        tries.append((f"--batch 1 with gradient accumulation {job.batch}",
                      "the same effective batch, one micro-batch in memory at a time",
                      {"batch": 1}))
    if job.training and not job.checkpointing:
        tries.append(("gradient checkpointing on", "keeps each layer's input only",
                      {"checkpointing": True}))
    if job.method in ("full", "lora"):
        tries.append(("--method qlora", "4-bit frozen weights, small trained adapters",
                      {"method": "qlora", "dtype": None}))
    if job.method == "full" and job.optimizer == "adamw":
        tries.append(("--optimizer adamw8bit", "8-bit optimizer states",
                      {"optimizer": "adamw8bit"}))
    if job.method == "infer" and job.weight_dtype in ("bf16", "fp16", "fp32"):
        tries.append(("--dtype int4", "4-bit weights", {"dtype": "int4"}))
    if job.seq > 256:
        tries.append((f"--seq {job.seq // 2}", "half the tokens per sequence",
                      {"seq": job.seq // 2}))
    more = next((n for n in (2, 4, 8) if n > job.gpus), None)
    if more:
        tries.append((f"--gpus {more}", "split over more cards", {"gpus": more}))
    pool = list(offers)
    out = []
    for flags, why, change in tries:
        try:
            new = estimate(est.shape, replace(est.job, **change))  # type: ignore[arg-type]
        except UsageError:
            continue
        fitting = [c for c in rank(new, pool, fixed=new.job.gpus > 1) if c.fits]
        out.append(Change(flags, why, new.total_gb, fitting[0] if fitting else None))
    return sorted(out, key=lambda c: (c.card is None, c.total_gb))
