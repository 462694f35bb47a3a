"""Optional dependencies: a task whose extra is missing says the one line that installs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from provision.config.extras import install_line, need
from provision.errors import ProvisionError
from provision.money import chart

ROOT = Path(__file__).resolve().parents[2]


def test_need_names_what_is_missing_and_the_pip_line() -> None:
    need("yaml", "jinja2", extra="verify")  # present: nothing happens
    with pytest.raises(ProvisionError) as exc:
        need("yaml", "no_such_module_here", extra="verify")
    assert exc.value.exit_code == 2  # this install cannot run the task: as a usage error
    assert str(exc.value) == ("no_such_module_here is not installed (the 'verify' extra); "
                              f"install with: {sys.executable} -m pip install "
                              "'gpu-provision[verify]'")


def test_install_line_uses_this_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/home/me/.local/pipx/venvs/gpu-provision/bin/python")
    assert install_line("chart") == ("/home/me/.local/pipx/venvs/gpu-provision/bin/python -m pip "
                                     "install 'gpu-provision[chart]'")
    monkeypatch.setattr(sys, "executable", r"C:\Program Files\Python311\python.exe")
    assert install_line("all") == ('"C:\\Program Files\\Python311\\python.exe" -m pip install '
                                   "'gpu-provision[all]'")


def test_chart_without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(ProvisionError, match=r"matplotlib is not installed \(the 'chart' extra\);"
                       r" install with: .* -m pip install 'gpu-provision\[chart\]'"):
        chart.render([])


def without(modules: list[str], *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real program, in a process where ``modules`` cannot be imported."""
    code = ("import sys\n"
            f"for m in {modules!r}: sys.modules[m] = None\n"
            f"sys.argv = ['gpu-provision', *{list(argv)!r}]\n"
            "from provision.cli.main import main\nmain()\n")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_verify_task_without_its_extra(tmp_path: Path) -> None:
    # port 9 on loopback: nothing listens, and nothing may try: the check comes first
    r = without(["pytest", "testinfra"], "-H", "root@127.0.0.1:9", "verify", cwd=tmp_path)
    assert r.returncode == 2  # this install cannot run the task (docs/commands.md: exit codes)
    assert r.stderr.strip() == ("error: pytest and testinfra are not installed (the 'verify' "
                                f"extra); install with: {sys.executable} -m pip install "
                                "'gpu-provision[verify]'")


def test_compare_task_without_its_extra(tmp_path: Path) -> None:
    """The table needs nothing extra; only the chart does, and says how to get it."""
    r = without(["matplotlib"], "compare", "--report", "published", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("compare: value for money") and "lambda-h100-sxm" in r.stdout
    assert r.stderr.strip() == ("no chart: matplotlib is not installed (the 'chart' extra); "
                                f"install with: {sys.executable} -m pip install "
                                "'gpu-provision[chart]'")
    assert not (tmp_path / "reports").exists()
