"""The program's surface: `fab -l` in the checkout and the installed `gpu-provision`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_fab_lists_tasks_in_the_checkout() -> None:
    r = subprocess.run([str(BIN / "fab"), "-l"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    names = {line.split()[0] for line in r.stdout.splitlines()[1:] if line.startswith("  ")}
    assert {"facts", "plan", "pick", "refresh-compat", "repin", "forget-host-key", "doctor"} <= names


def test_console_script_carries_the_same_tasks(tmp_path: Path) -> None:
    r = subprocess.run([str(BIN / "gpu-provision"), "-l"], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert "facts" in r.stdout and "pick" in r.stdout and "plan" in r.stdout
    assert subprocess.run([str(BIN / "gpu-provision"), "-V"], capture_output=True,
                          text=True).stdout.startswith("gpu-provision")


def test_host_task_without_host_says_so(tmp_path: Path) -> None:
    r = subprocess.run([str(BIN / "gpu-provision"), "facts"], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 2  # a usage error
    assert r.stderr == "error: this task needs a host: -H <inventory name | user@host:port>\n"


def test_bad_inventory_on_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "box.yaml").write_text("host: 1.2.3.4\nprot: 22\n")
    r = subprocess.run([str(BIN / "gpu-provision"), "-H", "box", "facts"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"error: {tmp_path}/inventories/box.yaml:2: prot: unknown key "
                                "(did you mean 'port'? allowed: cuda_compat, currency, data_dir, domain_libraries, "
                                "env_dir, env_name, gpu, host, keep, key, max_spend, miniconda_sha256, "
                                "miniconda_version, mirrors, notes, notify, packages, password_env, "
                                "platform, port, "
                                "price_per_hour, push_env, python, recipe, torch, user)")


def test_doctor_offline_on_an_error_text(tmp_path: Path) -> None:
    fixture = ROOT / "tests/fixtures/torch/err-not-compiled-cuda-detectron2-linux.txt"
    r = subprocess.run([str(BIN / "gpu-provision"), "doctor", "--log", str(fixture), "--json"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    [finding] = json.loads(r.stdout)
    assert finding["id"] == "torch-cpu-build" and "--index-url" in finding["fix"]
    clean = tmp_path / "ok.txt"
    clean.write_text("Epoch 3: loss 0.21\n")
    r = subprocess.run([str(BIN / "gpu-provision"), "doctor", "--log", str(clean)], cwd=tmp_path,
                       capture_output=True, text=True)
    assert (r.returncode, r.stdout.strip()) == (0, "doctor: <host>: no known problem found")
    r = subprocess.run([str(BIN / "gpu-provision"), "doctor", "--log", "missing.txt"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2 and "--log missing.txt: cannot read it (No such file or directory)" in r.stderr


def test_every_option_has_help_and_the_conventional_letters() -> None:
    """Options are long; -j/-p/-r mean --json/--python/--recipe in every task and no task letter
    shadows a program-wide flag but `logs -f` (follow, as tail -f); every option says what it is
    for, in every parser made."""
    from provision.cli.main import namespace, program
    from provision.cli.taskkit import PROGRAM_LETTERS, SHORT_FLAGS
    core = {n for a in program.core_args() for n in a.names if len(n) == 1}
    assert core == PROGRAM_LETTERS
    own = {("logs", "follow"): "f"}
    for _ in range(2):  # Invoke used to hand each help text to the first parser only
        for ctx in namespace.to_contexts():
            for arg in ctx.args.values():
                long = max(arg.names, key=len)
                assert arg.help, f"{ctx.name} --{long} has no help text"
                for letter in (n for n in arg.names if len(n) == 1):
                    if (ctx.name, long) in own:
                        assert own[ctx.name, long] == letter
                        continue
                    assert SHORT_FLAGS.get(long) == letter, f"{ctx.name}: -{letter} is --{long}"
                    assert letter not in PROGRAM_LETTERS, f"{ctx.name}: -{letter}"


def test_logs_dash_f_follows_after_the_task_and_is_the_config_file_before_it() -> None:
    """`logs JOB -f` follows (what tail, docker and kubectl taught everyone); `-f FILE` before
    the task is still Fabric's config file."""
    from invoke.parser import Parser

    from provision.cli.main import namespace, program
    parser = Parser(contexts=namespace.to_contexts(), initial=program.initial_context)
    result = parser.parse_argv(["-f", "my.yaml", "logs", "train", "-f"])
    got = [(c.name, {k: a.value for k, a in c.args.items() if a.got_value}) for c in result]
    assert got[0][1].get("config") == "my.yaml"
    assert got[1] == ("logs", {"job": "train", "follow": True})


