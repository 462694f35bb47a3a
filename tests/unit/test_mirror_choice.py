"""Choose from what the mirror serves: the index pages (PEP 691 JSON, PEP 503 HTML), the cache
the torch step leaves on the host, the plan's choice and lag note from it, the torch body itself
against a local index, and the fix an install failure carries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import venv
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from provision.config.inventory import Target, settings_for
from provision.config.recipes import load_platform
from provision.doctor.match import diagnose
from provision.facts.host import HostFacts
from provision.facts.torchindex import parse_index_cache
from provision.ops.installer import load_uv
from provision.ops.torch import read_torch
from provision.setup.plan import Plan, make_plan
from provision.wheels import simpleindex as si
from tests.cases import captured

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
CPU = "cp311-cp311-manylinux_2_28_x86_64"


def test_html_and_json_pages_give_the_same_files() -> None:
    html = ('<html><body><a href="/f/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl#'
            'sha256=00">torch-2.13.0+cpu</a></body></html>')
    js = json.dumps({"meta": {"api-version": "1.0"}, "name": "torch", "files": [
        {"filename": "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "url": "x"}]})
    want = ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"]
    assert si.file_names(html, "text/html") == want
    assert si.file_names(js, si.PEP691) == want


def test_served_keeps_final_linux_builds_of_the_variant() -> None:
    files = [f"torch-2.14.1+cpu-{CPU}.whl", "torch-2.14.1+cpu-cp313-cp313t-manylinux_2_28_x86_64.whl",
             f"torch-2.15.0rc1+cpu-{CPU}.whl", "torch-2.14.1+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
             "torch-2.14.1+cpu-cp311-cp311-win_amd64.whl",
             "torch-2.14.1+cpu-cp311-cp311-manylinux_2_28_aarch64.whl",
             f"torch-2.13.0-{CPU}.whl", f"torchvision-0.29.1+cpu-{CPU}.whl"]
    assert si.served(files, "torch", "cpu", "x86_64") == {"2.14.1": ["cp311"], "2.13.0": ["cp311"]}
    assert si.served(files, "torch", "cpu", "aarch64") == {"2.14.1": ["cp311"]}


def _cands(*labels: str, tv: str | None = None) -> list[dict[str, object]]:
    return [{"torch": lab.split("+")[0], "variant": lab.split("+")[1], "torchvision": tv,
             "torchaudio": None} for lab in labels]


def _entry(variant: str, pages: dict[str, list[str] | None], at: float = 1000.0) -> dict[str, object]:
    return si.entry("http://m/whl", variant, pages, "x86_64", at)


def test_pick_takes_the_newest_served_and_names_the_lag() -> None:
    e = _entry("cpu", {"torch": [f"torch-2.13.0+cpu-{CPU}.whl"]})
    rc, cand, note = si.pick(_cands("2.14.1+cpu", "2.14.0+cpu", "2.13.0+cpu"), [e], "cp311")
    assert rc == 0 and cand is not None and cand["torch"] == "2.13.0"
    assert cand["index"] == "http://m/whl/cpu"
    assert note == "mirror http://m/whl has no 2.14.1+cpu; newest there 2.13.0 (for python 3.11)"
    rc, cand, note = si.pick(_cands("2.13.0+cpu"), [e], "cp311")
    assert (rc, note) == (0, "")  # the best is served: nothing to say


def test_pick_needs_the_companions_and_says_which_is_missing() -> None:
    e = _entry("cu130", {"torch": [f"torch-2.14.1+cu130-{CPU}.whl", f"torch-2.14.0+cu130-{CPU}.whl"],
                         "torchvision": [f"torchvision-0.29.0+cu130-{CPU}.whl"]})
    cands = [{"torch": "2.14.1", "variant": "cu130", "torchvision": "0.29.1", "torchaudio": None},
             {"torch": "2.14.0", "variant": "cu130", "torchvision": "0.29.0", "torchaudio": None}]
    rc, cand, note = si.pick(cands, [e], "cp311")
    assert rc == 0 and cand is not None and cand["torch"] == "2.14.0"
    assert note.startswith("mirror http://m/whl has no 2.14.1+cu130 with torchvision 0.29.1; ")


def test_a_mirror_with_torch_but_not_its_torchvision_says_exactly_that() -> None:
    """Not "serves none of the torch releases": torch is there, its companion is not."""
    e = _entry("cpu", {"torch": [f"torch-2.13.0+cpu-{CPU}.whl"], "torchvision": []})
    cands = [{"torch": "2.13.0", "variant": "cpu", "torchvision": "0.28.0", "torchaudio": None}]
    rc, cand, why = si.pick(cands, [e], "cp311")
    assert (rc, cand) == (si.NONE_SERVED, None)
    assert why == ("mirror http://m/whl has torch 2.13.0+cpu but no torchvision for it: list "
                   "another mirror first, or set domain_libraries: false")


def test_pick_stops_at_a_variant_not_read_and_says_when_none_is_served() -> None:
    cpu = _entry("cpu", {"torch": []})
    cands = _cands("2.14.1+cu130", "2.14.1+cu126")
    rc, cand, _ = si.pick(cands, [_entry("cu130", {"torch": []})], "cp311")
    assert rc == si.NEED_MORE and cand is not None and cand["variant"] == "cu126"
    rc, cand, why = si.pick(_cands("2.14.1+cpu", "1.11.0+cpu"), [cpu], "cp311")
    assert (rc, cand) == (si.NONE_SERVED, None)
    assert why == ("the PyTorch mirror http://m/whl serves none of the torch releases the rule "
                   "allows for python 3.11 (2.14.1+cpu .. 1.11.0+cpu); newest there: cpu: none")


def _cache_line(variant: str, versions: list[str], at: float) -> str:
    e = _entry(variant, {"torch": [f"torch-{v}+{variant}-{CPU}.whl" for v in versions]}, at)
    return json.dumps(e)


def test_the_facts_read_the_cache_back() -> None:
    [c] = parse_index_cache(_cache_line("cpu", ["2.13.0"], 50) + "\n{half a line")
    assert (c.base, c.variant, c.at, c.read) == ("http://m/whl", "cpu", 50.0, ("torch",))
    assert c.served == {"torch": {"2.13.0": ("cp311",)}}


def _plan(facts: HostFacts, mirror: str = "http://m/whl", **cli: str) -> Plan:
    settings = settings_for(Target(name="box", host="h", settings={
        "domain_libraries": False, "mirrors": {"pytorch": mirror}}), None, cli)
    return make_plan("box", facts, settings, load_platform(settings.platform))


def _torch(plan: Plan) -> tuple[str | None, str]:
    d = next(d for d in plan.decisions if d.step == "torch")
    return d.action, d.reason


def test_before_the_mirror_was_read_the_step_confirms_the_newest() -> None:
    action, reason = _torch(_plan(captured("cpu-only")))
    assert action == "install torch 2.14.1+cpu"
    assert reason.endswith("the step confirms torch 2.14.1+cpu against the mirror (http://m/whl) "
                           "before installing")


def test_after_a_read_the_plan_chooses_what_the_mirror_serves_and_names_the_lag() -> None:
    fresh = captured("cpu-only")
    cached = captured("cpu-only", {"torch_index": _cache_line("cpu", ["2.13.0"], fresh.now - 180)})
    action, reason = _torch(_plan(cached))
    assert action == "install torch 2.13.0+cpu"
    assert reason.endswith("mirror http://m/whl has no 2.14.1+cpu; newest there 2.13.0 (for "
                           "python 3.11) (read 3 min ago)")
    # the step gets every allowed candidate either way: its inputs (what re-attaching compares)
    # do not depend on what was cached
    steps = {s.name: s for s in _plan(fresh).steps}
    assert {s.name: s for s in _plan(cached).steps}["torch"].inputs == steps["torch"].inputs
    # another mirror's answer is not this mirror's
    assert _torch(_plan(cached, mirror="http://other/whl"))[0] == "install torch 2.14.1+cpu"


def test_each_step_that_reaches_a_mirror_gives_it_the_timeout_set() -> None:
    """mirrors.timeout (10 s unless set) bounds every mirror's answer in the conda, torch and
    packages scripts; a slow link raises it in the inventory."""
    def bodies(**mirrors: object) -> dict[str, str]:
        settings = settings_for(Target(name="box", host="h", settings={
            "packages": ["numpy"], "mirrors": {"pytorch": "http://m/whl", **mirrors}}), None)
        plan = make_plan("box", captured("cpu-only"), settings, load_platform(settings.platform))
        return {s.name: s.body for s in plan.steps if s.name in ("conda", "torch", "packages")}
    default, slow = bodies(), bodies(timeout=45)
    assert sorted(slow) == ["conda", "packages", "torch"]
    for name, body in slow.items():
        assert "--connect-timeout 45" in body and "--connect-timeout 10" not in body, name
        assert "--connect-timeout 10" in default[name], name


def test_once_installed_the_replan_has_nothing_left_to_do() -> None:
    done = captured("cpu-only-bootstrapped")
    after = captured("cpu-only-bootstrapped", {"torch_index": _cache_line("cpu", ["2.13.0"],
                                                                          done.now)})
    plan = _plan(after)
    action, reason = _torch(plan)
    assert action is None
    assert reason == ("torch 2.13.0+cpu already installed; mirror http://m/whl has no 2.14.1+cpu; "
                      "newest there 2.13.0 (for python 3.11) (read 0 min ago)")
    assert plan.torch is not None and plan.torch.label == "torch 2.13.0+cpu"


def test_the_step_accepts_any_allowed_build_and_nothing_else() -> None:
    step = next(s for s in _plan(captured("cpu-only")).steps if s.name == "torch")
    assert step.read({"version": "2.13.0+cpu", "cuda": None}).data["version"] == "2.13.0+cpu"
    from provision.errors import ProvisionError
    with pytest.raises(ProvisionError, match="none of the builds the rule allows"):
        step.read({"version": "2.15.0+cpu", "cuda": None})
    assert read_torch  # the step's reader is the module's


# -- the torch body against a local index ----------------------------------------------------

@pytest.fixture()
def index(tmp_path: Path) -> Iterator[str]:
    """cpu as PEP 503 HTML with only torch 2.13.0 (a mirror that lags); cu130 as PEP 691 JSON
    (2.14.1) to a client that asks for it, else HTML (2.14.0); no cu126 at all. Each anchor's text
    is its file's name, as PEP 503 requires (the mirror rule tells an index by it)."""
    (tmp_path / "whl/cpu/torch").mkdir(parents=True)
    (tmp_path / "whl/cpu/torch/index.html").write_text(
        f'<a href="/nowhere/torch-2.13.0%2Bcpu-{CPU}.whl">torch-2.13.0+cpu-{CPU}.whl</a>')
    (tmp_path / "whl/cu130/torch").mkdir(parents=True)  # its HTML lags behind its JSON
    (tmp_path / "whl/cu130/torch/index.html").write_text(
        f'<a href="/nowhere/torch-2.14.0%2Bcu130-{CPU}.whl">torch-2.14.0+cu130-{CPU}.whl</a>')
    files = [{"filename": f"torch-2.14.1+cu130-{CPU}.whl", "url": "/nowhere/x.whl"}]

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *a: object, **k: object) -> None:
            super().__init__(*a, directory=str(tmp_path), **k)  # type: ignore[arg-type]

        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.startswith("/whl/cu130/torch/") and si.PEP691 in self.headers["Accept"]:
                body = json.dumps({"meta": {"api-version": "1.0"}, "files": files}).encode()
                self.send_response(200)
                self.send_header("Content-Type", si.PEP691)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/whl"
    srv.shutdown()


