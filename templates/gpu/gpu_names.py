"""gpu-provision validation, GPU names as platforms and renters write them against the name
nvidia-smi prints. Pure functions (Python 3.8+, standard library only), shipped beside
gpu_verdict.py.

A listing says a model, and often a form factor, a memory size and a count, in any order and
spelling: RunPod's "H100 SXM" (nvidia-smi: "NVIDIA H100 80GB HBM3"), "H200 SXM" ("NVIDIA H200"),
"RTX 6000 Ada" ("NVIDIA RTX 6000 Ada Generation"), "V100 SXM2 32GB" ("Tesla V100-SXM2-32GB")
(docs.runpod.io/references/gpu-types); Lambda's "8x H100 (80 GB SXM5)", "1x A100 SXM4 (40 GB)",
"8x NVIDIA A100 SXM 80 GB", "4x NVIDIA A6000" ("NVIDIA RTX A6000"); vast.ai's "RTX 6000Ada",
"RTX 4080S" ("NVIDIA GeForce RTX 4080 SUPER"), "A100 SXM4", "H100_SXM". The test data with the
sources is tests/fixtures/validation/listings.yaml.

Parsed into: the model's words (vendor and product-line words dropped: NVIDIA, GeForce, Tesla,
Quadro, RTX - "A6000" is the RTX A6000, "6000 Ada" the RTX 6000 Ada, "6000" the Quadro RTX 6000),
the form factor (SXM of any generation, PCIe, NVL), the memory in GB and the count.
"""

from __future__ import annotations

import re
from typing import Any

DROP = {"nvidia", "geforce", "tesla", "quadro", "q", "rtx", "gtx", "generation", "gpu", "gpus",
        "hbm3", "hbm3e", "hbm2", "hbm2e", "gddr6", "gddr6x", "gddr7", "oam", "ac", "cc", "hgx"}
# a word before the model number that belongs after it: "RTX PRO 6000" is the 6000 of the PRO
# line ("NVIDIA RTX PRO 6000 Blackwell Server Edition"), neither the Quadro RTX 6000 nor the
# RTX 6000 Ada; listings also write it "RTX 6000 Pro"
AFTER_NUMBER = {"pro"}
# how listings shorten the board's words: "RTX PRO 6000 WK" (Workstation Edition), "MaxQ"
ALIASES = {"wk": "workstation", "ws": "workstation", "maxq": "max"}
SUFFIXES = {"s": "super", "ti": "ti", "super": "super", "d": "d", "ada": "ada"}
# families whose nvidia-smi name carries no form factor for the SXM board: "NVIDIA H100 80GB
# HBM3", "NVIDIA H200", "NVIDIA B200" are SXM; their PCIe and NVL boards say so in the name
SXM_UNNAMED = {"h100", "h200", "h800", "h20", "b100", "b200", "b300", "gh200"}
MEMORY = re.compile(r"^(\d+(?:\.\d+)?)(?:g|gb|gib)$")
COUNT = re.compile(r"^(?:(\d+)x|x(\d+))$")


def _tokens(text: str) -> list[str]:
    text = text.lower().replace("×", "x").replace("_", " ")
    text = re.sub(r"(\d)[\s-]+(gb|gib|g)\b", r"\1\2", text)  # "80 GB", "80-GB" -> "80gb"
    text = re.sub(r"\b(\d+)\s*x\s+", r"\1x ", text)  # "8 x H100" -> "8x H100"
    text = re.sub(r"\bx\s+(\d+)\b", r"x\1", text)  # "H100 x 8" -> "H100 x8"
    words = [ALIASES.get(w, w) for w in re.split(r"[\s_\-(),/]+", text) if w]
    for i in range(len(words) - 1):  # "pro 6000" -> "6000 pro"
        if words[i] in AFTER_NUMBER and re.fullmatch(r"\d{3,4}", words[i + 1]):
            words[i], words[i + 1] = words[i + 1], words[i]
    out: list[str] = []
    for w in words:
        # "6000ada" -> "6000 ada", "4080s" -> "4080 super", "4090d" -> "4090 d", "a100x" stays
        m = re.fullmatch(r"([a-z]*\d{3,4})(ada|s|ti|d)", w)
        if m and not MEMORY.match(w):
            out += [m.group(1), SUFFIXES[m.group(2)]]
        else:
            out.append(w)
    return out