def test_a_plain_import_stays_light() -> None:
    """`import provision.cli.main` (what every command pays for) loads no SSH, template, table,
    chart or test machinery: each task imports its own."""
    heavy = ["matplotlib", "pytest", "testinfra", "fabric", "paramiko", "cryptography", "jinja2",
             "rich", "numpy", "provision.remote.connection", "provision.remote.executor", "provision.wheels.rule"]
    code = ("import sys, provision.cli.main\n"
            f"print([m for m in {heavy!r} if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert (r.returncode, r.stdout.strip()) == (0, "[]"), r.stderr


def test_workdir_holds_the_reports_and_compare_json_writes_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    r = subprocess.run([str(BIN / "gpu-provision"), "compare", "--report", "published", "--json"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert {row["source"].rsplit("/", 1)[-1] for row in json.loads(r.stdout)} == {
        p.name for p in (ROOT / "bench" / "published").glob("*.json")}
    assert list(tmp_path.iterdir()) == []  # --json: no page, no PNG, no folder
    r = subprocess.run([str(BIN / "gpu-provision"), "--workdir", str(work), "compare",
                        "--report", "published"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (work / "reports" / "compare.html").is_file() and (work / "reports" / "compare.png").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_inventory_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """./inventories/ first, then $GPU_PROVISION_INVENTORIES, then the tool's own folder
    (~/.config/gpu-provision/inventories/), then the shipped examples."""
    from provision.config.inventory import resolve_target
    here, env, home = tmp_path / "inventories", tmp_path / "shared", tmp_path / "gp" / "inventories"
    for d, host, only in ((here, "10.0.0.1", "here"), (env, "10.0.0.2", "shared"),
                          (home, "10.0.0.3", "home")):
        d.mkdir(parents=True)
        (d / "box.yaml").write_text(f"host: {host}\n")
        (d / f"only-{only}.yaml").write_text(f"host: {host}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPU_PROVISION_INVENTORIES", str(env))
    monkeypatch.setenv("GPU_PROVISION_HOME", str(tmp_path / "gp"))
    assert resolve_target("box").host == "10.0.0.1"
    assert resolve_target("only-shared").host == "10.0.0.2"
    assert resolve_target("only-home").host == "10.0.0.3"
    assert resolve_target("example-4090").host == "203.0.113.10"  # shipped, found last
    (env / "example-4090.yaml").write_text("host: 10.0.0.9\n")
    assert resolve_target("example-4090").host == "10.0.0.9"  # yours beats the example


def test_json_failure_is_an_object_and_humans_read_stderr(tmp_path: Path) -> None:
    r = subprocess.run([str(BIN / "gpu-provision"), "pick", "--driver", "550.54.14",
                        "--compute-cap", "99.9", "--json"], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 2
    assert json.loads(r.stdout) == {"error": r.stderr.strip().removeprefix("error: "),
                                    "exit_code": 2}


def test_piped_tables_are_not_cut(tmp_path: Path) -> None:
    """A pipe has no width: the table keeps each value whole on its row (no ellipsis)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    r = subprocess.run([str(BIN / "gpu-provision"), "compare", "--report", "published"],
                       cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("│")]
    assert len(rows) == len(list((ROOT / "bench" / "published").glob("*.json")))
    assert "runpod-rtx-4090 (published)" in rows[0]
    a100 = next(ln for ln in rows if "lambda-a100-40gb (published)" in ln)
    assert "NVIDIA A100-SXM4-40GB x1" in a100 and "0.00638 USD" in a100


def test_every_environment_variable_is_documented() -> None:
    """Each GPU_PROVISION_* variable the code reads is in the table of docs/provisioning.md."""
    import re
    read = set()
    for path in (ROOT / "provision").rglob("*.py"):
        read |= set(re.findall(r"environ(?:\.get\(|\[)\s*\"(GPU_PROVISION_[A-Z_]+)\"",
                               path.read_text()))
    assert read >= {"GPU_PROVISION_HOME", "GPU_PROVISION_WORKDIR", "GPU_PROVISION_INVENTORIES"}
    table = (ROOT / "docs" / "provisioning.md").read_text()
    assert {v for v in read if f"| `{v}` |" not in table} == set()


def test_every_task_that_works_in_the_env_can_name_it() -> None:
    """After `bootstrap --env-name mine`, each task that reads or changes that env can be told
    so (without it they would look in the platform's env or the recipe's)."""
    from provision.cli.main import namespace
    takes = {ctx.name for ctx in namespace.to_contexts() if "env_name" in ctx.args}
    assert {"bootstrap", "plan", "env", "torch", "validate", "bench", "doctor"} <= takes
