"""``fit``: how much GPU memory a model and method need, which cards hold it and at what price;
with ``--measure``, from a few small-batch runs of the user's command on the host.

Declarations only: the task imports provision/fit when it runs.
"""

from __future__ import annotations

from typing import Any

from invoke.context import Context

from .taskkit import reports_errors, task

FIT_HELP = {
    "model": "a model of the shipped table (llama-3.1-8b, mistral-7b, qwen2.5-7b, mixtral-8x7b, "
             "...; the hub name works too)",
    "config": "a Hugging Face config.json to read the shape from",
    "params": "the parameter count (7B, 350M) when there is no config; add --layers and --hidden "
              "(and --heads, --kv-heads, --vocab) to count activations and the KV cache",
    "layers": "with --params: transformer layers",
    "hidden": "with --params: hidden size",
    "heads": "with --params: attention heads (default hidden / 128)",
    "kv_heads": "with --params: key/value heads (default: --heads)",
    "vocab": "with --params: vocabulary size (default 32000)",
    "method": "infer, lora, qlora or full (default lora)",
    "dtype": "the weights' dtype: bf16, fp16, fp32, int8, int4 (default int4 for qlora, else bf16)",
    "seq": "tokens per sequence (default 2048)",
    "batch": "sequences per step on each card (default 1)",
    "optimizer": "adamw, adamw8bit or sgd (training; default adamw)",
    "gpus": "cards to split the job over (default: the fewest of 1, 2, 4, 8 that hold it)",
    "no_checkpointing": "count activations without gradient checkpointing",
    "lora_rank": "LoRA rank (default 16), adapters on every Linear",
    "measure": "with -H: run the command after -- at two or three small batch sizes on the host "
               "and extrapolate its peak memory to --batch",
    "measure_batches": "with --measure: the small batch sizes (default 1,2,4)",
    "batch_env": "with --measure: also set this environment variable to the batch size (for "
                 "scripts that read it instead of a {batch} in their arguments)",
    "measure_seconds": "with --measure: stop each run after this many seconds (default 300)",
    "workdir": "with --measure: the folder the command runs in on the host (default: the home)",
    "json": "print the answer as JSON (total_gb, terms, cards, changes, measured)",
}


@task(help=FIT_HELP, command=True)
@reports_errors
def fit(c: Context, model: str | None = None, config: str | None = None,
        params: str | None = None, layers: int = 0, hidden: int = 0, heads: int = 0,
        kv_heads: int = 0, vocab: int = 0,
        method: str = "lora", dtype: str | None = None, seq: int = 2048, batch: int = 1,
        optimizer: str = "adamw", gpus: int = 0, no_checkpointing: bool = False,
        lora_rank: int = 0, measure: bool = False, measure_batches: str = "1,2,4",
        batch_env: str | None = None, measure_seconds: int = 300, workdir: str | None = None,
        json_: bool = False) -> dict[str, Any]:
    """GPU memory a model needs, term by term, and the cards that hold it, cheapest first.

    Offline by default: weights, gradients, optimizer state, activations (with or without
    gradient checkpointing), the KV cache for inference and the CUDA overhead, from the model's
    shape; the cards from the datasheet table, priced by your inventories and the published
    prices. With -H HOST --measure -- CMD, the command runs on the host at a few small batch
    sizes ({batch} in its words is replaced) and its peak memory is extrapolated to --batch.
    Example: gpu-provision fit --model llama-3.1-8b --method qlora --seq 4096 --batch 4
    """
    from .fit_commands import fit as run_fit

    # Invoke types a flag by its default: 0 stands for "not given" on the whole-number flags
    return run_fit(c, model=model, config=config, params=params, layers=layers or None,
                   hidden=hidden or None, heads=heads or None, kv_heads=kv_heads or None,
                   vocab=vocab or None, method=method, dtype=dtype, seq=seq, batch=batch,
                   optimizer=optimizer, gpus=gpus, checkpointing=not no_checkpointing,
                   lora_rank=lora_rank or None, measure=measure,
                   measure_batches=measure_batches, batch_env=batch_env,
                   measure_seconds=measure_seconds, workdir=workdir, json_=json_)
