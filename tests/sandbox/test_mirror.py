"""The local mirror serves what provisioning downloads, and pip really installs torch from it."""

from __future__ import annotations

import hashlib
import re
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import Hosts, facts_json
from tests.sandbox.mirror import INSTALLER
from tests.sandbox.remote import ssh

pytestmark = pytest.mark.sandbox


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()  # type: ignore[no-any-return]


def test_miniconda_index_publishes_sha256(hosts: Hosts) -> None:
    mirror = hosts.get("cpu-only").mirror
    page = get(mirror["miniconda"] + "/").decode()
    row = re.search(rf'<a href="{re.escape(INSTALLER)}">.*?</td><td>(\d+)</td>.*?'
                    r'<td>([0-9a-f]{64})</td>', page)
    assert row, page[:500]
    body = get(f"{mirror['miniconda']}/{INSTALLER}")
    assert hashlib.sha256(body).hexdigest() == row.group(2)
    assert len(body) == int(row.group(1))
    assert body.startswith(b"#!/bin/bash") and b"stands in for the" in body


def test_pytorch_indexes_are_pep503(hosts: Hosts) -> None:
    mirror = hosts.get("cpu-only").mirror
    cpu = get(f"{mirror['pytorch']}/cpu/torch/").decode()
    assert re.search(r'href="/files/links/torch-2\.13\.0\+cpu-cp311-cp311-manylinux_2_28_x86_64'
                     r'\.whl#sha256=[0-9a-f]{64}"', cpu), cpu
    cu130 = get(f"{mirror['pytorch']}/cu130/torch/").decode()
    assert "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl" in cu130
    assert "torch-2.13" not in cu130  # a variant index holds only its own build
    assert "torchvision-0.29.1-" in get(f"{mirror['pytorch']}/cu130/torchvision/").decode()
    assert "nvidia_cublas" in get(f"{mirror['pytorch']}/cu130/nvidia-cublas/").decode().replace("-", "_")
    assert "filelock" in get(f"{mirror['pypi']}/filelock/").decode()


def test_unknown_variant_is_404(hosts: Hosts) -> None:
    mirror = hosts.get("cpu-only").mirror
    with pytest.raises(urllib.error.HTTPError) as err:
        get(f"{mirror['pytorch']}/cu999/torch/")
    assert err.value.code == 404


def test_installer_conda_env_and_real_torch_on_a_host(hosts: Hosts, gp_home: Path) -> None:
    """The whole download path on a sandbox host: installer, conda env, pip install torch."""
    info = hosts.fresh("cpu-only")
    try:
        m = info.mirror
        rc, out = ssh(info, f"curl -fsSL -o /tmp/mc.sh {m['miniconda']}/{INSTALLER} && "
                            "bash /tmp/mc.sh -b -p /root/miniconda3")
        assert rc == 0, out
        rc, out = ssh(info, "bash /tmp/mc.sh -b -p /root/miniconda3")
        assert rc == 1 and "already exists" in out  # like the real installer
        rc, out = ssh(info, "/root/miniconda3/bin/conda create -n t python=3.11 -y")
        assert rc == 0, out
        rc, out = ssh(info, "/root/miniconda3/bin/conda create -n old python=3.8 -y")
        assert rc == 1 and "PackagesNotFoundError" in out
        rc, out = ssh(info, "/root/miniconda3/bin/conda run -n t pip install --no-cache-dir -q "
                            f"--index-url {m['pytorch']}/cpu/ torch==2.13.0", timeout=900)
        assert rc == 0, out
        rc, out = ssh(info, "/root/miniconda3/bin/conda run -n t python -c "
                            "'import torch; print(torch.__version__, torch.version.cuda, "
                            "torch.cuda.is_available(), (torch.ones(2, 2) @ torch.ones(2, 2)).sum().item())'")
        assert rc == 0 and out.splitlines()[-1].split() == ["2.13.0+cpu", "None", "False", "8.0"], out
        # the install went into the host's own overlay, not onto this machine
        site = info.path("/root/miniconda3/envs/t/lib/python3.11/site-packages/torch")
        assert site.is_dir()
        # and facts (one execution, no Python started) sees the env and its torch build
        f = facts_json(info, gp_home)
        assert f["conda"] == ["/root/miniconda3/bin/conda"]
        envs = {e["name"]: (e["python"], e["torch"], e["torch_cuda"]) for e in f["envs"]}
        assert envs == {"base": ("3.11", None, None), "t": ("3.11", "2.13.0+cpu", None)}
    finally:
        from tests.sandbox import harness
        harness.stop(info.id)


def test_wheels_carry_their_core_metadata(hosts: Hosts) -> None:
    """PEP 658/714, as PyPI and download.pytorch.org serve it: a resolver reads torch's
    dependencies from <wheel URL>.metadata without downloading the wheel."""
    mirror = hosts.get("cpu-only").mirror
    page = get(f"{mirror['pytorch']}/cpu/torch/").decode()
    m = re.search(r'href="([^"#]+)#sha256=[0-9a-f]{64}" data-core-metadata="sha256=([0-9a-f]{64})">'
                  r'torch-2\.13\.0\+cpu-', page)
    assert m, page
    meta = get(mirror["url"] + m.group(1) + ".metadata")
    assert hashlib.sha256(meta).hexdigest() == m.group(2)
    assert b"Name: torch\n" in meta and b"Version: 2.13.0+cpu\n" in meta
    assert b"Requires-Dist: filelock" in meta
