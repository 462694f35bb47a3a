"""Every template renders against every shipped inventory and recipe; the facts script is valid
bash and prints one JSON object on this machine."""

from __future__ import annotations

import functools
import http.server
import json
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from provision.config.inventory import load_inventory, settings_for
from provision.config.recipes import Detect, Platform, all_platforms, load_platform
from provision.config.shipped import templates_dir
from provision.errors import ProvisionError
from provision.facts.gather import facts_script
from provision.facts.host import HostFacts, parse_df
from provision.facts.nvidia import Gpu
from provision.facts.osinfo import parse_os_release
from provision.facts.pci import PciGpu
from provision.facts.platform import Virtualization
from provision.ops.driver import hold_step, install_step
from provision.ops.driver_pick import choose
from provision.remote.command import quote
from provision.remote.runtime import detached_script, foreground_script, split_result
from provision.remote.templating import render
from provision.setup.plan import make_plan

ROOT = Path(__file__).resolve().parents[2]
INVENTORIES = sorted((ROOT / "inventories").glob("*.yaml"))
RECIPES = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("inventory", INVENTORIES, ids=[p.stem for p in INVENTORIES])
@pytest.mark.parametrize("recipe", RECIPES)
def test_facts_script_renders_for_every_inventory(inventory: Path, recipe: str) -> None:
    target = load_inventory(inventory)
    settings = settings_for(target, None, {"recipe": recipe})
    dirs = tuple(d for d in (settings.data_dir,) if d)
    script = facts_script(all_platforms(), dirs)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def bash_ok(script: str) -> bool:
    return subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.parametrize("inventory", INVENTORIES, ids=[p.stem for p in INVENTORIES])
@pytest.mark.parametrize("recipe", RECIPES)
def test_step_scripts_render_for_every_inventory(cpu_host: HostFacts, inventory: Path,
                                                 recipe: str) -> None:
    target = load_inventory(inventory)
    settings = settings_for(target, None, {"recipe": recipe})
    # a GPU VM with its driver, nothing else installed yet: every later step has a script
    gpu = Gpu(0, "NVIDIA GeForce RTX 4090", driver="580.65.06", compute_cap="8.9")
    fresh = replace(cpu_host, conda=(), envs=(), gpus=(gpu,), nvidia_state="ok", driver="580.65.06",
                    driver_cuda="13.0", virtualization=Virtualization("vm", "kvm", "test"),
                    pci_gpus=(PciGpu("01:00.0", "AD102 [GeForce RTX 4090]", "2684"),),
                    os=parse_os_release("ID=ubuntu\nVERSION_ID=22.04\n"))
    plan = make_plan(target.name, fresh, settings, load_platform(settings.platform))
    rendered = [s for s in plan.steps if s.body]
    assert {s.name for s in rendered} >= {"validate", "torch"}
    for step in rendered:
        assert step.body is not None
        script = foreground_script(step.name, step.body) if step.foreground else \
            detached_script(step.name, step.body, inputs=step.inputs, run="r")
        assert bash_ok(script), step.name


@pytest.mark.parametrize("os_release,caps", [
    ("ID=ubuntu\nVERSION_ID=20.04\n", [(8, 6)]),
    ("ID=ubuntu\nVERSION_ID=22.04\n", [(9, 0)]),
    ("ID=debian\nVERSION_ID=12\n", [(6, 1)]),
    ("ID=debian\nVERSION_ID=12\n", [(3, 7)]),
    ("ID=centos\nVERSION_ID=7\nID_LIKE=\"rhel fedora\"\n", [(3, 7)]),
    ("ID=rocky\nVERSION_ID=9.5\nID_LIKE=\"rhel centos fedora\"\n", [(9, 0)]),
    ("ID=almalinux\nVERSION_ID=10.0\nID_LIKE=\"rhel centos fedora\"\n", [(8, 9)]),
])
def test_driver_scripts_render(cpu_host: HostFacts, os_release: str,
                               caps: list[tuple[int, int]]) -> None:
    facts = replace(cpu_host, os=parse_os_release(os_release))
    pick = choose(caps, facts)
    for step in (install_step(facts, pick, "install", "why"), hold_step(facts, pick.branch)):
        assert step.body and bash_ok(step.body)


