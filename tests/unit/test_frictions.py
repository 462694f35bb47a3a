"""The small frictions a new user met in a day, each fixed and held here: `TASK -h` for every
task, `--json` before the task's name, forward's ports as separate words, a download said as a
download, `sync up SRC DEST`."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from provision.cli.argv import rewrite
from provision.cli.main import namespace
from provision.config.inventory import load_inventory
from provision.errors import ConfigError
from provision.sync.show import sync_report

TASKS = set(namespace.task_names)


def gp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provision", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_task_answers_h_with_its_help(task: str) -> None:
    r = gp(task, "-h")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"Usage: gpu-provision [--core-opts] {task} ")


def test_help_after_other_words_and_with_hosts() -> None:
    assert rewrite(["gp", "-H", "box", "logs", "train", "--help"], TASKS) == \
        ["gp", "-H", "box", "--help", "logs"]
    # a -h after `--` is the command's own
    assert rewrite(["gp", "-H", "box", "run", "--", "python", "x.py", "-h"], TASKS) == \
        ["gp", "-H", "box", "run", "--", "python", "x.py", "-h"]
    # a host named like a task is the host
    assert rewrite(["gp", "-H", "jobs", "jobs"], TASKS) == ["gp", "-H", "jobs", "jobs"]


def test_json_before_the_task_is_the_tasks() -> None:
    assert rewrite(["gp", "--json", "-H", "box", "jobs", "--all"], TASKS) == \
        ["gp", "-H", "box", "jobs", "--json", "--all"]
    r = gp("--json", "pick", "--driver", "550.54.14", "--compute-cap", "8.9", "--python", "3.10")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)  # the task's JSON, not "did you mean --version?"


def test_forward_ports_as_separate_words() -> None:
    assert rewrite(["gp", "-H", "box", "forward", "8888", "6006:7000", "--job", "nb"], TASKS) == \
        ["gp", "-H", "box", "forward", "8888,6006:7000", "--job", "nb"]


def _said(report: dict[str, object]) -> str:
    out = io.StringIO()
    sync_report(report, Console(file=out, width=200))
    return out.getvalue()


BASE = {"host": "box", "transport": "sftp", "transport_why": "asked", "files": 1, "same": 0,
        "deleted": 0, "bytes": 5, "sent_bytes": 5, "resumed_bytes": 0, "seconds": 0.1,
        "verified": "sha256 of each file on both sides", "dry_run": False, "planned": [],
        "deletions": [], "mbs": None}


def test_a_download_reads_as_a_download() -> None:
    down = _said({**BASE, "direction": "down", "source": "/root/results",
                  "dest": "/tmp/work/results"})
    assert down.splitlines()[:2] == [
        "sync down: box:/root/results -> /tmp/work/results",
        "fetched 1 file(s), 5 B in 0.1s by sftp; 0 already the same"]
    up = _said({**BASE, "direction": "up", "source": "/tmp/data", "dest": "/root/data"})
    assert up.splitlines()[:2] == ["sync up: /tmp/data -> box:/root/data",
                                   "sent 1 file(s), 5 B in 0.1s by sftp; 0 already the same"]
    dry = _said({**BASE, "direction": "down", "source": "/root/r", "dest": "/tmp/r",
                 "dry_run": True, "planned": ["a.ckpt"]})
    assert "would fetch 1 file(s)" in dry and "  fetch a.ckpt" in dry


def test_sync_src_dest_as_scp_and_rsync_take_them() -> None:
    from provision.cli.main import program
    program.normalize_argv(["gp", "-H", "box", "sync", "up", "./data", "/root/data", "--exclude",
                            "*.tmp", "--dry-run"])
    assert program.argv == ["gp", "-H", "box", "sync", "up", "./data", "--dest", "/root/data",
                            "--exclude", "*.tmp", "--dry-run"]
    program.normalize_argv(["gp", "-H", "box", "sync", "down", "--transport", "sftp", "runs/a",
                            "./back/"])
    assert program.argv == ["gp", "-H", "box", "sync", "down", "--transport", "sftp", "runs/a",
                            "--dest", "./back/"]
    program.normalize_argv(["gp", "-H", "box", "sync", "up", "./data"])  # the one-path form
    assert program.argv == ["gp", "-H", "box", "sync", "up", "./data"]


def test_an_unknown_inventory_key_names_the_nearest(tmp_path: Path) -> None:
    inv = tmp_path / "box.yaml"
    inv.write_text("host: 203.0.113.10\nprice_per_hour: 0.4\ncurency: EUR\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(inv)
    assert str(e.value).startswith(f"{inv}:3: curency: unknown key (did you mean 'currency'? "
                                   "allowed: ")


def test_a_timeout_says_how_long_it_waited() -> None:
    """An unroutable address: SYNs dropped (a timeout, said as the wait it was), or "no route"
    (paramiko hands EHOSTUNREACH over inside NoValidConnectionsError, which read as a refusal);
    only a refusal is a refusal."""
    import paramiko

    from provision.config.inventory import Target
    from provision.remote.connection import classify

    t = Target(name="box", host="10.255.255.1", port=22)
    timed_out = TimeoutError("timed out")
    assert str(classify(t, timed_out, timeout=15, waited=31.2)) == (
        "box: timeout: no answer from 10.255.255.1:22 after 31s (-t is 15s) (host down, wrong "
        "port, or a firewall; -t SECONDS waits longer)")
    assert "within 15s" in str(classify(t, timed_out, timeout=15, waited=15.1))
    no_route = paramiko.ssh_exception.NoValidConnectionsError(
        {("10.255.255.1", 22): OSError(errno.EHOSTUNREACH, "No route to host")})
    assert str(classify(t, no_route, timeout=15, waited=3.1)).startswith(
        "box: unreachable: no route to 10.255.255.1:22 after 3s")
    no_net = OSError(errno.ENETUNREACH, "Network is unreachable")
    assert str(classify(t, no_net, timeout=15, waited=0.0)).startswith(
        "box: unreachable: no route to 10.255.255.1:22 after 0s")
    refused = paramiko.ssh_exception.NoValidConnectionsError(
        {("10.255.255.1", 22): ConnectionRefusedError(errno.ECONNREFUSED, "refused")})
    assert "refused the connection" in str(classify(t, refused, timeout=15, waited=0.1))


PUBLISHED = Path(__file__).resolve().parents[2] / "bench" / "published"


def _compare(cwd: Path, *args: str, hide_matplotlib: bool = False
             ) -> subprocess.CompletedProcess[str]:
    hide = "sys.modules['matplotlib'] = None; " if hide_matplotlib else ""  # as if not installed
    code = (f"import sys; {hide}sys.argv = ['gpu-provision', 'compare', *sys.argv[1:]]; "
            "from provision.cli.main import main; main()")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env=_state_env(cwd))


def _state_env(cwd: Path) -> dict[str, str]:
    """The user's environment with the default rule for logs/ and reports/: the XDG state
    folder, here under ``cwd``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPU_PROVISION_HOME", "GPU_PROVISION_WORKDIR")}
    return {**env, "COLUMNS": "200", "XDG_STATE_HOME": str(cwd / "xdg-state")}


