"""A model's shape (layers, hidden size, heads, vocabulary, experts) and its parameter count:
from the shipped table (``--model``), a Hugging Face ``config.json`` (``--config``), or the
command line (``--params 7B --layers 32 ...``).

Pure: reads files it is given, touches no host. Every bad value is a UsageError of one line
that names the flag, file or key and what would be right.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ..config.shipped import data_file
from ..config.yamlspec import fast_load
from ..errors import UsageError


@dataclass(frozen=True)
class Shape:
    """What the memory terms need to know of a decoder-only transformer."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # the MLP's inner size (each expert's, for an MoE model)
    vocab: int
    tied: bool = False  # the output layer shares the embedding matrix
    experts: int = 1  # routed experts per layer (1: a dense model)
    experts_active: int = 1
    params_given: float | None = None  # --params: the count the user stated, in parameters
    source: str = ""

    @property
    def embedding_params(self) -> int:
        """The embedding and, unless tied, the output layer: kept in 16 bits by 4-/8-bit loads."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def linear_params_per_layer(self) -> int:
        """Attention (q, k, v, o) and the gated MLP of every expert, plus the router."""
        q_out = self.heads * self.head_dim
        attn = 2 * self.hidden * q_out + 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate * self.experts
        router = self.hidden * self.experts if self.experts > 1 else 0
        return attn + mlp + router

    @property
    def linear_params(self) -> int:
        return self.layers * self.linear_params_per_layer

    @property
    def params(self) -> int:
        """Every parameter: the stated count where --params gave one, else from the shape."""
        if self.params_given is not None:
            return int(self.params_given)
        norms = self.layers * 2 * self.hidden + self.hidden
        return self.linear_params + self.embedding_params + norms

    def lora_params(self, rank: int) -> int:
        """Adapters of rank ``rank`` on every Linear of attention and MLP (each expert's too):
        r x (d_in + d_out) each."""
        h, q_out, kv_out = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = (h + q_out) * 2 + (h + kv_out) * 2
        mlp = 3 * (h + self.intermediate) * self.experts
        return rank * self.layers * (attn + mlp)


MODELS_FILE = "models.yaml"


@cache
def model_table() -> dict[str, Shape]:
    """The shipped shapes (provision/tables/models.yaml), by name."""
    raw = fast_load(data_file(MODELS_FILE).read_text(encoding="utf-8"))["models"]
    return {name: shape_from_mapping(name, entry, f"{MODELS_FILE}: {name}")
            for name, entry in raw.items()}


def find_model(name: str) -> Shape:
    """The table's shape for ``name`` (case and the hub's ``org/`` prefix do not matter)."""
    table = model_table()
    key = name.strip().lower()
    by_hub = {str(s.source).split("huggingface.co/")[-1].split("/blob/")[0].lower(): s
              for s in table.values()}
    found = table.get(key) or by_hub.get(key) or table.get(key.split("/")[-1])
    if found is not None:
        return found
    near = difflib.get_close_matches(key.split("/")[-1], sorted(table), n=3, cutoff=0.5)
    hint = f"nearest: {', '.join(near)}" if near else f"known: {', '.join(sorted(table))}"
    raise UsageError(f"--model {name}: not in the shipped table ({hint}); or give the model's "
                     "config.json with --config")


def shape_from_mapping(name: str, entry: Mapping[str, Any], where: str,
                       spelled: Mapping[str, str] | None = None) -> Shape:
    """A table entry (our key names) as a Shape; ``spelled`` names each key as the file the
    entry came from writes it, for the error."""

    def whole(key: str, default: int | None = None) -> int:
        value = entry.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            got = "missing" if key not in entry and default is None else f"{value!r} is not"
            raise UsageError(f"{where}: {(spelled or {}).get(key, key)}: {got} a whole number "
                             "above 0".replace("missing a", "missing: a"))
        return value

    hidden, heads = whole("hidden"), whole("heads")
    experts = whole("experts", 1)
    inner = "expert_intermediate" if experts > 1 and "expert_intermediate" in entry \
        else "intermediate"
    return Shape(name=name, layers=whole("layers"), hidden=hidden, heads=heads,
                 kv_heads=whole("kv_heads", heads), head_dim=whole("head_dim", hidden // heads),
                 intermediate=whole(inner), vocab=whole("vocab"),
                 tied=bool(entry.get("tied", False)), experts=experts,
                 experts_active=whole("experts_active", 1), source=str(entry.get("source", "")))


# config.json spellings -> ours; the first one present wins (Mixtral says num_local_experts,
# Qwen-MoE num_experts, DeepSeek n_routed_experts)
CONFIG_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "head_dim": ("head_dim",),
    "intermediate": ("intermediate_size", "n_inner", "ffn_dim"),
    "expert_intermediate": ("moe_intermediate_size",),
    "vocab": ("vocab_size",),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_active": ("num_experts_per_tok",),
}


def read_config(path: str) -> Shape:
    """A Hugging Face ``config.json`` as a Shape. Multimodal configs keep the language model
    under ``text_config``: that part is read."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--config {path}: no such file (give the model's config.json)") \
            from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--config {path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: a JSON object (a model's config.json) is needed")
    if isinstance(data.get("text_config"), dict):
        data = {**data, **data["text_config"]}
    ours: dict[str, Any] = {}
    for key, spellings in CONFIG_KEYS.items():
        for spelling in spellings:
            if spelling in data and data[spelling] is not None:
                ours[key] = data[spelling]
                break
    if "intermediate" not in ours and "hidden" in ours and "expert_intermediate" not in ours:
        ours["intermediate"] = 4 * ours["hidden"]  # GPT-2 style configs leave it implied
    ours["tied"] = bool(data.get("tie_word_embeddings", False))
    name = str(data.get("_name_or_path") or p.parent.name or p.stem)
    return shape_from_mapping(name, {**ours, "source": str(p)}, f"--config {path}",
                              {k: v[0] for k, v in CONFIG_KEYS.items()})


SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmbt]?)\s*", re.I)
SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_params(text: str) -> float:
    """``7B`` -> 7e9, ``350M`` -> 3.5e8, ``1.5b``; a bare number is a count of parameters."""
    m = SIZE.fullmatch(text)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"--params {text}: write a size like 7B, 13b, 350M or 1.5B")
    return float(m.group(1)) * SCALE[m.group(2).lower()]


