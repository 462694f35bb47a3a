"""Tasks that need no host: pick a wheel, refresh the wheel data, compare reports."""

from __future__ import annotations

from pathlib import Path

from invoke.context import Context

from ..errors import ProvisionError, UsageError
from ..ui import console as output
from .taskkit import notify, reports_errors, task


@task(iterable=["report"], help={
    "report": "a bench report file or glob, or `published` (repeatable; default: the newest "
              "reports/<host>/bench-*.json of each host; `published` alone adds the published "
              "reports to those)",
    "html": "where to write the page (default reports/compare.html; its PNG goes beside it)",
    "sort": "the column to sort by: auto (default: per-1m-samples where measured, else "
            "per-tflop-hour), per-1m-samples, per-tflop-hour, price, tflops, samples, download",
    "json": "print the rows as JSON and write no page"})
@reports_errors
def compare(c: Context, report: list[str] | None = None, html: str | None = None,
            sort: str = "auto", json_: bool = False) -> None:
    """Local: join saved bench reports with each host's price_per_hour and currency from its
    inventory; print a table sorted by value for money and write an HTML page with a chart.

    The table needs nothing extra; the chart needs the `chart` extra (matplotlib). With --json
    it only prints: no page, no PNG. Example: gpu-provision compare --report published
    """
    from ..money.compare import find_reports, price_of, resolve_sort, rows, sort_title
    from ..store import Store

    resolve_sort([], sort)  # a bad --sort is refused before anything is read
    store = Store.here()
    if (moved := store.moved_note()) is not None:
        notify(moved)
    loaded = find_reports(store, report or [])
    table = rows(loaded, price_of, sort)
    notes = sorted({r["published"] for _, r in loaded if r.get("published")})
    if json_:
        output.print_json([r.as_json() for r in table])
        return
    title = f"compare: value for money, {sort_title(resolve_sort(table, sort))}"
    output.compare_table(table, notes, title=title)
    from ..money import chart
    page = Path(html) if html else store.reports_dir / "compare.html"
    try:
        png = chart.write(table, page, notes)
    except ProvisionError as exc:  # the chart's extra is missing: the table stands without it
        notify(f"no chart: {exc}")
        return
    output.console.print(f"wrote {page} and {png}", markup=False)


SMI_CAP = "nvidia-smi --query-gpu=compute_cap --format=csv,noheader"


@task(help={"driver": "NVIDIA driver version, e.g. 550.54.14 (omit, with --compute-cap, for a "
                      "host without a GPU)",
            "compute_cap": f"compute capability per GPU, comma separated: 8.6,12.0 ({SMI_CAP})",
            "python": "Python version of the env (default 3.11)",
            "torch": "torch spec: 2.5 | 2.5.1 | '>=2.4,<2.6' (default newest)",
            "cuda_compat": "strict (default) or minor (NVIDIA minor-version compatibility)",
            "glibc": "the host's glibc, e.g. 2.17 on CentOS 7",
            "index": "PyTorch index prefix holding <variant>/ (a mirror)",
            "json": "print one JSON object (on failure: {\"error\", \"exit_code\"})"})
@reports_errors
def pick(c: Context, driver: str | None = None, compute_cap: str | None = None,
         python: str = "3.11", torch: str | None = None, cuda_compat: str = "strict",
         glibc: str | None = None, index: str | None = None, json_: bool = False) -> None:
    """Offline: which torch wheel fits this driver, GPU and Python (exit 2 when none does).

    Example: gpu-provision pick --driver 550.54.14 --compute-cap 8.9 --python 3.10 --json
    """
    from ..wheels.rule import choose_torch
    from .pickargs import check_pick

    caps = check_pick(driver, compute_cap, python, torch, cuda_compat, glibc, index)
    choice = choose_torch(driver=driver, compute_caps=caps, python=python, torch=torch,
                          cuda_compat=cuda_compat, glibc=glibc, index=index)
    if json_:
        output.print_json(choice.as_json())
    else:
        output.choice_text(choice)


@task(name="refresh-compat", help={"index": "PyTorch index prefix, an http(s) URL (default "
                                            "https://download.pytorch.org/whl)",
                                   "json": "print the diff as JSON",
                                   "write": "write the refreshed compat YAML to this file"})
@reports_errors
def refresh_compat(c: Context, index: str | None = None, json_: bool = False,
                   write: str | None = None) -> None:
    """Diff the wheel data against a live PyTorch index; --write saves a refreshed copy.

    The written file adds the index's new releases and variants, for review.

    Example: gpu-provision refresh-compat --write compat-new.yaml
    """
    from ..config import validators
    problem = validators.url(index) if index is not None else None
    if problem:
        raise UsageError(f"--index: {problem}, e.g. https://download.pytorch.org/whl")
    from ..wheels.refresh import refresh, write_refreshed

    diff, new, notes, base = refresh(index)
    if write:
        write_refreshed(Path(write), new, notes, base)
        output.err_console.print(f"wrote {write} ({len(notes)} change(s))", markup=False)
    if json_:
        output.print_json({"added": diff.added, "removed": diff.removed,
                           "python_changed": diff.python_changed})
    elif diff.empty:
        output.console.print(output.text("the wheel data matches the index"))
    else:
        for line in diff.lines():
            output.console.print(line, markup=False)
