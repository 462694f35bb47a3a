"""Shipped files found from any folder: the example inventories, the published reports, the
templates (no way out of their folder); local files first."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.config.inventory import find_inventory, resolve_target
from provision.config.shipped import example_inventories, published_reports
from provision.errors import ProvisionError
from provision.money.compare import report_files
from provision.remote.templating import render

ROOT = Path(__file__).resolve().parents[2]


def test_example_inventory_found_from_any_folder(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPU_PROVISION_INVENTORIES", raising=False)
    t = resolve_target("example-4090")
    assert (t.host, t.settings["gpu"]) == ("203.0.113.10", "RTX 4090 x1")
    assert t.source is not None and t.source.read_bytes() == \
        (ROOT / "inventories/example-4090.yaml").read_bytes()
    assert find_inventory("example-autodl") is not None
    # a local inventory of the same name wins; an unknown name is a host name
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "example-4090.yaml").write_text("host: 198.51.100.7\n")
    assert resolve_target("example-4090").host == "198.51.100.7"
    assert resolve_target("no-such-box").name == "root@no-such-box:22"


def test_published_reports_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shipped = sorted(p.name for p in published_reports().iterdir() if p.name.endswith(".json"))
    assert shipped == sorted(p.name for p in (ROOT / "bench/published").glob("*.json"))
    assert [p.name for p in report_files(["published"])] == shipped
    assert all(p.is_file() for p in report_files(["published"]))
    (tmp_path / "a.json").write_text("{}")
    assert {p.name for p in report_files(["published", "*.json", "missing-*.json"])} == \
        {*shipped, "a.json", "missing-*.json"}  # a pattern that matches nothing stays as given
    (tmp_path / "published").write_text("{}")  # a file of that name is that file
    assert report_files(["published"]) == [Path("published")]


def test_examples_are_the_checkouts_in_a_checkout() -> None:
    assert sorted(p.name for p in example_inventories().iterdir()) == \
        sorted(p.name for p in (ROOT / "inventories").glob("*.yaml"))


def test_template_names_stay_inside_their_folder() -> None:
    for name in ("../pyproject.toml", "/etc/passwd", "nope.j2"):
        with pytest.raises(ProvisionError, match="not found in"):
            render(name)

