"""The multi-host summary names each host as the user wrote it (inventory name, or
user@host:port), never root@<an inventory's path>, and the error cell does not repeat the host."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from provision.cli.fanout import HostResult, label, summary
from provision.errors import RemoteError, SSHError
from provision.ui import console as output


def ctx(spec: str) -> SimpleNamespace:
    """What Fabric makes of one -H value: the value, and its split into user, host and port."""
    user, _, rest = spec.rpartition("@")
    host, _, port = rest.partition(":")
    return SimpleNamespace(original_host=spec, user=user or "root", host=host,
                           port=int(port) if port.isdigit() else 22)


def test_hosts_as_written_and_errors_without_the_host(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "box.yaml").write_text("host: 10.0.0.4\n")
    deep = tmp_path / "hosts" / "cpu-only-1" / "cpu-only-1.yaml"
    deep.parent.mkdir(parents=True)
    deep.write_text("host: 127.0.0.9\nport: 2222\n")
    monkeypatch.chdir(tmp_path)
    buf = io.StringIO()
    monkeypatch.setitem(output._CONSOLES, "console", Console(file=buf, width=200))

    rows = [
        (ctx("box"), HostResult(None, SSHError("box", "auth refused", "root@10.0.0.4 refused "
                                               "the key"), 1, 0.4)),
        (ctx("root@10.0.0.5:2222"), HostResult(None, RemoteError(
            "root@10.0.0.5:2222", "conda", 3, "downloading\nsha256 mismatch"), 1, 2.0)),
        (ctx(str(deep)), HostResult({"steps": [("conda", "ok", 3.2), ("env", "skipped", 0.1)],
                                     "verdict": "PASS"}, None, 0, 3.3)),
    ]
    assert [label(c) for c, _ in rows] == ["box", "root@10.0.0.5:2222", "cpu-only-1"]
    summary(rows, 3.4)
    table = buf.getvalue()
    assert "summary: 3 hosts in 3.4s" in table and "root@/" not in table and "root@127" not in table
    cells = {ln.split("│")[1].strip(): ln.split("│")[2].strip()
             for ln in table.splitlines() if ln.startswith("│") and ln.split("│")[1].strip()}
    assert cells == {"box": "failed: auth refused: root@10.0.0.4 refused the key",
                     "root@10.0.0.5:2222": "failed: step 'conda' failed with exit code 3",
                     "cpu-only-1": "ok PASS"}
    assert "conda 3.2" in table and "env 0.1" not in table  # skipped steps take no time
