"""The link's speed between this machine and the host, both ways (bench): a file of random
bytes up and back down over the pinned connection."""

from __future__ import annotations

import os
import posixpath
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import ProvisionError
from ..remote.command import bash_script
from ..remote.contract import shown
from ..remote.executor import Executor, remote_part
from ..remote.templating import render

LINK_PROBE_BYTES = 16 << 20
LINK_PROBE = shown("link-probe")


def measure_link(ex: Executor, size: int = LINK_PROBE_BYTES) -> dict[str, Any]:
    """Up and down MB/s between this machine and the host: ``size`` random bytes each way over
    SFTP (the transport every laptop has), timed without the checks around them."""
    with tempfile.TemporaryDirectory(prefix="gpu-provision-link-") as tmp:
        here = Path(tmp) / "probe"
        here.write_bytes(os.urandom(size))
        there = ex.remote_path(LINK_PROBE)
        started = time.monotonic()
        ex.put_part(here, there, step="link", resume=False)
        up = time.monotonic() - started
        back = Path(tmp) / "back"
        started = time.monotonic()
        ex.get_part(remote_part(there), back, size, step="link", resume=False)
        down = time.monotonic() - started
        ex.run(bash_script(render("sync/sync_host.sh.j2", mode="delete")), step="link", check=False,
               stdin=f"{posixpath.dirname(there)}\0{remote_part(there)}\0")
    return {"up_mbs": round(size / up / 1e6, 2), "down_mbs": round(size / down / 1e6, 2),
            "bytes": size, "transport": "sftp", "source": "bench"}


def bench_link(ex: Executor) -> dict[str, Any]:
    """``measure_link`` for the bench report: a failure is recorded, not raised (the GPU
    figures stand without it)."""
    try:
        return measure_link(ex)
    except ProvisionError as exc:
        return {"up_mbs": None, "down_mbs": None, "error": str(exc).splitlines()[0]}