def shape_from_flags(params: str, layers: int | None, hidden: int | None, heads: int | None,
                     kv_heads: int | None, vocab: int | None, seq_needed: bool) -> Shape:
    """``--params 7B`` with what the flags add. Without --layers and --hidden the activations
    and the KV cache cannot be counted: an error says which flags are missing when they are
    needed (``seq_needed``)."""
    count = parse_params(params)
    missing = [f"--{n}" for n, v in (("layers", layers), ("hidden", hidden)) if v is None]
    if missing and seq_needed:
        raise UsageError(f"--params {params}: add {' and '.join(missing)} (activations and the "
                         "KV cache grow with them), or use --model NAME / --config config.json")
    for flag, value in (("layers", layers), ("hidden", hidden), ("heads", heads),
                        ("kv-heads", kv_heads), ("vocab", vocab)):
        if value is not None and value <= 0:
            raise UsageError(f"--{flag} {value}: a whole number above 0 is needed")
    h = hidden or 1
    a = heads or max(1, h // 128)  # 128-wide heads, as the Llama, Mistral and Qwen families use
    return Shape(name=f"{params} parameters", layers=layers or 1, hidden=h, heads=a,
                  kv_heads=kv_heads or a, head_dim=max(1, h // a), intermediate=4 * h,
                  vocab=vocab or 32000, params_given=count, source="command line")