def _body(tmp_path: Path, base: str, facts: HostFacts, **cli: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the torch body here with a Python that has no pip: it reads the index, writes the
    cache and prints what it will install, then stops where pip would start (the PyPI mirror,
    this index's server, has no uv, so the install falls to pip: nothing leaves this machine)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env_dir = tmp_path / "env"
    if not env_dir.exists():
        venv.EnvBuilder(with_pip=False).create(env_dir)
    settings = settings_for(Target(name="box", host="h", settings={
        "domain_libraries": False,
        "mirrors": {"pytorch": [f"{base}-down", base], "pypi": [f"{base}-pypi"]}}), None, cli)
    plan = make_plan("box", facts, settings, load_platform(settings.platform))
    step = next(s for s in plan.steps if s.name == "torch")
    assert step.body is not None
    body = step.body.replace("/root/miniconda3/envs/torch/bin/python", str(env_dir / "bin/python"))
    r = subprocess.run(["bash", "-c", body], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HOME": str(home), "RESULT": str(tmp_path / "result")})
    return r, home / ".gpu-provision/index"


def test_the_body_installs_the_newest_the_mirror_serves(tmp_path: Path, index: str) -> None:
    r, cache = _body(tmp_path, index, captured("cpu-only"))
    assert f"mirror {index}-down/cpu (pytorch) failed: HTTP 404; trying the next" in r.stderr
    assert (f"mirror {index} has no 2.14.1+cpu; newest there 2.13.0 (for python "
            f"{sys.version_info[0]}.{sys.version_info[1]}): installing 2.13.0 instead") in r.stdout
    assert f"pip install torch==2.13.0 --index-url {index}/cpu/" in r.stdout
    # where pip would install (its output goes to the log with the rest: stdout here)
    assert "No module named pip" in r.stdout and r.returncode == 1
    assert f"installer: pip, as uv {load_uv().version} cannot be had: no PyPI mirror has it: " \
        f"{index}-pypi (HTTP 404);" in r.stdout
    [line] = [p.read_text() for p in cache.glob("*.json")]
    [cached] = parse_index_cache(line)
    assert (cached.url, cached.served["torch"]) == (f"{index}/cpu/", {"2.13.0": ("cp311",)})


def test_the_body_reads_json_and_skips_a_variant_no_mirror_has(tmp_path: Path, index: str) -> None:
    gpu = captured("h200", {"envs": ""})
    r, cache = _body(tmp_path, index, gpu)
    assert "pip install torch==2.14.1 --index-url " + index + "/cu130/" in r.stdout
    assert r.returncode == 1
    # 2.14.1+cu130 is served: cu126 (the next candidate's) was never read
    assert [parse_index_cache(p.read_text())[0].variant for p in cache.glob("*.json")] == ["cu130"]
    none, _ = _body(tmp_path, index, gpu, torch="2.12")
    assert none.returncode == 5
    assert "serves none of the torch releases the rule allows" in none.stderr
    assert "no listed mirror has the cu126 index" in none.stdout


# -- the fix an install failure carries -----------------------------------------------------

@pytest.mark.parametrize("text,entry", [
    ("ERROR: Could not find a version that satisfies the requirement torch==2.14.1 (from "
     "versions: 2.13.0+cpu)\nERROR: No matching distribution found for torch==2.14.1\n",
     "pip-no-matching-distribution"),
    ((FIX / "errors/install/pip-resolution-impossible-torchvision-lora-scripts-375.txt").read_text(),
     "pip-resolution-impossible"),
    ("\nPackagesNotFoundError: The following packages are not available from current channels:"
     "\n\n  - python=3.10\n\n(the test installer provides python 3.11 only)\n",
     "conda-python-not-found"),
    ("the PyTorch mirror http://m/whl serves none of the torch releases the rule allows for "
     "python 3.11 (2.14.1+cpu .. 1.11.0+cpu); newest there: cpu: none", "torch-mirror-lacks"),
])
def test_install_failures_carry_a_filled_fix(text: str, entry: str) -> None:
    [f] = [f for f in diagnose({"step torch": text}) if f.level == "error"][:1]
    assert f.id == entry
    assert f.fix.strip() and "{" not in f.fix + f.diagnosis


def test_the_body_says_so_when_no_mirror_answers_at_all(tmp_path: Path, index: str) -> None:
    gone = f"{index}-gone"
    r, cache = _body(tmp_path, gone, captured("cpu-only"))
    assert r.returncode == 4
    assert (f"no pytorch mirror answered: {gone}-down/cpu (HTTP 404); {gone}/cpu (HTTP 404); set "
            "mirrors.pytorch") in r.stderr
    assert "serves none" not in r.stderr
    assert not list(cache.glob("*.json"))  # nothing answered: nothing for the plan to believe
