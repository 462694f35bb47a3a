"""A PyTorch mirror that answers and then goes bad mid-file, on the sandbox's real mirror: it
stalls after the first MiB of the torch wheel (a stuck CDN node) or closes the connection there
(a truncated file). The install gives it up after mirrors.timeout without progress, names it,
and takes the same build from the next listed mirror; nothing is left half installed, and no
installer traceback reaches the user."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Hosts, facts_json, gpu_provision
from tests.sandbox import harness
from tests.sandbox.mirror import Gate

pytestmark = pytest.mark.sandbox


@pytest.mark.parametrize("mode", ["stall", "truncate"])
def test_a_mirror_that_breaks_mid_file_is_named_and_the_next_one_serves(  # type: ignore[no-untyped-def]
        hosts: Hosts, gp_home: Path, tmp_path: Path, mode: str) -> None:
    gate = Gate(f"bad-{mode}", mode=mode)
    info = hosts.fresh("cpu-only")
    try:
        inv = info.inventory_with_mirrors(tmp_path / "bad.yaml", {
            "pytorch": [gate.url, info.mirror["pytorch"]], "timeout": 5})
        r = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, timeout=900)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert gate.holding()  # the first MiB went out from the bad mirror
        log = info.path("/root/.gpu-provision/logs/torch.log").read_text()  # the step's log
        assert (f"mirror {gate.url} stalled or cut a file short (no progress within 5s): giving "
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
