"""The wheel is the product: what it holds (templates, recipes, platforms, the verify suite, the
example inventories, the published reports, the data) and its dependencies (pytest and matplotlib
only in extras)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest

from provision.config.recipes import all_platforms
from provision.facts.gather import facts_script
from tests.wheel import ROOT, build_wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    with zipfile.ZipFile(build_wheel(tmp_path_factory.mktemp("wheel"))) as whl:
        yield whl


def shipped(folder: str, pattern: str, inside: str) -> set[str]:
    """``folder/pattern`` of the checkout, as the names they must have in the wheel."""
    found = {f"{inside}/{p.relative_to(ROOT / folder).as_posix()}"
             for p in (ROOT / folder).glob(pattern) if p.is_file() and "__pycache__" not in p.parts}
    assert found, f"nothing matches {folder}/{pattern}"
    return found


def test_wheel_ships_every_file_the_tasks_read(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    expected = (
        shipped("templates", "*/*", "provision/_templates")
        | shipped("recipes", "*.yaml", "provision/_recipes")
        | shipped("recipes/platforms", "*.yaml", "provision/_recipes/platforms")
        | shipped("provision/verify", "*.py", "provision/verify")
        | shipped("inventories", "*.yaml", "provision/_inventories")
        | shipped("bench/published", "*.json", "provision/_published")
        | shipped("provision/tables", "*.yaml", "provision/tables")
        | shipped("provision/doctor", "*.yaml", "provision/doctor")
        | shipped("provision", "**/*.py", "provision")
    )
    assert sorted(expected - names) == []
    assert {"provision/_templates/facts/facts.sh.j2", "provision/_templates/gpu/validate_gpu.py",
            # the payload's verdict rules and NCCL ladder ship beside the script that imports them
            "provision/_templates/gpu/gpu_verdict.py", "provision/_templates/gpu/gpu_verdict_multi.py",
            "provision/_templates/gpu/nccl_check.py", "provision/_templates/gpu/gpu_smi.py", "provision/_templates/gpu/_payload.sh.j2",
            "provision/_recipes/pytorch.yaml", "provision/_recipes/platforms/autodl.yaml",
            "provision/verify/test_host.py", "provision/_inventories/example-4090.yaml",
            "provision/_published/lambda-h100-sxm.json"} <= names
    # nothing of the checkout's own: tests, the bench scripts, the fabfile
    assert not [n for n in names if n.startswith(("tests/", "bench/", "fabfile"))]


def test_wheel_metadata_script_and_extras(wheel: zipfile.ZipFile) -> None:
    [meta_name] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    meta = Parser().parsestr(wheel.read(meta_name).decode())
    requires = meta.get_all("Requires-Dist") or []
    default = {r.split(">")[0].split(";")[0].strip() for r in requires if "extra ==" not in r}
    assert default == {"fabric", "paramiko", "invoke", "jinja2", "pyyaml", "rich", "packaging"}
    assert {"verify", "chart", "all", "test"} <= set(meta.get_all("Provides-Extra") or [])
    assert 'pytest>=8; extra == "verify"' in requires
    assert 'pytest-testinfra>=10; extra == "verify"' in requires
    assert 'matplotlib>=3.8; extra == "chart"' in requires
    assert 'gpu-provision[chart,verify]; extra == "all"' in requires
    [entry_points] = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "gpu-provision = provision.cli.entry:main" in wheel.read(entry_points).decode()


def test_shipped_copies_match_the_checkout(wheel: zipfile.ZipFile) -> None:
    for inside, folder in (("provision/_templates/", "templates/"),
                           ("provision/_published/", "bench/published/")):
        for name in (n for n in wheel.namelist() if n.startswith(inside)):
            assert wheel.read(name) == (ROOT / folder / name[len(inside):]).read_bytes(), name


def test_wheel_installs_one_package(wheel: zipfile.ZipFile) -> None:
    tops = {Path(n).parts[0] for n in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"provision"}


IMPORTED_FROM_THE_WHEEL = r'''
import json, os, sys
from pathlib import Path
import provision
assert provision.__file__.startswith(sys.argv[1]), provision.__file__
from provision.config import shipped as paths
from provision.doctor import match as doctor
from provision.money.compare import report_files
from provision.facts.gather import facts_script
from provision.config.inventory import resolve_target
from provision.ops.validate import gpu_reference
from provision.config.recipes import all_platforms, load_platform, load_recipe
from provision.remote.templating import _env
assert not isinstance(paths.templates_dir(), Path)  # a zip member: no directory on disk
with paths.as_dir(paths.verify_suite()) as suite:
    suite_files = sorted(p.name for p in suite.iterdir() if p.suffix == ".py")
example = resolve_target("example-4090")
print(json.dumps({
    "facts": facts_script(all_platforms()),
    "templates": _env().list_templates(),
    "platforms": [p.name for p in all_platforms()],
    "autodl_kind": load_platform("autodl").kind,
    "recipe_python": load_recipe("pytorch").python,
    "example": [example.host, example.source.read_text() == paths.on_disk(
        paths.example_inventories() / "example-4090.yaml").read_text()],
    "published": sorted(json.loads(p.read_text())["host"] for p in report_files(["published"])),
    "suite": suite_files,
    "knowledge": len(doctor.load_knowledge()),
    "h100": gpu_reference("NVIDIA H100 80GB HBM3") is not None,
}))
'''


def test_runs_from_the_zipped_wheel_without_a_checkout(wheel: zipfile.ZipFile,
                                                      tmp_path: Path) -> None:
    """Imported straight from the wheel (zipimport): every shipped file is read through
    importlib.resources, none through a path into the checkout or a directory on disk."""
    path = str(wheel.filename)
    r = subprocess.run([sys.executable, "-c", IMPORTED_FROM_THE_WHEEL, path], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": path})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["facts"] == facts_script(all_platforms(ROOT))
    assert "facts/facts.sh.j2" in got["templates"] and "setup/_first_mirror.sh.j2" in got["templates"]
    assert got["platforms"] == sorted(p.stem for p in (ROOT / "recipes/platforms").glob("*.yaml"))
    assert (got["autodl_kind"], got["recipe_python"]) == ("container", "3.11")
    assert got["example"] == ["203.0.113.10", True]
    assert got["published"] == sorted(f"{p.stem} (published)"
                                      for p in (ROOT / "bench/published").glob("*.json"))
    assert got["suite"] == ["__init__.py", "conftest.py", "run.py", "test_host.py"]
    assert got["knowledge"] > 10 and got["h100"]