def test_every_template_is_covered() -> None:
    shipped = {f"{d.name}/{p.name}" for d in templates_dir().iterdir() if d.is_dir()
               for p in d.iterdir() if p.suffix in (".j2", ".py")}
    assert shipped == {"facts/facts.sh.j2", "remote/step.sh.j2", "remote/_journal.sh.j2", "jobs/_follow.sh.j2", "remote/foreground.sh.j2", "setup/conda.sh.j2", "setup/env.sh.j2", "setup/view.sh.j2", "setup/torch.sh.j2",
                       "setup/packages.sh.j2", "setup/_pip_bootstrap.sh.j2", "setup/validate.sh.j2", "gpu/validate_gpu.py", "setup/driver.sh.j2",
                       "setup/driver_hold.sh.j2", "setup/_first_mirror.sh.j2", "setup/secrets.sh.j2",
                       # the plan's probe of the mirrors: tests/unit/test_mirror_rule.py
                       "setup/mirror_probe.sh.j2",
                       "setup/secrets_forget.sh.j2", "gpu/bench.sh.j2", "gpu/bench_gpu.py",
                       # the GPU payload (tests/unit/test_validate_measure.py runs it)
                       "gpu/_payload.sh.j2", "gpu/gpu_smi.py", "gpu/gpu_verdict.py", "gpu/gpu_verdict_multi.py", "gpu/nccl_check.py", "setup/_install.sh.j2",
                       # (and tests/unit/test_validate_truth.py, test_verdict_properties.py, test_gpu_names.py)
                       "gpu/gpu_figures.py", "gpu/gpu_names.py", "gpu/gpu_verdict_health.py",
                       "gpu/gpu_verdict_speed.py", "gpu/gpu_verdict_sustained.py", "gpu/precision.py",
                       "gpu/sustained.py", "gpu/xid.py",
                       # the GPUs' health through a job: tests/unit/test_job_health.py
                       "jobs/_health.sh.j2", "jobs/job_health.sh.j2",
                       # report: tests/unit/test_report.py
                       "gpu/report.sh.j2",
                       "setup/_pkg_wait.sh.j2", "setup/_el_repos.sh.j2", "setup/_debian_components.sh.j2",
                       # jobs (rendered and run in tests/unit/test_jobs_scripts.py)
                       "jobs/follow.sh.j2", "jobs/_jobs.sh.j2", "jobs/job_launch.sh.j2", "jobs/job_wrapper.sh.j2",
                       "jobs/job_kill.sh.j2", "jobs/job_where.sh.j2", "jobs/jobs_list.sh.j2",
                       "jobs/watch_sampler.sh.j2",
                       # the queue: tests/unit/test_queue.py, tests/sandbox/test_queue.py
                       "jobs/_queue.sh.j2", "jobs/queue_runner.sh.j2", "jobs/queue_ctl.sh.j2",
                       "setup/fabricmanager.sh.j2",
                       # data and money: tests/unit/test_sync.py, test_autostop.py
                       "sync/sync_list.sh.j2", "sync/sync_host.sh.j2", "sync/sync_watch.sh.j2",
                       "money/autostop_watchdog.sh.j2", "money/autostop_ctl.sh.j2", "money/idle_probe.sh.j2",
                       "money/_env.sh.j2", "money/_save.sh.j2", "money/_busy.sh.j2",
                       "money/_preempt.sh.j2", "money/notify.sh.j2",
                       # fit --measure: tests/unit/test_fit_measure.py
                       "fit/measure.sh.j2", "fit/measure_run.py", "fit/measure_hook.py",
                       # as root: tests/unit/test_as_root.py, tests/sandbox/test_logins.py
                       "remote/_as_root.sh.j2", "remote/as_root.sh.j2",
                       # a step's disk: in the conda, env, torch and packages steps
                       "setup/_space.sh.j2",
                       # cancel: run with bash in tests/unit/test_step_runtime.py
                       "remote/cancel.sh.j2",
                       # the login block and shell: tests/unit/test_access.py
                       "setup/_login.sh.j2", "setup/login_forget.sh.j2", "access/shell.sh.j2",
                       # a recipe's tools (ollama): tests/unit/test_tool_script.py
                       "setup/tool.sh.j2", "setup/_fetch.sh.j2",
                       # Ctrl-C where sshd ignores signal requests: tests/sandbox/test_hands.py
                       "access/shell_signal.sh.j2"}


