"""fit's cards: the datasheet table's memory, priced by inventories and the published prices,
cheapest first; and what to change when nothing fits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from provision.fit.advice import changes
from provision.fit.cards import Offer, card_name, datasheet, inventory_offers, published_offers, rank
from provision.fit.memory import Job, estimate
from provision.fit.shape import find_model

ROOT = Path(__file__).resolve().parent.parent.parent
PUBLISHED = ROOT / "bench" / "published"


def published() -> list[tuple[str, dict[str, object]]]:
    return [(str(p), json.loads(p.read_text())) for p in sorted(PUBLISHED.glob("*.json"))]


def test_every_published_file_cites_a_page_and_a_date_and_prices_one_card() -> None:
    for path, r in published():
        text = str(r["published"]) + str(r["_note"])
        assert "not measured" in str(r["published"]), path
        assert "http" in str(r["_note"]) or ".io" in text or ".ai" in text, path
        assert any(y in text for y in ("2026-", "June 2026")), path
        assert r["currency"] == "USD" and float(r["price_per_hour"]) > 0  # type: ignore[arg-type]
        assert len(r["gpus"]) == 1 and card_name(str(r["gpus"][0])), path  # type: ignore[arg-type]
    cards = {card_name(str(r["gpus"][0])) for _, r in published()}  # type: ignore[index]
    assert {"RTX 3090", "RTX 4090", "RTX 5090", "RTX A6000", "L40S", "A100", "H100"} <= cards
    assert {r["platform"] for _, r in published()} == {"runpod", "lambda", "vast"}


def test_names_as_nvidia_smi_writes_them() -> None:
    assert card_name("NVIDIA GeForce RTX 4090") == "RTX 4090"
    assert card_name("NVIDIA H100 PCIe") == "H100 PCIe"
    assert card_name("NVIDIA A100-SXM4-40GB") == "A100"
    assert card_name("NVIDIA RTX A6000") == "RTX A6000"
    assert card_name("AMD Instinct MI300X") is None


def test_a_7b_lora_goes_on_the_cheapest_card_that_holds_it() -> None:
    est = estimate(find_model("llama-3.1-8b"), Job(method="qlora", seq=2048, batch=1))
    cards = rank(est, [*published_offers(published()),
                       *(Offer(g, m) for g, m in datasheet().items())])
    fits = [c for c in cards if c.fits]
    priced = [c for c in fits if c.price_per_hour is not None]
    assert priced == sorted(priced, key=lambda c: c.price_per_hour or 0)
    assert fits[0].gpu == "RTX 3090" and fits[0].count == 1 and fits[0].price_per_hour == 0.22
    assert fits[0].headroom_gb == pytest.approx(24 - est.total_gb, abs=0.01)
    assert fits.index(priced[-1]) < fits.index(next(c for c in fits if c.price_per_hour is None))


def test_a_70b_full_finetune_takes_several_cards_and_says_so() -> None:
    est = estimate(find_model("llama-3.1-70b"), Job(method="full", seq=2048))
    cards = rank(est, [Offer("H100", 80, 2.69, "USD", "runpod")])
    assert cards[0].fits is False  # 8 x 80 GB cannot hold 70B x 16 bytes / 8 + activations
    est = estimate(find_model("llama-3.1-8b"), Job(method="full", seq=2048))
    h100 = rank(est, [Offer("H100", 80, 2.69, "USD", "runpod")])[0]
    assert h100.fits and h100.count == 2 and h100.price_per_hour == pytest.approx(5.38)


def test_inventory_prices_are_per_machine() -> None:
    offers = inventory_offers([("inventories/my-3090s.yaml",
                                {"gpu": "RTX 3090 x2", "price_per_hour": 1.6, "currency": "CNY",
                                 "platform": "autodl"}),
                               ("inventories/cpu.yaml", {"price_per_hour": 0.1}),
                               ("inventories/a100.yaml", {"gpu": "A100 40GB x1",
                                                          "price_per_hour": 1.2})])
    assert offers == [Offer("RTX 3090", 24.0, 0.8, "CNY", "autodl", "my-3090s.yaml"),
                      Offer("A100 40GB", 40.0, 1.2, None, None, "a100.yaml")]


def test_when_nothing_fits_each_change_is_priced() -> None:
    est = estimate(find_model("llama-3.1-8b"), Job(method="lora", seq=8192, batch=8, gpus=1))
    offers = [Offer("RTX 4090", 24, 0.34, "USD", "runpod")]
    assert not any(c.fits for c in rank(est, offers))
    found = {c.flags: c for c in changes(est, offers)}
    assert "--batch 1 with gradient accumulation 8" in found and "--method qlora" in found
    assert all(c.total_gb < est.total_gb for c in found.values())
    assert found["--batch 1 with gradient accumulation 8"].card is not None


BIN = Path(sys.executable).parent / "gpu-provision"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_fit_json_answer(tmp_path: Path) -> None:
    r = cli("fit", "--model", "llama-3.1-8b", "--method", "lora", "--seq", "4096", "--json",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    assert answer["total_gb"] == pytest.approx(sum(answer["terms"].values()), abs=0.02)
    assert set(answer["terms"]) == {"weights", "adapters", "gradients", "optimizer",
                                    "activations", "logits", "overhead"}
    first = answer["cards"][0]
    assert {"gpu", "memory_gb", "count", "fits", "price_per_hour", "currency"} <= set(first)
    assert first["fits"] and first["price_per_hour"] is not None
    assert list(tmp_path.iterdir()) == []  # offline: nothing written


@pytest.mark.parametrize("args, words", [
    (("--model", "llama-3-8b"), "error: --model llama-3-8b: not in the shipped table (nearest: llama-3.1-8b"),
    (("--model", "mistral-7b", "--batch", "0"), "error: --batch 0: at least 1 is needed"),
    (("--model", "mistral-7b", "--method", "full", "--dtype", "int4"), "error: --method full --dtype int4"),
    (("--model", "mistral-7b", "--measure", "--", "python", "t.py"), "error: fit --measure runs the command on a host: -H"),
    (("--model", "mistral-7b", "--params", "7B"), "error: fit: say what the model is with one of"),
    (("--model", "mistral-7b", "--layers", "32"), "error: fit: --layers go with --params"),
])
def test_fit_bad_input_is_one_line(tmp_path: Path, args: tuple[str, ...], words: str) -> None:
    r = cli("fit", *args, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(words) and r.stderr.count("\n") == 1, r.stderr
    assert r.stdout == ""


def test_the_text_answer_shows_terms_cards_changes_and_the_measured_line() -> None:
    from provision.fit import report
    from provision.fit.measure import Point, Prediction, fit_line

    est = estimate(find_model("llama-3.1-8b"), Job(method="lora", seq=8192, batch=8))
    offers = [Offer("RTX 4090", 24, 0.34, "USD", "runpod")]
    cards = rank(est, offers, fixed=True)
    line = fit_line([Point(1, 20.0), Point(2, 22.5), Point(4, 27.4)])
    lines = report.text(est, cards, changes(est, offers), [Prediction(8, "nvidia-smi", line,
                                                                     line.at(8), line.error(8))])
    assert lines[0] == ("llama-3.1-8b: 8.03B parameters, 41.9M trained; lora bf16, seq 8192, "
                        "batch 8, adamw, checkpointing on")
    assert lines[1].startswith("  weights ") and lines[1].endswith(" GB")
    # least squares through (1, 20.0), (2, 22.5), (4, 27.4): 17.55 + 2.464 x batch
    assert "measured (nvidia-smi): 17.55 GB + 2.464 GB x batch -> 37.26 ± 0.08 GB at batch 8" \
        in lines
    assert "no card holds it as asked; what would change that:" in lines
    assert any(ln.startswith("  --batch 1 with gradient accumulation 8: ") and
               ln.endswith("-> RTX 4090 24 GB x4, 1.36 USD/h") for ln in lines)
