"""The job queue without a host: what `jobs` makes of a queued or dropped job's record, the
queue's scripts as bash, and the command lines refused before connecting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from provision.jobs import remote
from provision.jobs.spec import JobSpec
from provision.jobs.state import parse_records
from provision.remote.templating import render

RECORDS = """now 1000
host-boot b1
job run-1
spec {"name": "run", "argv": ["bash", "x.sh"]}
started 900
boot b1
wrapper 11 alive
pid 12
end
job c-1
spec {"name": "c"}
wrapper none dead
queued 2 count 1
end
job d-1
spec {"name": "d"}
wrapper none dead
queued 1 ids 0,1
end
job e-1
spec {"name": "e"}
wrapper none dead
dropped 950
end
"""


def test_jobs_shows_the_queue_in_its_order() -> None:
    h = parse_records(RECORDS, "box")
    assert [(j.name, j.label) for j in h.jobs] == [
        ("run", "running"), ("e", "dropped from the queue"), ("d", "queued (#1)"),
        ("c", "queued (#2)")]
    d = next(j for j in h.jobs if j.name == "d")
    assert (d.queue_position, d.wants, d.failed) == (1, "ids 0,1", False)
    assert d.as_json(h.now)["queue_position"] == 1


def bash_ok(script: str) -> bool:
    return subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_the_queue_scripts_are_bash() -> None:
    spec = JobSpec(id="a-1", name="a", argv=("python", "train.py"), sent="/here")
    for count, gpus in ((2, None), (None, (0, 1)), (None, None)):
        s = remote.launch_script(JobSpec(**{**spec.__dict__, "gpus": gpus}), queue=True,
                                 gpu_count=count, parallel=2)
        want = "'count 2'" if count else "'ids 0,1'" if gpus else "all"
        assert bash_ok(s) and f"printf '%s\\n' {want} > \"$jd/queued\"" in s
    assert bash_ok(render("jobs/queue_runner.sh.j2"))
    for mode in ("list", "move", "drop", "parallel"):
        assert bash_ok(render("jobs/queue_ctl.sh.j2", mode=mode, job="a; rm -rf /", to="2",
                              parallel="1"))


@pytest.mark.parametrize("args,said", [
    (["run", "--parallel", "2", "--", "true"], "--parallel limits the queue: use it with --queue"),
    (["run", "--queue", "--gpus", "0", "--", "true"], "--gpus 0: a queued job asks for at "
                                                       "least one GPU"),
    (["queue", "--to", "2"], "--to: with --move JOB"),
    (["queue", "--move", "x"], "--move: say where with --to N")])
def test_queue_command_lines_refused_before_connecting(tmp_path: Path, args: list[str],
                                                      said: str) -> None:
    r = subprocess.run([sys.executable, "-m", "provision", "-H", "root@127.0.0.1:1", *args],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and said in r.stderr, r.stderr
