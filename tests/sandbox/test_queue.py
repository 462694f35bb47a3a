"""The job queue on a 2-GPU sandbox host (two RTX 3090, captured): `run --queue` jobs start in
order as the GPUs they ask for come free, two at once; each runs the code as it was when it was
queued; `jobs` and `queue` show the positions; a queued job is moved and dropped; autostop
--after-queue counts the queue as work and stops the machine once it has run."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Hosts, gpu_provision
from tests.sandbox import harness
from tests.sandbox.remote import ssh

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def host(hosts: Hosts) -> Iterator[harness.HostInfo]:
    info = hosts.fresh("two-gpus")
    # the env a bootstrap leaves where it uses the host's python through a venv of its own,
    # recorded in expected.json (what `run` reads)
    ssh(info, "python3 -m venv --without-pip /root/venv-gp && mkdir -p /root/.gpu-provision && "
              "printf '{\\n \"env_prefix\": \"/root/venv-gp\",\\n \"conda_root\": "
              "\"/root/venv-gp\"\\n}\\n' > /root/.gpu-provision/expected.json")
    yield info
    harness.stop(info.id)


def jobs(info: harness.HostInfo, gp_home: Path, cwd: Path) -> dict[str, dict[str, Any]]:
    r = gpu_provision("-H", info.inventory, "jobs", "--all", "--json", home=gp_home, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    return {j["name"]: j for j in json.loads(r.stdout)}


def test_three_jobs_on_two_gpus_in_order_two_at_once(host: harness.HostInfo, gp_home: Path,
                                                     tmp_path: Path) -> None:
    code = tmp_path / "proj"
    code.mkdir()
    job = code / "job.sh"
    # gate: run until the test opens the gate (the queue is looked at meanwhile)
    body = ("if [ \"$1\" = gate ]; then while [ ! -e /root/go ]; do sleep 0.2; done; "
            "else sleep \"$1\"; fi\n")
    job.write_text("echo \"v1 on GPUs $CUDA_VISIBLE_DEVICES\"\n" + body)
    ssh(host, "rm -f /root/go")
    r = gpu_provision("-H", host.inventory, "autostop", "--idle", "2s", "--interval", "0.3s",
                      "--after-queue", "--json", home=gp_home, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    where = json.loads(r.stdout)["dir"]

    def state() -> dict[str, Any]:
        return json.loads(ssh(host, f"cat {where}/state.json")[1] or "{}")  # type: ignore[no-any-return]

    harness.wait_until(lambda: state().get("busy") == "the queue has not run yet",
                       "armed only after the queue", timeout=30)
    n = len(host.calls())

    def queue(name: str, gpus: str, secs: int | str) -> str:
        r = gpu_provision("-H", host.inventory, "run", "--queue", "--gpus", gpus, "--name", name,
                          "--code", str(code), "--json", "--", "bash", "job.sh", str(secs),
                          home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        return str(json.loads(r.stdout)["id"])

    ids = {"a": queue("a", "1", "gate"), "b": queue("b", "1", "gate")}
    ids["c"] = queue("c", "1", 2)
    job.write_text("echo \"v2 on GPUs $CUDA_VISIBLE_DEVICES\"\n" + body)  # edited after
    ids["d"] = queue("d", "2", 2)
    ids["e"] = queue("e", "1", 2)
    listed = jobs(host, gp_home, tmp_path)
    assert {listed[x]["state"] for x in "ab"} == {"running"}
    assert [(listed[x]["state"], listed[x]["wants"]) for x in "cde"] == \
        [("queued (#1)", "count 1"), ("queued (#2)", "count 2"), ("queued (#3)", "count 1")]
    # d to the front, e out: d then waits for both GPUs, and c waits behind it
    for args in (("--move", "d", "--to", "1"), ("--drop", "e")):
        r = gpu_provision("-H", host.inventory, "queue", *args, "--json", home=gp_home,
                          cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
    q = json.loads(r.stdout)
    assert [(x["position"], x["name"]) for x in q["queued"]] == [(1, "d"), (2, "c")]
    assert state()["busy"].startswith("job ")  # a and b run; c and d wait
    assert [c for c in host.calls()[n:] if c["tool"] == "shutdown"] == []
    ssh(host, "touch /root/go")

    harness.wait_until(lambda: all(jobs(host, gp_home, tmp_path)[x]["state"] == "exited 0"
                                   for x in "abcd"), "the queue to run", timeout=120)
    done = jobs(host, gp_home, tmp_path)
    assert done["e"]["state"] == "dropped from the queue" and done["e"]["started"] is None
    assert {tuple(done[x]["gpus"]) for x in "ab"} == {(0,), (1,)} and done["d"]["gpus"] == [0, 1]
    # in order: d only once a and b had both ended, c after d had started; never more than the
    # two GPUs at once
    assert done["d"]["started"] >= max(done["a"]["ended"], done["b"]["ended"])
    assert done["c"]["started"] >= done["d"]["started"]
    for x in "abcd":
        for y in "abcd":
            if x < y and set(done[x]["gpus"]) & set(done[y]["gpus"]):
                assert done[x]["ended"] <= done[y]["started"] or \
                    done[y]["ended"] <= done[x]["started"], (x, y)
    # each ran the code it was queued with (c after d, though d sent v2 before c started)
    logs = {x: ssh(host, f"cat /root/.gpu-provision/jobs/{ids[x]}/log")[1] for x in "cd"}
    assert logs["c"].startswith("v1 on GPUs ") and logs["d"].startswith("v2 on GPUs 0,1")
    # the queue has run and is empty: autostop stops the machine
    harness.wait_until(lambda: [c for c in host.calls()[n:] if c["tool"] == "shutdown"],
                       "the shutdown after the queue", timeout=60)
    assert time.time() - done["c"]["ended"] < 60
