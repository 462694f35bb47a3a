"""The compare chart, drawn once by matplotlib as SVG (inlined in the HTML, so the page stands
alone) and as PNG, and the self-contained HTML page around it."""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from pathlib import Path

from .compare import Row, money, number, upload_text
from .extras import need

BAR = "#2f6db5"  # the bars' colour (the HTML test looks for it in the rendered page)


def _figure(rows: Sequence[Row]):  # type: ignore[no-untyped-def]
    import matplotlib
    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    labels = [f"{r.host}\n{r.gpu}" for r in rows]
    panels = (("cost per million training samples", [r.cost_per_m_samples for r in rows]),
              ("cost per TFLOP-hour", [r.cost_per_tflop_hour for r in rows]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 1.2 + 0.7 * len(rows)), sharey=True)
    for ax, (title, values) in zip(axes, panels, strict=True):
        ys = range(len(rows))
        ax.barh(list(ys), [v or 0 for v in values], color=BAR)
        for y, v, r in zip(ys, values, rows, strict=True):
            ax.text(v or 0, y, f" {money(v, r.currency)}" if v is not None else " no figure",
                    va="center", fontsize=8, color="#333" if v is not None else "#a00")
        ax.set_title(title + " (lower is better)", fontsize=10)
        ax.set_yticks(list(ys), labels, fontsize=8)
        ax.invert_yaxis()
        ax.margins(x=0.35)
    fig.tight_layout()
    return fig


def render(rows: Sequence[Row]) -> tuple[str, bytes]:
    """(SVG text, PNG bytes) of the chart; matplotlib comes with the ``chart`` extra."""
    need("matplotlib", extra="chart")
    import matplotlib.pyplot as plt
    fig = _figure(rows)
    svg, png = io.StringIO(), io.BytesIO()
    fig.savefig(svg, format="svg")
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    text = svg.getvalue()
    return text[text.index("<svg"):], png.getvalue()


def page(rows: Sequence[Row], svg: str, png_name: str, notes: Sequence[str] = ()) -> str:
    head = ("host", "platform", "GPU", "price/h", "TFLOPS", "samples/s", "per 1M samples",
            "per TFLOP-hour", "download MB/s", "link up/down MB/s", "100 GB up", "source")
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in (
            r.host, r.platform or "-", r.gpu, money(r.price, r.currency, 2),
            number(r.tflops) + (f" {r.tflops_dtype}" if r.tflops_dtype else ""),
            number(r.samples_s), money(r.cost_per_m_samples, r.currency),
            money(r.cost_per_tflop_hour, r.currency), number(r.download_mbs),
            f"{number(r.link_up_mbs)} / {number(r.link_down_mbs)}", upload_text(r), r.source))
        + "</tr>"
        for r in rows)
    note = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gpu-provision compare</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;font-size:13px}}th{{background:#f3f3f3}}</style>
</head><body>
<h1>Price per performance</h1>
<table><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>{body}</table>
<ul>{note}</ul>
<figure id="chart">{svg}<figcaption>The same chart as
<a href="{html.escape(png_name)}">{html.escape(png_name)}</a>. Lower is better; a host without
a figure is shown, not dropped.</figcaption></figure>
</body></html>
"""


def write(rows: Sequence[Row], html_path: Path, notes: Sequence[str] = ()) -> Path:
    """Write the HTML page and its PNG beside it; returns the PNG's path."""
    svg, png = render(rows)
    png_path = html_path.with_suffix(".png")
    html_path.parent.mkdir(parents=True, exist_ok=True)
    png_path.write_bytes(png)
    tmp = html_path.with_suffix(".tmp")
    tmp.write_text(page(rows, svg, png_path.name, notes), encoding="utf-8")
    tmp.replace(html_path)
    return png_path
