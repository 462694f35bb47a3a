"""``fit``'s answer as JSON and as text lines: the terms, the cards cheapest first, and what
to change when nothing fits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .advice import Change
from .cards import Card
from .measure import Prediction
from .memory import Estimate

TERM_WORDS = {
    "weights": "weights",
    "adapters": "LoRA adapters",
    "gradients": "gradients",
    "optimizer": "optimizer state",
    "activations": "activations",
    "logits": "logits and loss",
    "kv_cache": "KV cache",
    "overhead": "CUDA context + allocator",
}


def as_json(est: Estimate, cards: Sequence[Card], changes: Sequence[Change] = (),
            measured: Sequence[Prediction] = ()) -> dict[str, Any]:
    job = est.job
    return {
        "model": est.shape.name, "source": est.shape.source,
        "params": est.params, "trainable_params": est.trainable,
        "method": job.method, "dtype": job.weight_dtype, "seq": job.seq, "batch": job.batch,
        "optimizer": job.optimizer if job.training else None, "gpus": job.gpus,
        "checkpointing": job.checkpointing if job.training else None,
        "sharding": est.sharding,
        "total_gb": round(est.total_gb, 2),
        "terms": {k: round(v, 3) for k, v in est.terms.items()},
        "activations_other_gb": round(est.activations_other, 3)
        if est.activations_other is not None else None,
        "cards": [c.as_json() for c in cards],
        "changes": [c.as_json() for c in changes],
        "measured": [p.as_json() for p in measured],
    }


def _money(value: float | None, currency: str | None) -> str:
    return "price unknown" if value is None else f"{value:.2f} {currency or ''}/h".replace(" /", "/")


def text(est: Estimate, cards: Sequence[Card], changes: Sequence[Change] = (),
         measured: Sequence[Prediction] = (), shown: int = 8) -> list[str]:
    """What the task prints: the job, each term, the total, the cards, the changes."""
    job = est.job
    what = f"{job.method} {job.weight_dtype}, seq {job.seq}, batch {job.batch}"
    if job.training:
        what += f", {job.optimizer}, checkpointing {'on' if job.checkpointing else 'off'}"
    lines = [f"{est.shape.name}: {est.params / 1e9:.2f}B parameters"
             + (f", {est.trainable / 1e6:.1f}M trained" if est.trainable and job.method != "full"
                else "") + f"; {what}"]
    if est.sharding:
        lines.append(f"over {job.gpus} cards: {est.sharding}; per card:")
    width = max(len(w) for w in TERM_WORDS.values())
    for name, gb in est.terms.items():
        lines.append(f"  {TERM_WORDS.get(name, name):<{width}}  {gb:8.2f} GB")
    lines.append(f"  {'total':<{width}}  {est.total_gb:8.2f} GB")
    if est.activations_other is not None:
        other = "off" if job.checkpointing else "on"
        lines.append(f"  (activations with checkpointing {other}: {est.activations_other:.2f} GB)")
    for p in measured:
        err = f" ± {p.error_gb:.2f}" if p.error_gb is not None else " (error unknown: 2 points)"
        lines.append(f"measured ({p.source}): {p.line.a:.2f} GB + {p.line.b:.3f} GB x batch -> "
                     f"{p.gb:.2f}{err} GB at batch {p.target}")
    fits = [c for c in cards if c.fits]
    if fits:
        lines.append("cards that hold it, cheapest first:")
        for c in fits[:shown]:
            where = f" on {c.platform}" if c.platform else ""
            lines.append(f"  {c.gpu} {c.memory_gb:g} GB x{c.count}{where}: "
                         f"{_money(c.price_per_hour, c.currency)}, headroom {c.headroom_gb:.1f} GB"
                         " per card")
        if len(fits) > shown:
            lines.append(f"  ... and {len(fits) - shown} more (--json lists them all)")
    else:
        lines.append("no card holds it as asked; what would change that:")
        for ch in changes:
            where = (f"{ch.card.gpu} {ch.card.memory_gb:g} GB x{ch.card.count}, "
                     f"{_money(ch.card.price_per_hour, ch.card.currency)}"
                     if ch.card else "still no card")
            lines.append(f"  {ch.flags}: {ch.total_gb:.1f} GB per card ({ch.why}) -> {where}")
    return lines
