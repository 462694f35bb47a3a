"""GPU names as platforms and renters write them (templates/gpu/gpu_names.py), on the listings
of tests/fixtures/validation/listings.yaml (RunPod's, Lambda's and vast.ai's own names, each
with the name nvidia-smi prints): every listing is its GPU, whatever the spelling, and never a
GPU of another model; the inventory's validator takes them and reads the count."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from provision.config.validators import gpu_claim, split_gpu_claim
from provision.ops.validate import parse_gpu_claim
from tests.unit.gpu_payload import FIX, payload

DOC = yaml.safe_load((FIX / "listings.yaml").read_text())
LISTED = [(group, e) for group in ("runpod", "lambda", "vast", "renters") for e in DOC[group]]
names = payload("gpu_names")


def _id(item: tuple[str, dict[str, Any]]) -> str:
    return f"{item[0]}:{item[1]['listing']}"


@pytest.mark.parametrize("item", LISTED, ids=[_id(x) for x in LISTED])
def test_every_listing_is_its_gpu(item: tuple[str, dict[str, Any]]) -> None:
    _, e = item
    assert gpu_claim(e["listing"]) is None  # the inventory takes it as it is written
    model, count = split_gpu_claim(e["listing"])
    assert count == e.get("count")
    assert names.matches(model, e["name"], e["mib"]) == (True, ""), e
    assert parse_gpu_claim(e["listing"]) == {"model": model, "count": e.get("count") or 1}


def test_no_listing_is_a_gpu_of_another_model() -> None:
    """Across every pair: a listing that matches another entry's nvidia-smi name only does so
    where that name is the same model (an A100 SXM listing and both A100-SXM4 boards)."""
    for _, e in LISTED:
        model = split_gpu_claim(e["listing"])[0]
        for _, other in LISTED:
            if names.matches(model, other["name"], other["mib"])[0]:
                assert names.model_key(names.parse(other["name"])["model"]) == \
                    names.model_key(names.parse(e["name"])["model"]), \
                    (e["listing"], other["name"])


@pytest.mark.parametrize("e", DOC["wrong"], ids=[f"{x['listing']} != {x['name']}" for x in DOC["wrong"]])
def test_the_wrong_gpu_is_named_with_why(e: dict[str, Any]) -> None:
    ok, why = names.matches(split_gpu_claim(e["listing"])[0], e["name"], e["mib"])
    assert not ok and re.match(r"(the model is|it is the|it has) ", why), why


def _spelling(draw: Any, e: dict[str, Any]) -> str:
    """The listing as another renter would type it: case, separators, the count before or after
    (x8, 8x, 8 x, x 8, ×8), and the memory in any of its spellings where the GPU has it."""
    words = split_gpu_claim(e["listing"])[0].replace("_", " ").split()
    words = [draw(st.sampled_from([w, w.lower(), w.upper()])) for w in words]
    if e["mib"] and not re.search(r"\d\s*gb?\b", e["listing"], re.I) and "(" not in e["listing"]:
        gb = round(e["mib"] / 1024)
        at = draw(st.integers(1, len(words)))
        words.insert(at, draw(st.sampled_from([f"{gb}GB", f"{gb}G", f"{gb}gb", f"{gb} GB"])))
    sep = draw(st.sampled_from([" ", "_", "-"])) if "(" not in e["listing"] else " "
    text = sep.join(words)
    n = e.get("count") or draw(st.integers(1, 8))
    form = draw(st.sampled_from(["{t} x{n}", "{n}x {t}", "{n} x {t}", "{t} x {n}", "{t} ×{n}", "{t}"]))
    return form.format(t=text, n=n)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_spelling_of_a_listing_is_still_its_gpu(data: Any) -> None:
    _, e = data.draw(st.sampled_from(LISTED))
    text = _spelling(data.draw, e)
    assert gpu_claim(text) is None, text
    model, _ = split_gpu_claim(text)
    assert names.matches(model, e["name"], e["mib"])[0], (text, e["name"])
