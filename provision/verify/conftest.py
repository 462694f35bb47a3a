"""Fixtures of the verify suite. Run by `gpu-provision -H <host> verify` (our pinned connection
is handed to testinfra), or by hand:

    pytest --hosts=ssh://root@203.0.113.10:22 --ssh-identity-file=~/.ssh/id_ed25519 \\
        "$(python -c 'import provision.verify as v; print(v.SUITE)')"
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import testinfra.host

from provision.remote.contract import CONTRACT


@pytest.fixture(scope="module")
def host(_testinfra_host: testinfra.host.Host, pytestconfig: pytest.Config) -> testinfra.host.Host:
    """testinfra's host; under `verify` its paramiko client is the one our tasks opened (same
    key, port and pinned host key), set before testinfra would open its own."""
    client = getattr(pytestconfig, "gpu_provision_client", None)
    if client is not None:
        _testinfra_host.backend.__dict__["client"] = client
    ex = getattr(pytestconfig, "gpu_provision_executor", None)
    if ex is not None:  # every check's command through the executor: logged and masked
        backend = _testinfra_host.backend

        def run(command: str, *args: str, **kwargs: Any) -> Any:
            from provision.remote.command import bash_script
            cmd = backend.get_command(command, *args)
            r = ex.run(bash_script(cmd), step="verify", check=False, reads_only=True)
            return backend.result(r.exit_code, backend.encode(cmd), r.stdout, r.stderr)

        backend.run = run
    return _testinfra_host


@pytest.fixture(scope="module")
def expected(host: testinfra.host.Host) -> dict[str, Any]:
    """What the last bootstrap set up, as its validate step recorded it on the host."""
    r = host.run(f"cat ~/{CONTRACT.expected}")
    if r.rc != 0:
        pytest.fail(f"no ~/{CONTRACT.expected} on the host: run bootstrap first")
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def run_json(host: testinfra.host.Host, command: str) -> Any:
    r = host.run(command)
    assert r.rc == 0, f"{command!r} exited {r.rc}: {(r.stdout + r.stderr).strip()[-500:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])
