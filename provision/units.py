"""Byte counts as people read them: one spelling for every message and table (IEC units, as
nvidia-smi, df -h and the transfer bars speak of sizes)."""

from __future__ import annotations


def size(n: float | None) -> str:
    """``512 B``, ``1.5 KiB``, ``20.7 GiB``; ``-`` for an unknown size."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
