"""A mirror that answers and then goes bad mid-file, on the sandbox's real mirror: it stalls
after the first MiB of a wheel (a stuck CDN node) or closes the connection there (a truncated
file). The torch install, the recipe's packages (pip and uv) and the fetch of our uv give it up
after mirrors.timeout without progress, name it, and take the same file from the next listed
mirror; nothing is left half installed, and no installer traceback reaches the user.

And mirrors that answer but do not serve: one that refuses connections, one that answers every
path with a sign-in page, one whose wheels carry the wrong bytes. `plan` names the first two
with what they did and the mirror each download will use; bootstrap passes over all three."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from provision.ops.installer import load_uv
from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness, mirror
from tests.sandbox.mirror import Gate

UV = load_uv()

pytestmark = pytest.mark.sandbox


@pytest.mark.parametrize("mode", ["stall", "truncate"])
def test_a_mirror_that_breaks_mid_file_is_named_and_the_next_one_serves(  # type: ignore[no-untyped-def]
        hosts: Hosts, gp_home: Path, tmp_path: Path, mode: str) -> None:
    gate = Gate(f"bad-{mode}", mode=mode)
    info = hosts.fresh("cpu-only")
    try:
        # (15 s: plan's probe of each mirror has the same bound, and a loaded machine, three
        # test files starting their hosts at once, once made the gate's first answer miss 5 s,
        # so the bad mirror was passed over before any download reached it)
        inv = info.inventory_with_mirrors(tmp_path / "bad.yaml", {
            "pytorch": [gate.url, info.mirror["pytorch"]], "timeout": 15})
        r = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, timeout=900)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert gate.holding(), out  # the first MiB went out from the bad mirror
        log = info.path("/root/.gpu-provision/logs/torch.log").read_text()  # the step's log
        assert (f"mirror {gate.url} stalled or cut a file short (no progress within 15s): giving "
                "it up for this download") in log
        assert "Traceback" not in out + log
        assert log.index(f"--index-url {gate.url}/cpu/") < \
            log.index(f"--index-url {info.mirror['pytorch']}/cpu/")
        f = facts_json(info, gp_home)
        env = next(e for e in f["envs"] if e["name"] == "torch")
        assert env["torch"].startswith("2.13.0")
    finally:
        gate.open()
        harness.stop(info.id)


def given_up_for_the_next(info: harness.HostInfo, r: subprocess.CompletedProcess[str], bad: str,
                          next_: str) -> str:
    """The bootstrap passed; the packages step's log says uv's fetch and pip's download gave
    ``bad`` up after the 5 s timeout and went to ``next_``; the package imports. Returns the
    log."""
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    log = info.path("/root/.gpu-provision/logs/packages.log").read_text()
    assert (f"uv: mirror {bad} stalled or cut {UV.wheels['x86_64'].file} short (no "
            "progress within 5s); trying the next PyPI mirror") in log
    assert (f"mirror {bad} stalled or cut a file short (no progress within 5s): giving "
            "it up for this download") in log
    assert log.index(f"--index-url {bad}/") < log.index(f"--index-url {next_}/")
    assert "Traceback" not in out + log
    assert harness.in_host(info, "/opt/conda/bin/python", "-c",
                           "import pycountry; print(len(pycountry.countries))").stdout.strip()
    return log


def test_pip_stalling_mid_file_in_the_packages_step_goes_to_the_next_pypi_mirror(  # type: ignore[no-untyped-def]
        hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    """The first PyPI mirror stalls mid-file on every wheel: our uv from it (the next mirror has
    no uv, so pip installs) and the recipe's package. Both are given up after mirrors.timeout,
    named, and the package comes from the next mirror."""
    gate = Gate("pypi-stall", mode="stall")
    second = mirror.overlay("no-uv", hide=["uv"])
    info = hosts.fresh("image-conda")
    try:
        inv = info.inventory_with_mirrors(tmp_path / "bad.yaml", {
            "pypi": [gate.pypi, second], "timeout": 5}, packages=["pycountry"])
        r = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, timeout=900)
        log = given_up_for_the_next(info, r, gate.pypi, second)
        assert gate.holding()
        assert f"installer: pip, as uv {UV.version} cannot be had: mirror {gate.pypi} stalled" \
            in log
    finally:
        gate.open()
        harness.stop(info.id)


def test_a_truncated_uv_and_package_are_taken_from_the_next_pypi_mirror(  # type: ignore[no-untyped-def]
        hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    """The first PyPI mirror cuts every wheel short: our uv is fetched whole from the next one
    (its sha256 checked) and installs the recipe's package from there after the first mirror
    cut it short too."""
    gate = Gate("pypi-truncate", mode="truncate")
    info = hosts.fresh("image-conda")
    good = info.mirror["pypi"]
    try:
        inv = info.inventory_with_mirrors(tmp_path / "bad.yaml", {
            "pypi": [gate.pypi, good], "timeout": 5}, packages=["pycountry"])
        r = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, timeout=900)
        log = given_up_for_the_next(info, r, gate.pypi, good)
        assert f"installer: uv {UV.version}, fetched into" in log
        assert f"sha256 ok: {UV.wheels['x86_64'].sha256}" in log
    finally:
        gate.open()
        harness.stop(info.id)


def test_mirrors_that_answer_but_do_not_serve_are_named_and_passed_over(  # type: ignore[no-untyped-def]
        hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    info = hosts.fresh("cpu-only")
    m, refused = info.mirror, mirror.refused_url()
    tampered = f"{m['pytorch_tampered']}/cpu"
    signed = 'not an index: text/html "Please sign in to use this network Sign..."'
    try:
        inv = info.inventory_with_mirrors(tmp_path / "lying.yaml", {
            "miniconda": [refused, m["miniconda"]], "pytorch": [m["pytorch_tampered"], m["pytorch"]],
            "pypi": [m["signin"], m["pypi"]], "timeout": 5}, packages=["pycountry"])
        r = gpu_provision("-H", inv, "plan", "--json", home=gp_home, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        probed = {d["kind"]: (d["used"], [(x["url"], x["answer"]) for x in d["mirrors"]])
                  for d in json.loads(r.stdout)["mirrors"]}
        assert probed == {
            "miniconda": (m["miniconda"], [(refused, "refused"), (m["miniconda"], "ok")]),
            # wrong bytes under a genuine index: only the download can tell
            "pytorch": (tampered, [(tampered, "ok"), (f"{m['pytorch']}/cpu", "ok")]),
            "pypi": (m["pypi"], [(m["signin"], signed), (m["pypi"], "ok")])}
        text = gpu_provision("-H", inv, "plan", home=gp_home, cwd=tmp_path).stdout
        assert "refused" in text and "Please sign in" in text

        r = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, timeout=900)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        logs = info.path("/root/.gpu-provision/logs")
        conda = (logs / "conda.log").read_text()
        assert f"mirror {refused} (miniconda) failed: refused; trying the next" in conda
        assert f"mirror {m['signin']} (pypi) failed: {signed}; trying the next" in conda
        torch = (logs / "torch.log").read_text()
        assert "Hash mismatch for" in torch or "DO NOT MATCH THE HASHES" in torch  # uv's, pip's
        assert (f"mirror {m['pytorch_tampered']} (pytorch) failed: hash mismatch; giving it up "
                "for this download") in torch
        assert torch.index(f"--index-url {tampered}/") < \
            torch.index(f"--index-url {m['pytorch']}/cpu/")
        packages = (logs / "packages.log").read_text()
        assert f"--index-url {m['signin']}/" not in packages  # passed over before any install
        assert "Traceback" not in out + torch + packages
        env = next(e for e in facts_json(info, gp_home)["envs"] if e["name"] == "torch")
        assert env["torch"].startswith("2.13.0")
    finally:
        harness.stop(info.id)
