"""Price per performance: saved bench reports joined with each host's price in its inventory,
turned into rows sorted by value for money."""

from __future__ import annotations

import glob
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..config.inventory import resolve_target
from ..config.shipped import on_disk, published_reports
from ..errors import ProvisionError, UsageError
from ..store import Store

PUBLISHED = "published"  # `--report published`: the reports built from published figures


@dataclass(frozen=True)
class Row:
    host: str
    platform: str | None
    gpu: str
    mode: str  # gpu | cpu
    price: float | None  # per hour
    currency: str | None
    tflops: float | None  # the best tensor figure measured (bf16/fp16), else fp32
    tflops_dtype: str | None
    samples_s: float | None  # small-CNN training throughput
    cost_per_m_samples: float | None  # price of a million training samples
    cost_per_tflop_hour: float | None
    download_mbs: float | None  # the best mirror
    source: str  # the report file, or where published figures come from
    link_up_mbs: float | None = None  # this machine -> host (bench, else the last sync up)
    link_down_mbs: float | None = None  # host -> this machine
    upload_100gb_h: float | None = None  # hours to send 100 GB at that rate, billed meanwhile
    upload_100gb_cost: float | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def report_files(patterns: Iterable[str]) -> list[Path]:
    """The files ``--report`` values name: a file or glob (one that matches nothing stands for
    itself, so that the task names it as missing), or ``published``: the reports built from
    published figures that ship with the tool (``bench/published/`` in a checkout)."""
    out: set[Path] = set()
    for pat in patterns:
        if pat == PUBLISHED and not Path(pat).exists():
            out.update(on_disk(f) for f in published_reports().iterdir() if f.name.endswith(".json"))
        else:
            out.update(Path(p) for p in glob.glob(pat) or [pat])
    return sorted(out)


def newest_per_host(paths: Iterable[Path]) -> list[Path]:
    """Of several reports for one host, the newest (names sort by time: bench-YYYYmmdd-HHMMSS)."""
    by_host: dict[str, Path] = {}
    for p in sorted(paths, key=lambda p: p.name):
        try:
            host = json.loads(p.read_text()).get("host") or p.parent.name
        except (OSError, ValueError) as exc:
            raise ProvisionError(f"{p}: not a readable bench report ({exc})") from None
        by_host[host] = p
    return sorted(by_host.values())


def best_tflops(report: Mapping[str, Any]) -> tuple[float | None, str | None]:
    figures = report.get("tflops") or {}
    for dtype in ("bf16", "fp16", "tf32", "fp32"):
        if figures.get(dtype):
            return float(figures[dtype]), dtype
    return None, None


def row(report: Mapping[str, Any], source: str, price: float | None,
        currency: str | None) -> Row:
    tflops, dtype = best_tflops(report)
    samples = report.get("train_samples_s")
    speeds = [d["mbs"] for d in report.get("downloads") or [] if d.get("mbs")]
    gpus = report.get("gpus") or []
    gpu = f"{gpus[0]} x{len(gpus)}" if gpus else "CPU only"
    return Row(
        host=str(report.get("host")), platform=report.get("platform"), gpu=gpu,
        mode=str(report.get("mode")), price=price, currency=currency,
        tflops=tflops, tflops_dtype=dtype, samples_s=samples,
        cost_per_m_samples=(price / (samples * 3600) * 1e6) if price and samples else None,
        cost_per_tflop_hour=(price / tflops) if price and tflops else None,
        download_mbs=max(speeds) if speeds else None, source=source,
        **link_figures(report.get("link") or {}, price))


UPLOAD_GB = 100  # the dataset size the upload time and cost are shown for


def link_figures(link: Mapping[str, Any], price: float | None) -> dict[str, float | None]:
    up, down = link.get("up_mbs"), link.get("down_mbs")
    hours = UPLOAD_GB * 1000 / up / 3600 if up else None
    return {"link_up_mbs": up, "link_down_mbs": down,
            "upload_100gb_h": round(hours, 2) if hours else None,
            "upload_100gb_cost": round(hours * price, 2) if hours and price else None}


def upload_text(r: Row) -> str:
    if r.upload_100gb_h is None:
        return "-"
    return f"{r.upload_100gb_h:.1f} h" + (f", {money(r.upload_100gb_cost, r.currency, 2)}"
                                          if r.upload_100gb_cost is not None else "")


def with_sync_links(store: Store, host: str, report: Mapping[str, Any]) -> dict[str, Any]:
    """``report`` with its link figures, each direction the bench did not measure filled from
    the host's newest ``sync`` (reports/<host>/link-*.json)."""
    link = dict(report.get("link") or {})
    for p in store.reports("link", host):  # oldest first: the newest wins
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        key = f"{rec.get('direction')}_mbs"
        if key in ("up_mbs", "down_mbs") and rec.get("mbs") and not (report.get("link") or {}).get(key):
            link[key] = rec["mbs"]
    return {**report, "link": link} if link else dict(report)


