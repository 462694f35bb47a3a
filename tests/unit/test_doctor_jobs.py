"""doctor on jobs: the job lister sends the end of a failed job's log, `jobs` and `logs -f` turn
it into one line that points to `doctor --job`, and `doctor --job` reads the end of the log on
the host. The job scripts run here in bash on a job folder as the supervisor leaves it."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from provision.cli.jobs_commands import failure_note, job_log_tail
from provision.doctor.match import diagnose, headline
from provision.jobs import remote
from provision.jobs.spec import JobSpec
from provision.jobs.state import parse_records, unpack_tail
from provision.remote.command import Command, bash_script

T = TypeVar("T")
FIX = Path(__file__).resolve().parent.parent / "fixtures"
BOOT = "7d3c6a56-0000-4000-8000-000000000001"
OOM = ("Traceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n"
       "    loss.backward()\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
       "2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.12 GiB is free.\n")


def _job(home: Path, job: str, log: str, rc: int | None) -> Path:
    jd = home / ".gpu-provision" / "jobs" / job
    jd.mkdir(parents=True)
    name = job.rsplit("-", 1)[0]
    (jd / "spec.json").write_text(JobSpec(job, name, ("python", "train.py")).spec_json() + "\n")
    for key, text in (("name", name), ("started", "1000"), ("boot", BOOT), ("gpus", "0"),
                      ("launcher", "setsid"), ("wrapper", "999999999"), ("pid", "999999998")):
        (jd / key).write_text(text + "\n")
    if rc is not None:
        (jd / "exit.json").write_text(f'{{"rc": {rc}, "ended": 1010}}\n')
    (jd / "log").write_text(log)
    return jd


def _listed(home: Path) -> dict[str, object]:
    r = subprocess.run(["bash", "-c", remote.list_script()], capture_output=True, text=True,
                       env={"HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return {j.id: j for j in parse_records(r.stdout, "box").jobs}


def test_the_lister_sends_the_end_of_a_failed_jobs_log(tmp_path: Path) -> None:
    progress = "".join(f"step {i} loss 2.{i % 10}\n" for i in range(3000))
    _job(tmp_path, "train-1", progress + OOM, rc=1)
    _job(tmp_path, "ok-1", progress, rc=0)
    jobs = _listed(tmp_path)
    failed, ok = jobs["train-1"], jobs["ok-1"]
    assert failed.log_tail.endswith(OOM) and len(failed.log_tail) <= 12288  # type: ignore[attr-defined]
    assert ok.log_tail == ""  # type: ignore[attr-defined]
    note = failure_note("box", "train-1", failed.log_tail, failed.label)  # type: ignore[attr-defined]
    assert note == ("box: train-1 exited 1: The GPU ran out of memory (cuda-oom); "
                    "`gpu-provision -H box doctor --job train-1` says more")


def test_a_failed_job_without_a_known_failure_still_points_to_doctor() -> None:
    note = failure_note("box", "t-1", "ValueError: my own check failed\n", "exited 2")
    assert note.startswith("box: t-1 exited 2: no known failure in the end of its log;")
    assert "doctor --job t-1" in note


def test_a_damaged_tail_is_no_text() -> None:
    assert unpack_tail("") == "" and unpack_tail("not base64!") == ""
    assert unpack_tail("aGVsbG8=") == ""  # base64, but not gzip


def test_the_headline_is_the_first_sentence_of_the_first_error() -> None:
    assert headline([]) is None
    line = headline(diagnose({"l": "ImportError: libGL.so.1: cannot open shared object file: "
                                   "No such file or directory"}))
    assert line == ("libGL.so.1 is a system library the package needs; this OS does not have "
                    "it (shared-object-missing)")


@dataclass
class _Result:
    exit_code: int
    stdout: str
    stderr: str


class LocalExecutor:
    """Runs the job scripts in bash here, with HOME at a temporary folder (as a host would)."""

    secrets: tuple[str, ...] = ()
    log_dir = None

    def __init__(self, home: Path) -> None:
        self.home, self.host, self.executions = home, "box", 0

    def run(self, command: Command, step: str, check: bool = True, timeout: int | None = None,
            on_out: Callable[[str], None] | None = None,
            on_err: Callable[[str], None] | None = None, stdin: str | None = None,
            what: str | None = None, reads_only: bool = False) -> _Result:
        self.executions += 1
        r = subprocess.run(list(command.argv), capture_output=True, text=True, input=stdin,
                           env={"HOME": str(self.home), "PATH": "/usr/bin:/bin"})
        for line in r.stdout.splitlines():
            (on_out or (lambda _: None))(line)
        return _Result(r.returncode, r.stdout, r.stderr)

    def query(self, name: str, script: str, parse: Callable[[str], T], *, what: str,
              fix: str | None = None, stdin: str | None = None, any_exit: bool = False,
              reads_only: bool = False) -> T:
        r = self.run(bash_script(script), step=name, stdin=stdin)
        assert r.exit_code == 0 or any_exit, r.stderr
        return parse(r.stdout)


def test_doctor_job_reads_the_end_of_the_log_on_the_host(tmp_path: Path) -> None:
    progress = "".join(f"epoch {i} it/s 3.{i % 10} loss {1 + i % 7}.0\n" for i in range(20000))
    _job(tmp_path, "train-1", "old run\n", rc=0)
    (tmp_path / ".gpu-provision/jobs/train-1/started").write_text("900\n")
    _job(tmp_path, "train-2", progress + OOM, rc=1)
    ex = LocalExecutor(tmp_path)
    job_id, text = job_log_tail(ex, "train", limit=64 * 1024)  # type: ignore[arg-type]
    assert job_id == "train-2" and ex.executions == 2
    assert text.rstrip("\n").endswith(OOM.rstrip("\n")) and len(text) <= 64 * 1024
    assert not text.startswith(remote.JOB_HEADER)
    [f] = diagnose({f"job {job_id}": text})
    assert f.id == "cuda-oom" and f.evidence.startswith("job train-2: torch.OutOfMemoryError")
