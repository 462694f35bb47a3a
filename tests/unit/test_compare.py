"""compare: rows from bench reports and prices, value-for-money order, missing figures kept, the
HTML page and its PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from provision.money import chart
from provision.money.compare import newest_per_host, rows

PUBLISHED = Path(__file__).resolve().parent.parent.parent / "bench" / "published"


def report(host: str, samples: float | None, tflops: dict[str, float], **kw: Any) -> dict[str, Any]:
    return {"host": host, "mode": "gpu", "gpus": ["NVIDIA GeForce RTX 4090"], "tflops": tflops,
            "train_samples_s": samples, "downloads": [{"kind": "pypi", "mbs": 41.5},
                                                      {"kind": "pytorch", "mbs": None}], **kw}


def test_value_for_money_order_and_missing_figures() -> None:
    prices = {"cheap": (0.30, "USD"), "dear": (2.00, "USD"), "unpriced": (None, None)}
    table = rows([("a.json", report("dear", 20000.0, {"bf16": 600.0})),
                  ("b.json", report("unpriced", 15000.0, {"fp16": 150.0})),
                  ("c.json", report("cheap", 10000.0, {"fp32": 50.0, "bf16": 140.0}))],
                 lambda r: prices[r["host"]])
    assert [r.host for r in table] == ["cheap", "dear", "unpriced"]
    cheap = table[0]
    assert round(cheap.cost_per_m_samples or 0, 5) == round(0.30 / (10000 * 3600) * 1e6, 5)
    assert (cheap.tflops, cheap.tflops_dtype) == (140.0, "bf16")
    assert round(cheap.cost_per_tflop_hour or 0, 5) == round(0.30 / 140, 5)
    assert cheap.download_mbs == 41.5 and cheap.gpu == "NVIDIA GeForce RTX 4090 x1"
    assert table[2].price is None and table[2].cost_per_m_samples is None  # shown, not dropped


def test_published_reports_load_and_are_marked() -> None:
    paths = newest_per_host(PUBLISHED.glob("*.json"))
    loaded = [(str(p), json.loads(p.read_text())) for p in paths]
    assert all("not measured" in r["published"] for _, r in loaded)
    table = rows(loaded, lambda r: (r["price_per_hour"], r["currency"]))
    assert len(table) == len(list(PUBLISHED.glob("*.json"))) >= 13
    # no samples/s was published: the cheapest TFLOP-hour first, RunPod's 4090 at
    # 0.34 / 165.2 bf16 TFLOPS, Lambda's A6000 at 1.09 / 154.8 last
    assert table[0].host == "runpod-rtx-4090 (published)"
    assert table[-1].host == "lambda-rtx-a6000 (published)"
    costs = [r.cost_per_tflop_hour or 0 for r in table]
    assert costs == sorted(costs)
    a100 = next(r for r in table if r.host == "lambda-a100-40gb (published)")
    assert a100.samples_s is None and a100.cost_per_m_samples is None
    assert round(a100.cost_per_tflop_hour or 0, 5) == round(1.99 / 312.0, 5)


def test_page_and_png(tmp_path: Path) -> None:
    table = rows([("a.json", report("box <1>", 1000.0, {"fp32": 0.1}, platform="vast"))],
                 lambda r: (0.5, "USD"))
    png = chart.write(table, tmp_path / "compare.html", ["published & marked"])
    page = (tmp_path / "compare.html").read_text()
    assert png.read_bytes().startswith(b"\x89PNG")
    assert page.count("<svg") == 1 and "box &lt;1&gt;" in page and "published &amp; marked" in page
    assert chart.BAR in page  # the bars are drawn in the page itself, not linked
    assert "<script" not in page and "http" not in page.split("<svg", 1)[0].split("<li>")[0]


def test_chart_follows_the_table(tmp_path: Path) -> None:
    """Bars in the table's order (first row on top), three significant figures, the unit on
    each axis, no panel for a figure no host has, and report paths relative to the page."""
    (tmp_path / "reports" / "box").mkdir(parents=True)
    src = tmp_path / "reports" / "box" / "bench-1.json"
    table = rows([(str(src), report("box", None, {"bf16": 165.2})),
                  ("b.json", report("dear", None, {"fp32": 80.0}))],
                 lambda r: {"box": (0.39, "USD"), "dear": (2.0, "USD")}[r["host"]])
    assert [r.host for r in table] == ["box", "dear"]
    fig = chart._figure(table)
    [ax] = fig.axes  # no host has a training figure: that panel is left out
    assert ax.get_title() == "cost per TFLOP-hour (lower is better)"
    assert ax.get_xlabel() == "USD per TFLOP-hour"
    assert ax.yaxis_inverted()  # the first row is drawn on top
    ticks = sorted(ax.get_yticklabels(), key=lambda t: t.get_position()[1])
    assert [t.get_text().split("\n")[0] for t in ticks] == ["box", "dear"]
    labels = [t.get_text().strip() for t in ax.texts]
    assert labels == ["0.00236 USD", "0.0250 USD"]  # 0.39/165.2 and 2/80, 3 significant figures
    page = chart.page(table, "<svg></svg>", "compare.png", page_dir=tmp_path / "reports")
    assert "<td>box/bench-1.json</td>" in page and str(tmp_path) not in page


def test_chart_log_axis_when_values_span_far() -> None:
    table = rows([("a.json", report("gpu", None, {"bf16": 400.0})),
                  ("b.json", report("cpu", None, {"fp32": 0.05}))], lambda r: (0.5, "USD"))
    [ax] = chart._figure(table).axes
    assert ax.get_xscale() == "log" and ax.get_xlabel().endswith("(log scale)")
