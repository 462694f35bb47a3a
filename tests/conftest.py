"""Shared fixtures: sandbox hosts (skipped with the reason where they cannot run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox import harness

ROOT = Path(__file__).resolve().parent.parent


CI = os.environ.get("CI") == "true"

# The suite runs what a user runs: the kept connection and the warm start (remote/keep.py,
# cli/warm.py), on by default. Only their idle time is shorter than a user's 10 minutes: each
# test has a state dir (and so a known_hosts, and so keepers) of its own, and a finished test's
# keepers should not pile up. The fresh path (--no-keep) is its own tier: the ``link`` fixture
# runs each task that opens a channel both ways. Any keeper lives under the sandbox dir, where
# stop_all ends it.
os.environ.setdefault("GPU_PROVISION_KEEP", "45")
os.environ.setdefault("GPU_PROVISION_RUN_DIR", str(harness.keeper_dir()))
ALLOWED_SKIPS = ROOT / "tests" / "allowed_skips.txt"


def _worker(config: pytest.Config) -> bool:
    """True in a test process that pytest-xdist started (pytest -n): it runs beside others."""
    return hasattr(config, "workerinput")


@pytest.fixture(scope="session")
def sandbox_ready(pytestconfig: pytest.Config) -> Iterator[None]:
    problem = harness.why_unavailable()
    if problem:
        if CI:  # a green CI run must have run the sandbox tier
            pytest.fail(f"sandbox hosts unavailable under CI: {problem}", pytrace=False)
        pytest.skip(f"sandbox hosts unavailable: {problem}")
    yield
    if _worker(pytestconfig):
        harness.stop_started()  # the other processes' hosts and the mirror are still in use
    else:
        harness.stop_all()


def allowed_skips() -> list[tuple[str, str]]:
    """(node id prefix, why) of the skips a CI run may have: tests/allowed_skips.txt."""
    out = []
    for line in ALLOWED_SKIPS.read_text().splitlines():
        node, _, why = line.partition("#")
        if node.strip():
            out.append((node.strip(), why.strip()))
    return out


_SKIPPED: list[tuple[str, str]] = []

# Test files by the seconds they took alone on a 2-core machine (`--durations=0`, summed per
# file), heaviest first. Under `pytest -n` each process takes the next file in collection order
# (--dist loadfile --no-loadscope-reorder), so the long ones start first and the processes end
# together; a file not listed runs after these. The order changes how long a run takes, never
# what it checks.
HEAVIEST_FIRST = (
    "sandbox/test_bad_mirror.py",  # 261 s alone (four bootstraps: the torch step and the
    # packages step, each against a stalling and a truncating mirror; two took 475 s under load)
    "sandbox/test_logins.py",  # 265 s alone while 8 other test processes ran (two sudo driver
    # installs with a reboot, one full bootstrap as a login without sudo)
    "sandbox/test_autostop.py",  # 376 s (many idle periods and stops, on a busy machine)
    "sandbox/test_autostop_keep.py",  # ~300 s (saves, busy signals, three preemption
    # notices, the spend cap; 434 s at a load of 6-10 on 2 cores)
    "sandbox/test_queue.py",  # 70 s (five queued jobs on a two-GPU host)
    "sandbox/test_image_logins.py",  # 119 s (two fresh hosts, each with a torch installed
    # from the mirror as an image or a login put it; 297 s on a first run beside other work)
    "sandbox/test_image_pythons.py",  # 190 s (three fresh hosts, each with a torch from the
    # mirror put where an image's build puts it)
    "sandbox/test_ssh_route.py",  # 171 s alone (four hosts, two of them bastions; about 40
    # commands through one or two jump hosts, each a login of its own), under a load of 7
    "unit/test_validate_truth.py",  # 160-200 s (the payload on four-GPU stand-in hosts, a
    # sustained load, a slow nvidia-smi)
    "sandbox/test_limited_host.py",  # 132 s (the bench on 1.5 cores)
    "sandbox/test_small_disk.py",  # 75 s alone (a bootstrap stopped twice, then redone; 172 s
    # at a load of 10 on 2 cores)
    "sandbox/test_jobs.py",  # 124 s
    "sandbox/test_hands.py",  # 124 s
    "sandbox/test_gpu_bootstrap.py",  # 98 s
    "sandbox/test_ollama.py",  # 66 s (one bootstrap with recipe ollama)
    "sandbox/test_meet_the_host.py",  # 89 s
    "sandbox/test_faults.py",  # 76 s
    "sandbox/test_installer.py",  # 72 s
    "sandbox/test_bootstrap.py",  # 58 s
    "sandbox/test_provisioned.py",  # 46 s
    "sandbox/test_driver.py",  # ~40 s (9 tests; 253 s beside 7 other runs on 2 cores)
    "sandbox/test_wheel.py",  # 38 s
    "sandbox/test_hardening.py",  # 32 s
    "sandbox/test_mirror.py",  # 25 s
    "sandbox/test_many_hosts.py",  # 23 s
    "sandbox/test_standins.py",  # 22 s
    "sandbox/test_signals.py",  # ~25 s (three fresh hosts, three blackholed connects)
    "sandbox/test_data_sync.py",  # 19 s
    "sandbox/test_facts_on_hosts.py",  # 16 s
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def weight(item: pytest.Item) -> int:
        rel = item.path.relative_to(ROOT / "tests").as_posix()
        return HEAVIEST_FIRST.index(rel) if rel in HEAVIEST_FIRST else len(HEAVIEST_FIRST)
    items.sort(key=weight)  # stable: tests keep their order within a file


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPPED.append((report.nodeid, str(reason)))


def _unexpected() -> list[tuple[str, str]]:
    allowed = [node for node, _ in allowed_skips()]
    return [(n, why) for n, why in _SKIPPED if not any(n.startswith(a) for a in allowed)]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int) -> None:
    unexpected = _unexpected()
    terminalreporter.write_line(f"skipped: {len(_SKIPPED)} ({len(_SKIPPED) - len(unexpected)} "
                                f"on the allowed list, tests/allowed_skips.txt)")
    if CI and unexpected:
        terminalreporter.write_line("skips not on the allowed list fail a CI run:", red=True)
        for node, why in unexpected:
            terminalreporter.write_line(f"  {node}: {why}", red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if CI and _unexpected() and exitstatus == 0:
        session.exitstatus = 1
    if session.config.getoption("numprocesses", None) and not _worker(session.config) \
            and harness.why_unavailable() is None:
        harness.stop_all()  # every test process has ended: the mirror and any leftover host


class Hosts:
    """Starts sandbox hosts on demand; one per profile unless asked for a fresh one."""

    def __init__(self) -> None:
        self.shared: dict[str, harness.HostInfo] = {}

    def get(self, profile: str) -> harness.HostInfo:
        if profile not in self.shared:
            self.shared[profile] = harness.start(profile)
        return self.shared[profile]

    def fresh(self, profile: str, **kw: Any) -> harness.HostInfo:
        return harness.start(profile, **kw)


@pytest.fixture(scope="session")
def hosts(sandbox_ready: None) -> Hosts:
    return Hosts()


@pytest.fixture()
def gp_home(tmp_path: Path) -> Path:
    """A private state dir (known_hosts) for one test."""
    home = tmp_path / "gp-home"
    home.mkdir()
    return home


@dataclass(frozen=True)
class Link:
    """How a test's commands reach their host: ``kept``, through a kept connection and the warm
    start in a run dir of this test's own (a user's default), or ``fresh`` (``--no-keep``)."""

    name: str
    env: dict[str, str]
    run_dir: Path | None

    def went_through_a_keeper(self) -> bool:
        """A kept link's commands left a keeper behind (so they used one); a fresh link's none."""
        found = bool(self.run_dir and harness.keeper_pids(self.run_dir))
        return found == (self.name == "kept")


@pytest.fixture(params=["kept", "fresh"])
def link(request: pytest.FixtureRequest) -> Iterator[Link]:
    """Each task that opens a channel is tested both ways: through a keeper and afresh."""
    if request.param == "fresh":
        yield Link("fresh", {"GPU_PROVISION_KEEP": "0"}, None)
        return
    run_dir = harness.keeper_dir() / uuid.uuid4().hex[:8]
    yield Link("kept", {"GPU_PROVISION_KEEP": "120", "GPU_PROVISION_RUN_DIR": str(run_dir)},
               run_dir)
    harness.stop_keepers(run_dir)
    assert harness.keeper_pids(run_dir) == []


def gpu_provision(*args: str, home: Path, cwd: Path | None = None,
                  env: dict[str, str] | None = None, timeout: int = 300
                  ) -> subprocess.CompletedProcess[str]:
    """Run the real program as a user would (a separate process). Given a ``cwd``, the test's
    logs/ and reports/ are kept in it (``--workdir``'s variable), where the test reads them;
    without one they go to ``home`` (``$GPU_PROVISION_HOME`` holds them); ``env`` may set
    GPU_PROVISION_WORKDIR itself ("" for the default rule)."""
    e = dict(os.environ, GPU_PROVISION_HOME=str(home), COLUMNS="200")
    if cwd is not None:
        e["GPU_PROVISION_WORKDIR"] = str(cwd)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "provision", *args], capture_output=True,
                          text=True, cwd=str(cwd or ROOT), env=e, timeout=timeout)


def facts_json(info: harness.HostInfo, home: Path) -> dict[str, Any]:
    r = gpu_provision("-H", info.inventory, "facts", "--json", home=home)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]
