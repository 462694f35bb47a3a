"""What the ``fit`` task does (its declaration and help are in tasks_fit.py): read the shape,
estimate, gather the priced offers (inventories, published prices), measure on the host when
asked, rank the cards and print. Wiring only: the decisions are in provision/fit/."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from invoke.context import Context

from ..config.inventory import inventory_dirs, load_inventory
from ..errors import ProvisionError, UsageError
from ..fit import report
from ..fit.advice import changes
from ..fit.cards import Offer, all_offers, inventory_offers, published_offers, rank
from ..fit.measure import Prediction, batch_sizes, check_command, predict, read_runs
from ..fit.memory import Estimate, Job, estimate
from ..fit.shape import Shape, find_model, read_config, shape_from_flags
from ..money.compare import PUBLISHED, report_files
from ..ui import console as output
from .taskkit import has_host


def shape_of(model: str | None, config: str | None, params: str | None, layers: int | None,
             hidden: int | None, heads: int | None, kv_heads: int | None,
             vocab: int | None) -> Shape:
    """Exactly one of --model, --config, --params says what the model is."""
    given = [f for f, v in (("--model", model), ("--config", config), ("--params", params)) if v]
    if len(given) != 1:
        raise UsageError("fit: say what the model is with one of --model NAME, --config "
                         "config.json or --params 7B" + (f" (got {' and '.join(given)})"
                                                         if given else ""))
    shape_flags = [f"--{n}" for n, v in (("layers", layers), ("hidden", hidden), ("heads", heads),
                                         ("kv-heads", kv_heads), ("vocab", vocab)) if v]
    if shape_flags and not params:
        raise UsageError(f"fit: {', '.join(shape_flags)} go with --params; {given[0]} gives the "
                         "shape already")
    if model:
        return find_model(model)
    if config:
        return read_config(config)
    assert params is not None
    return shape_from_flags(params, layers, hidden, heads, kv_heads, vocab, seq_needed=True)


def _inventories() -> Iterator[tuple[str, dict[str, Any]]]:
    for folder in inventory_dirs():
        if folder.is_dir():
            for path in sorted(folder.glob("*.yaml")):
                yield str(path), dict(load_inventory(path).settings)


def _published() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for p in report_files([PUBLISHED]):
        try:
            out.append((str(p), json.loads(Path(p).read_text())))
        except (OSError, ValueError) as exc:
            raise ProvisionError(f"{p}: not a readable published report ({exc})") from None
    return out


def offers() -> list[Offer]:
    """Every card with the prices known: your inventories first, then the published ones."""
    return all_offers([*inventory_offers(_inventories()), *published_offers(_published())])


def measured(c: Context, job: Job, argv: tuple[str, ...], batches: str, batch_env: str | None,
             seconds: int, workdir: str | None) -> list[Prediction]:
    """Run the command at the small batch sizes on -H's host and fit its peaks."""
    from ..fit.measure import measure_step, needs_gpu
    from ..setup.engine import run_step
    from .taskkit import overrides as _overrides
    from .taskkit import session_of as _session

    sizes = batch_sizes(batches)
    check_command(argv, batch_env)
    if seconds < 1:
        raise UsageError(f"--measure-seconds {seconds}: at least 1 is needed")
    with _session(c) as s:
        p = s.plan(_overrides())
        assert p.facts is not None and p.layout is not None
        needs_gpu(s.target.name, len(p.facts.gpus))
        p.require_env("measure in")
        step = measure_step(argv, sizes, p.layout.python_bin, f"{p.layout.env_prefix}/bin",
                            batch_env, seconds, workdir)
        output.console.print(f"{s.target.name}: measure: {step.reason} ...", markup=False)
        outcome = run_step(s.ex, step, s.run, output.console, again="fit --measure")
    gpu, runs = read_runs(outcome.data)
    needs_gpu(s.target.name, 1 if gpu else 0)
    return predict(runs, job.batch)


def fit(c: Context, *, model: str | None, config: str | None, params: str | None,
        layers: int | None, hidden: int | None, heads: int | None, kv_heads: int | None,
        vocab: int | None, method: str, dtype: str | None, seq: int, batch: int,
        optimizer: str, gpus: int, checkpointing: bool, lora_rank: int | None, measure: bool,
        measure_batches: str, batch_env: str | None, measure_seconds: int,
        workdir: str | None, json_: bool) -> dict[str, Any]:
    from ..jobs.spec import command_after_dashes

    if gpus < 0:
        raise UsageError(f"--gpus {gpus}: at least 1 is needed")
    if measure and not has_host(c):
        raise UsageError("fit --measure runs the command on a host: -H <inventory name | "
                         "user@host:port>")
    argv = command_after_dashes()
    if argv and not measure:
        raise UsageError("fit: a command after -- is run only with --measure (and -H HOST)")
    shape = shape_of(model, config, params, layers, hidden, heads, kv_heads, vocab)
    job = Job(method=method, dtype=dtype, seq=seq, batch=batch, optimizer=optimizer,
              gpus=gpus or 1, checkpointing=checkpointing, lora_rank=lora_rank)
    est: Estimate = estimate(shape, job)
    pool = offers()
    predictions = measured(c, job, argv, measure_batches, batch_env, measure_seconds,
                           workdir) if measure else []
    need = None
    if predictions:  # what the card must hold: the measured peak and its error, if known
        first = predictions[0]
        need = first.gb + (first.error_gb or 0.0)
    cards = rank(est, pool, need_gb=need, fixed=gpus > 0)
    advice = changes(est, pool) if not any(card.fits for card in cards) else []
    answer = report.as_json(est, cards, advice, predictions)
    if json_:
        output.print_json(answer)
    else:
        for line in report.text(est, cards, advice, predictions):
            output.console.print(line, markup=False, highlight=False)
    return answer
