"""Every template renders against every shipped inventory and recipe; the facts script is valid
bash and prints one JSON object on this machine."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from provision.errors import ProvisionError
from provision.facts.host import parse_facts
from provision.gather import facts_script, markers_of
from provision.inventory import load_inventory, settings_for
from provision.paths import templates_dir
from provision.recipes import all_platforms
from provision.templating import render

ROOT = Path(__file__).resolve().parents[2]
INVENTORIES = sorted((ROOT / "inventories").glob("*.yaml"))
RECIPES = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("inventory", INVENTORIES, ids=[p.stem for p in INVENTORIES])
@pytest.mark.parametrize("recipe", RECIPES)
def test_facts_script_renders_for_every_inventory(inventory: Path, recipe: str) -> None:
    target = load_inventory(inventory)
    settings = settings_for(target, None, {"recipe": recipe})
    dirs = tuple(d for d in (settings.data_dir,) if d)
    script = facts_script(all_platforms(), dirs)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_every_template_is_covered() -> None:
    assert {p.name for p in templates_dir().iterdir() if p.suffix == ".j2"} == {"facts.sh.j2"}


def test_facts_script_runs_here_in_one_process_and_parses() -> None:
    platforms = all_platforms()
    out = subprocess.run(["bash", "-c", facts_script(platforms, ("/tmp",))], capture_output=True,
                         text=True, timeout=60)
    doc = json.loads(out.stdout)
    f = parse_facts(doc, markers_of(platforms))
    assert f.arch and f.kernel and f.cpu_cores >= 1 and f.memory_gb > 0
    assert f.home and any(d.path == "/tmp" for d in f.disks)
    assert len(f.boot_id) == 36


def test_hostile_data_dir_is_quoted(tmp_path: Path) -> None:
    evil = str(tmp_path / "x'; touch PWNED; echo '")
    script = facts_script(all_platforms(), (evil,))
    subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, timeout=60)
    assert not (tmp_path / "PWNED").exists()


def test_render_error_names_template_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken.j2").write_text("ok\n{{ missing_value }}\n")
    monkeypatch.setattr("provision.templating.templates_dir", lambda: tmp_path)
    with pytest.raises(ProvisionError, match="template broken.j2: 'missing_value' is undefined"):
        render("broken.j2")
    (tmp_path / "syntax.j2").write_text("a\nb\n{% if %}\n")
    with pytest.raises(ProvisionError, match=r"template syntax.j2:3"):
        render("syntax.j2")