def parse(text: str) -> dict[str, Any]:
    """{"model": ["h100"], "form": "sxm"|"pcie"|"nvl"|None, "memory_gb": 80.0|None,
    "count": 8|None} of a listing or of an nvidia-smi name."""
    model: list[str] = []
    form = memory = count = None
    for w in _tokens(text):
        if w in DROP:
            continue
        if re.fullmatch(r"sxm\d?", w):
            form = "sxm"
        elif w in ("pcie", "fhhl"):
            form = "pcie"
        elif w == "nvl":
            form = "nvl"
        elif MEMORY.match(w):
            memory = float(MEMORY.match(w).group(1))  # type: ignore[union-attr]
        elif COUNT.match(w):
            c = COUNT.match(w)
            count = int(c.group(1) or c.group(2))  # type: ignore[union-attr]
        elif w == "mig" or re.fullmatch(r"\d+g\.\d+gb", w):  # a MIG instance's profile words
            continue
        else:
            model.append(SUFFIXES.get(w, w) if model else w)
    return {"model": model, "form": form, "memory_gb": memory, "count": count}


# descriptive name words: the generation, and which edition of one board (the RTX PRO 6000's
# "Server Edition", "Workstation Edition", "Max-Q Workstation Edition" are one chip and memory)
IGNORED_EXTRA = {"blackwell", "edition", "hopper", "ampere", "lovelace", "server", "workstation",
                 "max"}


def model_key(model: list[str]) -> list[str]:
    """A model's words without the descriptive ones: what tells one card from another."""
    return [w for w in model if w not in IGNORED_EXTRA]


def same_model(want: list[str], have: list[str]) -> bool:
    """The model number first, then its other words in any order ("4070S Ti" is the "4070 Ti
    SUPER", "4000 Ada SFF" the "4000 SFF Ada"); a word the name adds is only allowed where it
    describes ("Blackwell"), never where it is another card ("6000" is not the "6000 Ada")."""
    if not want or not have or want[0] != have[0]:
        return False
    return set(want[1:]) == set(have[1:]) - (IGNORED_EXTRA - set(want[1:]))


def smi_form(parsed: dict[str, Any]) -> str | None:
    """The form factor of a GPU from its nvidia-smi name (SXM where the name gives none and the
    family's PCIe/NVL boards are named so)."""
    if parsed["form"]:
        return str(parsed["form"])
    return "sxm" if parsed["model"] and parsed["model"][0] in SXM_UNNAMED else None


def matches(claim: str, name: str, memory_mib: float | None = None) -> tuple[bool, str]:
    """Whether the GPU nvidia-smi calls ``name`` (with ``memory_mib`` of memory, when known) is
    the advertised ``claim``, and why not."""
    want, have = parse(claim), parse(name)
    if not want["model"]:
        return False, f"{claim!r} names no GPU model"
    if not same_model(want["model"], have["model"]):
        return False, f"the model is {' '.join(have['model']).upper() or name}"
    form = smi_form(have)
    if want["form"] and form and want["form"] != form:
        return False, f"it is the {form.upper() if form != 'pcie' else 'PCIe'} board"
    if want["memory_gb"]:
        gib = memory_mib / 1024 if memory_mib else have["memory_gb"]
        # nvidia-smi's memory.total is a little under the marketed size (ECC, the driver's
        # reservation: an L40S with ECC shows 45 of 48 GB): within 10%
        if gib and abs(gib - want["memory_gb"]) > 0.1 * want["memory_gb"]:
            return False, f"it has {gib:.0f} GB"
    return True, ""
