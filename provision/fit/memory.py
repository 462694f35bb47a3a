"""GPU memory a job needs, term by term: weights, gradients, optimizer state, activations,
logits, KV cache and the framework's overhead, per card. The figures and their sources are
data (provision/tables/fit.yaml); this module only combines them.

Sizes are GiB (2^30 bytes): the unit nvidia-smi's MiB and the cards' "24GB" are in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from ..config.shipped import data_file
from ..config.yamlspec import fast_load
from ..errors import UsageError
from .shape import Shape

METHODS = ("infer", "lora", "qlora", "full")
DTYPES = ("bf16", "fp16", "fp32", "int8", "int4")
OPTIMIZERS = ("adamw", "adamw8bit", "sgd")
GIB = 2**30


@cache
def formulas() -> Mapping[str, Any]:
    """provision/tables/fit.yaml: the figures every term is built from, with their sources."""
    data: Mapping[str, Any] = fast_load(data_file("fit.yaml").read_text(encoding="utf-8"))
    return data


@dataclass(frozen=True)
class Job:
    """What is asked: the method, the weights' dtype, tokens per step and cards."""

    method: str = "lora"
    dtype: str | None = None  # None: the method's usual one (int4 for qlora, else bf16)
    seq: int = 2048
    batch: int = 1  # per card: a micro-batch
    optimizer: str = "adamw"
    gpus: int = 1
    checkpointing: bool = True  # gradient checkpointing (training only)
    lora_rank: int | None = None  # None: the table's rank

    @property
    def weight_dtype(self) -> str:
        return self.dtype or ("int4" if self.method == "qlora" else "bf16")

    @property
    def training(self) -> bool:
        return self.method != "infer"


def check_job(job: Job) -> None:
    """One line for a job that cannot run as asked, naming the flag and what would work."""
    if job.method not in METHODS:
        raise UsageError(f"--method {job.method}: one of {', '.join(METHODS)}")
    if job.dtype is not None and job.dtype not in DTYPES:
        raise UsageError(f"--dtype {job.dtype}: one of {', '.join(DTYPES)}")
    if job.optimizer not in OPTIMIZERS:
        raise UsageError(f"--optimizer {job.optimizer}: one of {', '.join(OPTIMIZERS)}")
    for flag, value in (("batch", job.batch), ("seq", job.seq), ("gpus", job.gpus)):
        if value < 1:
            raise UsageError(f"--{flag} {value}: at least 1 is needed")
    if job.lora_rank is not None and job.lora_rank < 1:
        raise UsageError(f"--lora-rank {job.lora_rank}: at least 1 is needed")
    d = job.weight_dtype
    if job.method == "qlora" and d != "int4":
        raise UsageError(f"--method qlora --dtype {d}: QLoRA loads the weights in 4 bits: use "
                         f"--dtype int4 (or leave it out), or --method lora for {d} weights")
    if job.method == "full" and d in ("int8", "int4"):
        raise UsageError(f"--method full --dtype {d}: {d} weights cannot be trained directly; "
                         "use --dtype bf16 (or fp16, fp32), or --method qlora / lora")
    if job.method == "lora" and d == "int4":
        raise UsageError("--method lora --dtype int4: LoRA on 4-bit weights is QLoRA: use "
                         "--method qlora")


@dataclass(frozen=True)
class Estimate:
    """Per card, in GiB: each term, their sum, and what was assumed."""

    shape: Shape
    job: Job
    terms: Mapping[str, float]  # name -> GiB, in the order they are shown
    params: int
    trainable: int
    activations_other: float | None  # activations with checkpointing the other way round
    sharding: str | None  # how --gpus N splits the work
    notes: tuple[str, ...] = field(default=())

    @property
    def total_gb(self) -> float:
        return sum(self.terms.values())


def weight_bytes(shape: Shape, dtype: str) -> float:
    """Every weight in ``dtype``; 4- and 8-bit loads quantize the Linear layers only."""
    f = formulas()
    per = float(f["bytes_per_param"][dtype])
    if dtype not in ("int8", "int4"):
        return shape.params * per
    if dtype == "int4":
        per += float(f["int4_constants_bits"]) / 8
    linear = shape.linear_params if shape.params_given is None else \
        max(0, shape.params - shape.embedding_params)
    return linear * per + (shape.params - linear) * float(f["unquantized_bytes"])


def activation_bytes(shape: Shape, job: Job, checkpointing: bool) -> float:
    """What the layers keep for the backward pass (training), or one layer's working set
    during the prefill (inference)."""
    f = formulas()
    sbh = job.seq * job.batch * shape.hidden
    one_layer = float(f["activation_bytes_per_layer"]) * sbh
    if not job.training:
        return one_layer
    if checkpointing:
        return shape.layers * float(f["checkpoint_bytes_per_layer"]) * sbh + one_layer
    return shape.layers * one_layer


def estimate(shape: Shape, job: Job) -> Estimate:
    """The memory each of ``job.gpus`` cards needs for ``job`` on a model of ``shape``."""
    check_job(job)
    f = formulas()
    n = job.gpus
    dtype = job.weight_dtype
    terms: dict[str, float] = {"weights": weight_bytes(shape, dtype)}
    trainable = 0
    if job.method == "full":
        trainable = shape.params
        held = float(f["bytes_per_param"][dtype])
        master = float(f["master_copy_bytes"]) if held < 4 else 0.0
        terms["gradients"] = trainable * held
        terms["optimizer"] = trainable * (master + float(f["optimizer_state_bytes"][job.optimizer]))
    elif job.method in ("lora", "qlora"):
        trainable = shape.lora_params(job.lora_rank or int(f["lora_rank"]))
        held = float(f["bytes_per_param"][f["lora_dtype"]])
        terms["adapters"] = trainable * held
        terms["gradients"] = trainable * held
        master = float(f["master_copy_bytes"]) if held < 4 else 0.0
        terms["optimizer"] = trainable * (master + float(f["optimizer_state_bytes"][job.optimizer]))
    other: float | None = None
    if job.training:
        terms["activations"] = activation_bytes(shape, job, job.checkpointing)
        other = activation_bytes(shape, job, not job.checkpointing)
        terms["logits"] = float(f["logit_bytes"]) * job.seq * job.batch * shape.vocab
    else:
        terms["activations"] = activation_bytes(shape, job, False)
        terms["kv_cache"] = (2 * shape.layers * shape.kv_heads * shape.head_dim * job.seq
                             * job.batch * float(f["kv_bytes"]))
    sharding = None
    if n > 1:
        sharding = str(f["sharding"][job.method])
        split = {"full": ("weights", "gradients", "optimizer"),
                 "lora": ("weights", "adapters", "gradients", "optimizer", "activations"),
                 "qlora": ("weights", "adapters", "gradients", "optimizer", "activations"),
                 "infer": ("weights", "kv_cache")}[job.method]
        terms = {k: v / n if k in split else v for k, v in terms.items()}
        if other is not None and job.method in ("lora", "qlora"):
            other /= n
    tensors = sum(terms.values())
    gib = {k: v / GIB for k, v in terms.items()}
    gib["overhead"] = float(f["cuda_context_gb"]) + float(f["allocator_fraction"]) * tensors / GIB
    notes = []
    if job.training:
        notes.append("gradient checkpointing " + ("on" if job.checkpointing else "off"))
    return Estimate(shape=shape, job=job, terms=gib, params=shape.params, trainable=trainable,
                    activations_other=other / GIB if other is not None else None,
                    sharding=sharding, notes=tuple(notes))

