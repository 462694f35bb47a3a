"""``nvcc -V`` -> the toolkit version (the installed compiler, not what the driver supports)."""

from __future__ import annotations

import re


def parse_nvcc(text: str) -> str | None:
    """``Cuda compilation tools, release 12.4, V12.4.99`` -> ``"12.4.99"`` (None if absent)."""
    m = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", text)
    if m:
        return m.group(2)
    m = re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else None
