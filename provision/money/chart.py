"""The compare chart, drawn once by matplotlib as SVG (inlined in the HTML, so the page stands
alone) and as PNG, and the self-contained HTML page around it.

The bars keep the table's order (the best value for money on top), values carry three
significant figures, each axis says its unit, a figure no host has gets no panel, and the page
names each report by a relative path.
"""

from __future__ import annotations

import html
import io
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from ..config.extras import need
from .compare import Row, money, number, significant, upload_text

BAR = "#2f6db5"  # the bars' colour (the HTML test looks for it in the rendered page)
LOG_SPAN = 30  # values further apart than this are drawn on a log axis

# (title, what it costs, the row's value)
PANELS: tuple[tuple[str, str, Callable[[Row], float | None]], ...] = (
    ("cost per million training samples", "per million training samples",
     lambda r: r.cost_per_m_samples),
    ("cost per TFLOP-hour", "per TFLOP-hour", lambda r: r.cost_per_tflop_hour),
)


def unit(rows: Sequence[Row]) -> str:
    """The currency every row is priced in, or a warning that the bars mix currencies."""
    currencies = sorted({r.currency or "?" for r in rows if r.price is not None})
    return currencies[0] if len(currencies) == 1 else f"mixed currencies ({', '.join(currencies)})"


def _figure(rows: Sequence[Row]):  # type: ignore[no-untyped-def]
    import matplotlib
    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    panels = [(t, per, [get(r) for r in rows]) for t, per, get in PANELS]
    panels = [p for p in panels if any(v is not None for v in p[2])] or panels[-1:]
    labels = [f"{r.host}\n{r.gpu}" for r in rows]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 1.5 + 0.7 * len(rows)),
                             sharey=True, squeeze=False)
    ys = list(range(len(rows)))
    for ax, (title, per, values) in zip(axes[0], panels, strict=True):
        known = [v for v in values if v]
        # a CPU host next to GPUs spans 1000x: on a linear axis the GPUs' bars would vanish
        log = len(known) > 1 and max(known) / min(known) > LOG_SPAN
        floor = min(known) / 3 if log else 0
        ax.barh(ys, [(v or floor) - floor for v in values], left=floor, color=BAR)
        for y, v, r in zip(ys, values, rows, strict=True):
            ax.text(v or floor or 0, y, f" {significant(v, r.currency)}" if v is not None
                    else " no figure", va="center", fontsize=8,
                    color="#333" if v is not None else "#a00")
        ax.set_title(title + " (lower is better)", fontsize=10)
        ax.set_xlabel(f"{unit(rows)} {per}" + (" (log scale)" if log else ""), fontsize=9)
        if log:
            ax.set_xscale("log")
            ax.set_xlim(floor, max(known) * 30)  # room for the value labels
        else:
            ax.margins(x=0.35)
    axes[0][0].set_yticks(ys, labels, fontsize=8)
    axes[0][0].invert_yaxis()  # shared by every panel: once, so the first row is on top
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


def source_name(source: str, page_dir: Path) -> str:
    """A report's path as the page shows it: relative to the page (or the current folder), and
    the shipped published reports as ``published/<file>``."""
    from ..config.shipped import published_reports
    path = Path(source).resolve()
    shipped = published_reports()
    if isinstance(shipped, Path) and path.is_relative_to(shipped.resolve()):
        return f"published/{path.relative_to(shipped.resolve())}"
    for base in (page_dir.resolve(), Path.cwd().resolve()):
        if path.is_relative_to(base):
            return str(path.relative_to(base))
    return os.path.relpath(path, page_dir.resolve()) if path.anchor == page_dir.resolve().anchor \
        else path.name


def page(rows: Sequence[Row], svg: str, png_name: str, notes: Sequence[str] = (),
         page_dir: Path | None = None) -> str:
    head = ("host", "platform", "GPU", "price/h", "TFLOPS", "samples/s", "per 1M samples",
            "per TFLOP-hour", "download MB/s", "link up/down MB/s", "100 GB up", "source")
    where = page_dir or Path.cwd()
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in (
            r.host, r.platform or "-", r.gpu, money(r.price, r.currency, 2),
            significant(r.tflops) + (f" {r.tflops_dtype}" if r.tflops_dtype else ""),
            number(r.samples_s), significant(r.cost_per_m_samples, r.currency),
            significant(r.cost_per_tflop_hour, r.currency), number(r.download_mbs),
            f"{number(r.link_up_mbs)} / {number(r.link_down_mbs)}", upload_text(r),
            source_name(r.source, where))) + "</tr>"
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
    tmp.write_text(page(rows, svg, png_path.name, notes, html_path.parent), encoding="utf-8")
    tmp.replace(html_path)
    return png_path