def test_compare_prints_its_table_without_the_chart_extra(tmp_path: Path) -> None:
    r = _compare(tmp_path, "--report", "published", hide_matplotlib=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("compare: value for money, sorted by per TFLOP-hour, cheapest")
    assert "lambda-h100-sxm" in r.stdout
    assert "no chart: matplotlib is not installed (the 'chart' extra)" in r.stderr


def test_compare_published_adds_to_yours_and_sorts_by_the_column_it_names(tmp_path: Path) -> None:
    """Yours: here a bench report in the old place (reports/ in the current folder, from before
    reports moved to the state folder): still read, and said so in one line."""
    mine = json.loads(next(PUBLISHED.glob("*.json")).read_text())
    mine.update(host="my-box", published=None, tflops={"bf16": 2000.0}, price_per_hour=9.0)
    (tmp_path / "reports" / "my-box").mkdir(parents=True)
    (tmp_path / "reports" / "my-box" / "bench-20261201-120000.json").write_text(json.dumps(mine))
    r = _compare(tmp_path, "--report", "published", "--json")
    hosts = [row["host"] for row in json.loads(r.stdout)]
    assert "my-box" in hosts and any("(published)" in h for h in hosts), r.stderr
    assert r.stderr.strip() == (
        f"logs/ and reports/ in {tmp_path} are from before they moved to "
        f"{tmp_path / 'xdg-state' / 'gpu-provision'} (the XDG state folder): still read; new ones "
        "go there (move the old ones into it to keep one place)")
    r = _compare(tmp_path, "--report", "published", "--sort", "tflops", "--json")
    tflops = [row["tflops"] for row in json.loads(r.stdout)]
    assert tflops == sorted(tflops, reverse=True) and tflops[0] == 2000.0
    r = _compare(tmp_path, "--report", "published", "--sort", "tflops", hide_matplotlib=True)
    assert r.stdout.startswith("compare: value for money, sorted by TFLOPS, highest first")
    r = _compare(tmp_path, "--sort", "speed")
    assert (r.returncode, r.stderr.strip()) == (2, "error: --sort 'speed': one of auto, "
                                                "per-1m-samples, per-tflop-hour, price, tflops, "
                                                "samples, download")


def test_prune_removes_old_runs_and_reports_but_each_hosts_newest(tmp_path: Path) -> None:
    """In the state folder (the default rule); an old place in the current folder is left as it
    is, and named."""
    from provision.store import run_id
    day = 86400.0
    now = time.time()
    old, older, fresh = run_id(now - 10 * day), run_id(now - 20 * day), run_id(now - 3600)
    cwd, tmp_path = tmp_path, tmp_path / "xdg-state" / "gpu-provision"
    (cwd / "logs" / "box" / older).mkdir(parents=True)  # the old place: not ours to prune now
    for run in (old, older):
        (tmp_path / "logs" / "box" / run).mkdir(parents=True)
        (tmp_path / "logs" / "box" / run / "conda.log").write_text("$ ...\n")
    (tmp_path / "logs" / "lone" / older).mkdir(parents=True)  # its only run: kept
    (tmp_path / "logs" / "box" / fresh).mkdir(parents=True)
    reports = tmp_path / "reports" / "box"
    reports.mkdir(parents=True)
    for name in (f"validate-{older}.json", f"validate-{fresh}.json", f"bench-{older}.json",
                 f"link-{old}.json", f"link-{older}.json"):
        (reports / name).write_text("{}")
    r = subprocess.run([sys.executable, "-m", "provision", "prune", "--older", "7d", "--json"],
                       capture_output=True, text=True, cwd=cwd, timeout=60, env=_state_env(cwd))
    assert r.returncode == 0, r.stderr
    assert (cwd / "logs" / "box" / older).is_dir()
    assert r.stderr.strip().startswith(f"logs/ and reports/ in {cwd} are from before they moved "
                                       f"to {tmp_path} (the XDG state folder): still read;")
    gone = sorted((tmp_path / p).relative_to(tmp_path).as_posix()
                  for p in json.loads(r.stdout)["removed"])
    assert gone == sorted([f"logs/box/{old}", f"logs/box/{older}",
                           f"reports/box/validate-{older}.json", f"reports/box/link-{older}.json"])
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")
                  if p.is_file() or p.parent.name in ("box", "lone"))
    assert f"logs/box/{fresh}" in left and f"logs/lone/{older}" in left
    assert {f"reports/box/validate-{fresh}.json", f"reports/box/bench-{older}.json",
            f"reports/box/link-{old}.json"} <= set(left)
    r = subprocess.run([sys.executable, "-m", "provision", "prune", "--older", "soon"],
                       capture_output=True, text=True, cwd=cwd, timeout=60, env=_state_env(cwd))
    assert (r.returncode, r.stderr.strip()) == (2, "error: --older 'soon': not a duration; write "
                                                "e.g. 30m, 90s, 1h30m")