def test_bench_script_renders_and_runs_without_torch(cpu_host: HostFacts, http_servers: tuple[str, str],
                                                     tmp_path: Path) -> None:
    """The bench step renders to valid bash; bench_gpu.py's torch-free parts (disk, CPU score,
    downloads, a hung mirror bounded) run here under the real interpreter."""
    from provision.ops.layout import Layout
    from provision.ops.validate import bench_step
    target = load_inventory(Path("inventories/example-4090.yaml"))
    settings = settings_for(target, None, {})
    step = bench_step(cpu_host, Layout("/opt/conda", "gpu", False), settings, None, download_mb=1)
    assert step.body and bash_ok(step.body) and "BENCH_JSON" not in step.reason
    web, hung = http_servers
    (tmp_path / "good" / "pip" / "pip-24.0.tar.gz").write_bytes(b"x" * 3_000_000)
    (tmp_path / "good" / "pip" / "index.html").write_text('<a href="pip-24.0.tar.gz">pip</a>')
    (tmp_path / "data").mkdir()
    config = {"data_dir": str(tmp_path / "data"), "download_mb": 1, "download_timeout": 2,
              "mirrors": [{"kind": "pypi", "url": f"{web}/good/pip/"},
                          {"kind": "pytorch", "url": f"{hung}/cpu/torch/"}]}
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # a python without torch
    r = subprocess.run(["python3", str(templates_dir() / "gpu/bench_gpu.py"), json.dumps(config)],
                       capture_output=True, text=True, timeout=120, env=env)
    out = json.loads(r.stdout)  # the script's one line
    assert out["disk_write_mbs"] > 0 and out["disk_read_mbs"] > 0 and out["cpu_single_score"] > 0
    assert out["disk_path"] == str(tmp_path / "data") and not list((tmp_path / "data").iterdir())
    good, bad = out["downloads"]
    assert good["url"] == f"{web}/good/pip/pip-24.0.tar.gz" and good["mb"] == 1.0 and good["mbs"] > 0
    assert bad["mbs"] is None and "timed out" in bad["error"]
    assert any("import torch failed" in n for n in out["notes"]) and out["train_samples_s"] is None


HOSTILE = ["; rm -rf / #", "$(touch PWNED)", "`touch PWNED`", "it's \"quoted\"", "two\nlines",
           "spaces  and\ttabs", "ünïcödé ✓ 令牌", "\\back\\slash $HOME ${PATH} !!", "-n"]