# --sort NAME: (the table's column, the Row field, highest first?)
SORTS: dict[str, tuple[str, str, bool]] = {
    "per-1m-samples": ("per 1M samples", "cost_per_m_samples", False),
    "per-tflop-hour": ("per TFLOP-hour", "cost_per_tflop_hour", False),
    "price": ("price/h", "price", False),
    "tflops": ("TFLOPS", "tflops", True),
    "samples": ("samples/s", "samples_s", True),
    "download": ("download MB/s", "download_mbs", True),
}
DEFAULT_SORT = "auto"  # per 1M samples where any row has it, else per TFLOP-hour


def sort_of(name: str) -> tuple[str, str, bool]:
    if name not in SORTS:
        raise UsageError(f"--sort {name!r}: one of auto, {', '.join(SORTS)}")
    return SORTS[name]


def resolve_sort(table: Sequence[Row], sort: str) -> str:
    """``auto``: the first value-for-money column that any row has a figure in (reports from
    published figures have no training throughput: they sort by the TFLOP-hour)."""
    if sort != "auto":
        sort_of(sort)
        return sort
    for name in ("per-1m-samples", "per-tflop-hour"):
        if any(getattr(r, SORTS[name][1]) is not None for r in table):
            return name
    return "per-1m-samples"


def sort_title(name: str) -> str:
    column, _, high = sort_of(name)
    return f"sorted by {column}, {'highest' if high else 'cheapest'} first"


def rows(reports: Iterable[tuple[str, Mapping[str, Any]]],
         price_of: Callable[[Mapping[str, Any]], tuple[float | None, str | None]],
         sort: str = DEFAULT_SORT) -> list[Row]:
    """One row per report, sorted by the ``sort`` column (SORTS); rows missing that figure come
    after, still shown, by the cheapest TFLOP-hour then the host. Money in several currencies is
    not compared across them: within the column, rows of one currency stay together."""
    out = [row(r, source, *price_of(r)) for source, r in reports]
    _, field, high = sort_of(resolve_sort(out, sort))
    priced = field in ("cost_per_m_samples", "cost_per_tflop_hour", "price")

    def key(r: Row) -> tuple[Any, ...]:
        value = getattr(r, field)
        return ((r.currency or "~") if priced else "", value is None,
                -(value or 0) if high else (value or 0),
                r.cost_per_tflop_hour is None, r.cost_per_tflop_hour or 0, r.host)
    return sorted(out, key=key)


def money(value: float | None, currency: str | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f} {currency or ''}".strip()


def significant(value: float | None, currency: str | None = None, digits: int = 3) -> str:
    """``value`` to ``digits`` significant figures (0.00382 USD, 1.48 USD, 12.3 USD)."""
    if value is None:
        return "-"
    exponent = int(f"{value:e}".split("e")[1])
    decimals = max(0, digits - 1 - exponent)  # whole numbers stay whole: 1235, not 1.23e+03
    return f"{value:,.{decimals}f} {currency or ''}".strip()


def number(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}{unit}"


def find_reports(store: Store, patterns: Iterable[str] = ()) -> list[tuple[str, dict[str, Any]]]:
    """(path, report) of each bench report: the ones ``--report`` names (see report_files), else
    the newest of each host in the store; ``published`` alone adds the published ones to those."""
    pats = list(patterns)
    if pats and set(pats) != {PUBLISHED}:
        paths = report_files(pats)
    else:  # yours, and with `--report published` the published ones beside them
        paths = newest_per_host(store.reports("bench")) + report_files(pats)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing or not paths:
        where = ", ".join(missing or [str(store.reports_dir / "*" / "bench-*.json")])
        raise ProvisionError(f"no bench report at {where}: run `gpu-provision -H <host> bench` "
                             "first")
    out = []
    for p in paths:
        try:
            report = json.loads(p.read_text())
        except ValueError as exc:
            raise ProvisionError(f"{p}: not a readable bench report ({exc})") from None
        host = report.get("host")
        out.append((str(p), with_sync_links(store, str(host), report) if host else report))
    return out


def price_of(report: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """The price in the host's inventory now, else what the report recorded at bench time."""
    for spec in (report.get("inventory"), report.get("host")):
        if not spec:
            continue
        try:
            target = resolve_target(str(spec))
        except ProvisionError:
            continue
        if target.source is not None and "price_per_hour" in target.settings:
            return float(target.settings["price_per_hour"]), target.settings.get("currency")
    price = report.get("price_per_hour")
    return (float(price) if price is not None else None), report.get("currency")