def test_logs_and_reports_have_one_folder_of_ours(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """--workdir (its variable) beats $GPU_PROVISION_HOME beats $XDG_STATE_HOME/gpu-provision
    beats ~/.local/state/gpu-provision; the current folder is only read, and only where it holds
    logs/ or reports/ as this tool named them (a training repo's own logs/ is not ours)."""
    from provision.store import Store, root_and_why
    for var in ("GPU_PROVISION_WORKDIR", "GPU_PROVISION_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert root_and_why() == (tmp_path / "home" / ".local" / "state" / "gpu-provision",
                              "the XDG state folder")
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")  # the spec: absolute paths only
    assert root_and_why()[0] == tmp_path / "home" / ".local" / "state" / "gpu-provision"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert root_and_why()[0] == tmp_path / "xdg" / "gpu-provision"
    monkeypatch.setenv("GPU_PROVISION_HOME", str(tmp_path / "gp"))
    assert root_and_why() == (tmp_path / "gp", "$GPU_PROVISION_HOME")
    monkeypatch.setenv("GPU_PROVISION_WORKDIR", str(tmp_path / "w"))
    assert root_and_why() == (tmp_path / "w", "--workdir / $GPU_PROVISION_WORKDIR")
    monkeypatch.delenv("GPU_PROVISION_WORKDIR")

    repo = tmp_path / "repo"
    (repo / "logs" / "tensorboard").mkdir(parents=True)  # the training repo's own
    (repo / "logs" / "tensorboard" / "events.out.tfevents.1.box").write_text("x")
    (repo / "logs" / "lightning_logs" / "version_0").mkdir(parents=True)
    monkeypatch.chdir(repo)
    store = Store.here()
    assert (store.root, store.legacy, store.moved_note()) == (tmp_path / "gp", None, None)
    (repo / "reports" / "box").mkdir(parents=True)  # ours, from before the move
    (repo / "reports" / "box" / "validate-20261201-120000.json").write_text('{"verdict": "WARN"}')
    (repo / "logs" / "box" / "20261201-115900").mkdir(parents=True)
    (repo / "logs" / "box" / "20261201-115900" / "torch.log").write_text("installed torch\n")
    store = Store.here()
    assert store.legacy == repo
    assert store.last_report("box") == {"verdict": "WARN"}
    assert store.last_logs("box") == {"log box/20261201-115900/torch.log": "installed torch\n"}
    # a newer one in the new place wins
    store.save_report("box", {"verdict": "PASS"}, run="20261201-130000")
    assert store.last_report("box") == {"verdict": "PASS"}
    assert [p.parent.parent.parent for p in store.reports("validate")] == [repo, tmp_path / "gp"]