def test_facts_script_reads_hostile_paths_as_data(tmp_path: Path) -> None:
    """Data dirs and platform marker files reach the probes as values, never as code."""
    odd = [tmp_path / v.replace("/", "_").replace("\n", "_") for v in HOSTILE]
    for d in odd:
        d.mkdir()
    marker = Platform(name="odd", detect=Detect(files=(str(odd[1]), str(odd[3]))))
    r = subprocess.run(["bash", "-c", facts_script((marker,), tuple(map(str, odd)))],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    probes = json.loads(r.stdout)["probes"]
    assert [d.path for d in parse_df(probes["disk"]["out"])[1:]] == \
        [str(d) for d in odd]
    assert probes["platform_markers"]["out"].splitlines() == [str(odd[1]), str(odd[3])]
    assert not list(tmp_path.rglob("PWNED"))


def test_pushed_tokens_round_trip_exactly_and_are_forgotten(cpu_host: HostFacts, tmp_path: Path) -> None:
    """Hostile token values go in on stdin, come back byte for byte from the 0600 file, run
    nothing, and `forget` removes the file and the .bashrc line."""
    from provision.ops.secrets import forget_secrets_step, read_forgotten, secrets_step
    values = {f"TOKEN_{i}": v for i, v in enumerate(HOSTILE)}
    step = secrets_step(cpu_host, values, "d1gest")
    assert step.stdin is not None and step.body is not None
    assert not any(v in step.body for v in HOSTILE)  # values never in the script (argv)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("alias ll='ls -l'\n")
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    for _ in range(2):  # idempotent: one .bashrc line however often it runs
        r = subprocess.run(["bash", "-c", step.body], input=step.stdin, capture_output=True,
                           text=True, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    names = " ".join(sorted(values))
    assert r.stdout == f"pushed {names} into ~/.gpu-provision/env (mode 0600)\n"
    f = home / ".gpu-provision" / "env"
    assert f.stat().st_mode & 0o777 == 0o600
    assert (home / ".bashrc").read_text().count("gpu-provision tokens") == 1
    dump = "; ".join(f'printf "%s\\0" "${k}"' for k in values)
    r = subprocess.run(["bash", "-ic", dump], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.stdout.split("\0")[:-1] == list(values.values())
    assert not list(tmp_path.rglob("PWNED"))
    journal = json.loads((home / ".gpu-provision" / "steps" / "secrets.json").read_text())
    assert (journal["inputs"], journal["result"]) == ("d1gest", "ok")

    forget = forget_secrets_step()
    assert forget.body is not None and forget.foreground
    r = subprocess.run(["bash", "-c", foreground_script(forget.name, forget.body)],
                       capture_output=True, text=True, env=env)
    log, line = split_result(r.stdout)
    assert r.returncode == 0 and log == "" and line is not None
    assert forget.read(line["result"]) == read_forgotten({"forgotten": names})
    assert forget.read(line["result"]).data == names
    assert not f.exists() and not (home / ".gpu-provision" / "steps" / "secrets.json").exists()
    assert (home / ".bashrc").read_text() == "alias ll='ls -l'\n"


@pytest.fixture
def http_servers(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A loopback web server holding ``good/pip/`` (else 404), and a port that accepts TCP and
    never answers (a hung mirror)."""
    (tmp_path / "good" / "pip").mkdir(parents=True)
    (tmp_path / "good" / "pip" / "index.html").write_text("<a>pip-24.0.tar.gz</a>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)
    yield f"http://127.0.0.1:{web.server_address[1]}", f"http://127.0.0.1:{hung.getsockname()[1]}"
    web.shutdown()
    hung.close()


def _first_mirror(*urls: str) -> subprocess.CompletedProcess[str]:
    script = render("setup/_first_mirror.sh.j2", mirror_timeout=2) + \
        "first_mirror pypi pip/ " + " ".join(quote(u) for u in urls) + "\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def test_first_mirror_passes_over_a_404_and_a_hang(http_servers: tuple[str, str]) -> None:
    web, hung = http_servers
    r = _first_mirror(f"{web}/missing", hung, f"{web}/good/")
    assert r.returncode == 0 and r.stdout == f"{web}/good\n"
    assert f"mirror {web}/missing (pypi) failed: HTTP 404; trying the next" in r.stderr
    assert f"mirror {hung} (pypi) failed: no answer within 2s; trying the next" in r.stderr


def test_first_mirror_names_every_url_when_none_answers(http_servers: tuple[str, str]) -> None:
    web, hung = http_servers
    r = _first_mirror(f"{web}/missing", hung)
    assert r.returncode == 4 and r.stdout == ""
    assert (f"no pypi mirror answered: {web}/missing (HTTP 404); {hung} (no answer within 2s); "
            "set mirrors.pypi in the inventory or platform to one that works") in r.stderr


def test_hostile_data_dir_is_quoted(tmp_path: Path) -> None:
    evil = str(tmp_path / "x'; touch PWNED; echo '")
    script = facts_script(all_platforms(), (evil,))
    subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, timeout=60)
    assert not (tmp_path / "PWNED").exists()


def test_render_error_names_template_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken.j2").write_text("ok\n{{ missing_value }}\n")
    monkeypatch.setattr("provision.remote.templating.templates_dir", lambda: tmp_path)
    with pytest.raises(ProvisionError, match="template broken.j2: 'missing_value' is undefined"):
        render("broken.j2")
    (tmp_path / "syntax.j2").write_text("a\nb\n{% if %}\n")
    with pytest.raises(ProvisionError, match=r"template syntax.j2:3"):
        render("syntax.j2")


def test_facts_script_reads_a_home_relative_data_dir_in_the_hosts_home(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    r = subprocess.run(["bash", "-c", facts_script((), ("~/data",))], capture_output=True,
                       text=True, timeout=60, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    disks = parse_df(json.loads(r.stdout)["probes"]["disk"]["out"])
    assert [d.path for d in disks] == [str(tmp_path), str(tmp_path / "data")]


def test_no_template_spells_the_state_folder() -> None:
    """The host contract (provision/remote/contract.py) is the one place that names the state
    folder on the host: templates get it as ``host.state`` when rendered, and the GPU payloads
    are told their paths by the step that runs them."""
    spelled = re.compile(r"(?<![\w.])\.gpu-provision(?![\w-])")
    offenders = [f"{d.name}/{p.name}:{n}" for d in templates_dir().iterdir()
                 if d.is_dir() and d.name != "__pycache__"
                 for p in d.iterdir() if p.is_file()
                 for n, line in enumerate(p.read_text().splitlines(), 1) if spelled.search(line)]
    assert offenders == []


def test_the_contract_is_plain_names() -> None:
    """Templates write the contract's names unquoted inside double quotes: each must be a
    plain path of word characters, dots, dashes and slashes."""
    from dataclasses import asdict

    from provision.remote.contract import CONTRACT

    def strings(value: object) -> list[str]:
        return [v for x in value.values() for v in strings(x)] if isinstance(value, dict) \
            else [value] if isinstance(value, str) else []
    names = strings(asdict(CONTRACT))
    assert names and all(re.fullmatch(r"[\w./ :-]+", n) for n in names), names
    from provision.remote.runtime import detached_script
    assert f'state="$HOME/{CONTRACT.state}"' in detached_script("x", "true")
