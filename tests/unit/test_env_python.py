"""What was asked is what the env has: an env whose Python differs from the one asked is
recreated (ours) or refused in one line naming both versions and what resolves it (not ours,
or the platform's)."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from provision.config.inventory import Target, settings_for
from provision.config.recipes import load_platform
from provision.facts.host import HostFacts
from provision.ops.env import env_step
from provision.ops.layout import Layout
from provision.setup.plan import Plan, make_plan
from tests.cases import captured

ROOT = Path(__file__).resolve().parents[2]
NO_JOURNAL = {"journal": "", "own_envs": ""}  # neither the journal nor our marker: not ours


def _plan(facts: HostFacts, platform: str = "generic-vm", cli: dict[str, str] | None = None,
          inventory: dict[str, object] | None = None) -> Plan:
    settings = settings_for(Target(name="box", host="h", source=Path("inv/box.yaml"),
                                   settings=inventory or {}), platform, cli)
    return make_plan("box", facts, settings, load_platform(settings.platform))


def _decision(plan: Plan, step: str) -> tuple[str | None, str]:
    d = next(d for d in plan.decisions if d.step == step)
    return d.action, d.reason


def test_our_env_with_another_python_is_recreated_naming_both() -> None:
    plan = _plan(captured("cpu-only-bootstrapped"), cli={"python": "3.10"})
    assert _decision(plan, "env") == (
        "recreate 'torch' with python 3.10",
        "env 'torch' has python 3.11, python 3.10 is asked (--python): it is recreated with it "
        "(what was installed in it goes; the old env is put back if conda cannot make the new "
        "one)")
    # the env is made anew, so the torch in it now does not count
    assert _decision(plan, "torch")[0] == "install torch 2.14.1+cpu"
    assert plan.blocked is None


def test_a_recreated_env_gets_its_packages_again() -> None:
    base = captured("cpu-only-bootstrapped")
    cli = {"recipe": "yolov8", "env_name": "torch"}
    inputs = next(s for s in _plan(base, cli=cli).steps if s.name == "packages").inputs
    done = replace(base, journal={**base.journal, "packages": {"step": "packages",
                                                                "result": "ok", "inputs": inputs}})
    assert _decision(_plan(done, cli=cli), "packages")[0] is None  # the journal says so
    assert _decision(_plan(done, cli={**cli, "python": "3.10"}), "packages")[0] == \
        "install ultralytics>=8.3 opencv-python-headless"


# the env named as ours holds no torch: it is not a Python with a torch to judge (ops/layout.py)
NO_TORCH = {**NO_JOURNAL, "envs": "/root/miniconda3|/root/miniconda3|python3.11|\n"
                                  "/root/miniconda3|/root/miniconda3/envs/torch|python3.11|"}


def test_an_env_we_did_not_make_is_refused_in_one_line() -> None:
    facts = captured("cpu-only-bootstrapped", NO_TORCH)  # no journal, no marker: not ours
    plan = _plan(facts, inventory={"python": "3.12"})
    assert plan.blocked == (
        "env 'torch' at /root/miniconda3/envs/torch has python 3.11, python 3.12 is asked "
        "(python: in box.yaml); gpu-provision did not make it, so it is not recreated: ask for "
        "python 3.11 to use it (--python 3.11), or name another env for python 3.12 "
        "(--env-name NAME)")
    action, reason = _decision(plan, "env")
    assert action is None and reason == "refused: " + plan.blocked


def test_an_env_we_did_not_make_with_a_torch_is_left_untouched_and_ours_goes_beside() -> None:
    """The same env with a torch in it: a Python with a torch the image provides, on another
    Python than the one asked: left as it is, said in one line; ours gets another name."""
    plan = _plan(captured("cpu-only-bootstrapped", NO_JOURNAL), inventory={"python": "3.12"})
    assert plan.blocked is None
    assert [d.reason for d in plan.decisions if d.step == "image"] == [
        "/root/miniconda3/envs/torch (the image's conda env 'torch', python 3.11) has torch "
        "2.13.0+cpu on python 3.11; python 3.12 is asked (python: in box.yaml): left untouched"]
    assert _decision(plan, "env") == ("create 'gpu-provision'",
                                      "conda create -n gpu-provision python=3.12")


def test_our_marker_makes_an_env_ours_without_the_journal() -> None:
    facts = captured("cpu-only-bootstrapped", {**NO_JOURNAL,
                                               "own_envs": "/root/miniconda3/envs/torch\n"})
    plan = _plan(facts, cli={"python": "3.12"})
    assert plan.blocked is None and _decision(plan, "env")[0] == "recreate 'torch' with python 3.12"


def test_the_same_python_changes_nothing() -> None:
    plan = _plan(captured("cpu-only-bootstrapped"), cli={"python": "3.11"})
    assert _decision(plan, "env") == (None, "env exists: 'torch' (python 3.11, torch 2.13.0+cpu)")


AUTODL_312 = {"envs": "/root/miniconda3|/root/miniconda3|python3.12|"}


def test_the_platforms_env_brings_its_own_python_unless_one_is_asked() -> None:
    plan = _plan(captured("autodl", AUTODL_312), "autodl")  # the recipe's 3.11 is a default
    assert plan.blocked is None
    assert _decision(plan, "env") == (None, "adopt the platform's env 'base' (python 3.12, torch "
                                            "none); the recipe's python 3.11 is for envs "
                                            "gpu-provision creates")
    assert "python 3.12 -> torch 2.14.1+cu130" in _decision(plan, "torch")[1]


def test_a_python_asked_of_the_platforms_env_is_refused_naming_the_flag() -> None:
    plan = _plan(captured("autodl", AUTODL_312), "autodl", cli={"python": "3.11"})
    assert plan.blocked == (
        "the platform's env 'base' has python 3.12, python 3.11 is asked (--python): the "
        "platform's env is never replaced; drop --python to use it with python 3.12, or name an "
        "env of ours for python 3.11 beside it (--env-name NAME, or env_name: in the inventory)")
    # ... and naming an env does that: ours, beside the platform's, with the Python asked
    ours = _plan(captured("autodl", AUTODL_312), "autodl",
                 cli={"python": "3.11", "env_name": "work"})
    assert ours.blocked is None and ours.layout == Layout("/root/miniconda3", "work", False)
    assert _decision(ours, "env")[0] == "create 'work'"


# -- the env body, run here with the test Miniconda installer (venvs of this machine's Python)

@pytest.fixture(scope="module")
def conda_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("conda") / "miniconda3"
    subprocess.run(["bash", str(ROOT / "tests/sandbox/miniconda_installer.sh"), "-b", "-p",
                    str(root)], check=True, capture_output=True, timeout=300)
    return root


def _old_env(root: Path, name: str, python: str) -> Path:
    """An env as another Python left it: its files must come back untouched on a failure."""
    env = root / "envs" / name
    (env / "conda-meta").mkdir(parents=True, exist_ok=True)
    (env / "bin").mkdir(exist_ok=True)
    (env / "bin" / f"python{python}").write_text("#!/bin/sh\n")
    (env / "kept.txt").write_text("a file of the old env")
    return env


def _run_env_step(root: Path, name: str, python: str, have: str) -> subprocess.CompletedProcess[str]:
    facts = captured("cpu-only-bootstrapped", {
        "envs": f"{root}|{root}/envs/{name}|python{have}|", "conda": f"{root}/bin/conda",
        "own_envs": f"{root}/envs/{name}"})
    settings = settings_for(Target(name="box", host="h"), None, {"python": python, "env_name": name})
    step = env_step(facts, settings, Layout(str(root), name, False))
    assert step.action == f"recreate {name!r} with python {python}" and step.body
    return subprocess.run(["bash", "-c", step.body], capture_output=True, text=True, timeout=300)


def test_recreating_puts_the_old_env_back_when_conda_cannot(conda_root: Path) -> None:
    old = _old_env(conda_root, "keep", "3.9")
    r = _run_env_step(conda_root, "keep", "3.10", "3.9")  # the test conda has this machine's only
    assert r.returncode == 1
    assert "PackagesNotFoundError" in r.stderr and "- python=3.10" in r.stderr
    assert "the env keep is back as it was (python 3.9)" in r.stdout
    assert (old / "kept.txt").read_text() == "a file of the old env"
    assert not (conda_root / "envs" / ".keep.replaced").exists()


def test_recreating_replaces_the_env_with_the_python_asked(conda_root: Path) -> None:
    import sys
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    old = _old_env(conda_root, "swap", "3.9")
    r = _run_env_step(conda_root, "swap", want, "3.9")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (old / "kept.txt").exists() and not (conda_root / "envs" / ".swap.replaced").exists()
    assert (old / "conda-meta" / "gpu-provision").read_text() == f"python={want}\n"
    assert r.stdout.strip().endswith(f"Python {sys.version.split()[0]}")
