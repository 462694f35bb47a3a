"""The exit codes as the command line's page (docs/commands.md, "Exit codes") says them, for the tasks as a user types them, each
failure said in one line, once: 2 for a command line that cannot work (an unknown task or
option, a bad value, a missing -H or argument, an extra not installed) and for nothing that
fits; 1 for a task that ran and found a failure (an SSH failure, a bad inventory). Nothing here
reaches a host: the inventory names a port nothing listens on (127.0.0.1:9), so a task that
connected would fail with 1 instead. A blocked plan (2), a failed step (1), a FAIL verdict (1)
and Ctrl-C (130) need a host: tests/sandbox/test_small_disk.py, test_faults.py,
test_gpu_bootstrap.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = (ROOT / "docs" / "commands.md").read_text()

# (argv, exit code, the one error line's start)
TABLE = [
    (["bootstrp"], 2, "error: no task named 'bootstrp' (did you mean bootstrap?)"),
    (["-H", "box", "plan", "--toch", "2.5"], 2, "error: plan: no option --toch"),
    (["-H", "box", "plan", "--torch"], 2, "error: plan: --torch needs a value"),
    (["-H", "box", "plan", "--env-name", "a;b"], 2, "error: --env-name: 'a;b' is not a valid name"),
    (["--keep", "-1", "-H", "box", "facts"], 2, "error: --keep -1: give whole seconds"),
    (["-H", "box", "run"], 2, "error: no command: give one after --"),
    (["-H", "box", "run", "--launcher", "foo", "--", "true"], 2,
     "error: --launcher: 'foo' must be one of: auto, tmux, setsid"),
    (["-H", "box", "cancel", "--stepp", "torch"], 2, "error: cancel: no option --stepp (did you "
                                                   "mean --step?)"),
    (["-H", "box", "logs"], 2, "error: 'logs' did not receive required positional arguments"),
    (["pick", "--driver", "390.48", "--compute-cap", "9.0", "--python", "3.11"], 2,
     "error: no torch wheel fits driver 390.48 with sm_90"),
    (["fit", "--model", "llama-3.1-8b", "--method", "qlorra"], 2,
     "error: --method qlorra: one of infer, lora, qlora, full"),
    (["doctor", "--log", "missing.txt"], 2, "error: --log missing.txt: cannot read it"),
    (["-H", "box", "facts"], 1, "error: box: connection refused: 127.0.0.1:9 refused the "
                                "connection"),
    (["-H", "broken", "facts"], 1, "error: "),
]
# every task that works on a host says so without one (2), before anything else
HOST_TASKS = ["facts", "plan", "bootstrap", "driver", "conda", "env", "torch", "validate",
              "verify", "bench", "cancel", "cost", "repin", "forget-host-key", "forget-secrets",
              "authorize", "jobs", "watch", "run", "shell", "forward", "forget-login"]


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("codes")
    (d / "inventories").mkdir()
    key = d / "key"
    key.write_text("not a key: nothing connects\n")
    (d / "inventories" / "box.yaml").write_text(f"host: 127.0.0.1\nport: 9\nkey: {key}\n")
    (d / "inventories" / "broken.yaml").write_text("host: 127.0.0.1\nprot: 9\n")
    return d


def _run(argv: list[str], where: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GPU_PROVISION_HOME=str(where / "home"), GPU_PROVISION_KEEP="0",
               COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "provision", *argv], cwd=where, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_docs_say_the_codes() -> None:
    said = " ".join(COMMANDS.split())
    for words in ("0 done; 1 the task ran and found a failure", "2 the command line cannot work",
                  "a blocked plan", "an extra that is not installed", "130 interrupted"):
        assert words in said, words


@pytest.mark.parametrize("argv,code,line", TABLE, ids=[" ".join(t[0]) for t in TABLE])
def test_each_failure_has_its_code_and_one_line(place: Path, argv: list[str], code: int,
                                                line: str) -> None:
    r = _run(argv, place)
    assert r.returncode == code, r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(line), r.stderr
    assert r.stdout == "" or not re.search(r"\berror\b", r.stdout)  # said once, on stderr


def test_every_host_task_without_a_host_is_a_usage_error(place: Path) -> None:
    for task in HOST_TASKS:
        r = _run([task], place)
        assert r.returncode == 2, (task, r.stderr)
        assert r.stderr.count("error: ") == 1, (task, r.stderr)
        if task not in ("shell", "forward"):  # (a terminal, the ports: checked first)
            assert r.stderr.startswith("error: this task needs a host: -H "), (task, r.stderr)
