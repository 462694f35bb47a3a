"""A small SSH client for tests that act on a sandbox host as a user's tools would."""

from __future__ import annotations

import socket
import time

import paramiko

from tests.sandbox.harness import HostInfo


def ssh(info: HostInfo, command: str, timeout: float = 600) -> tuple[int, str]:
    """Run one command over real SSH; returns (exit code, stdout+stderr)."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # sandbox hosts only
    client.connect(info.host, port=info.port, username=info.user, key_filename=info.key,
                   timeout=10, allow_agent=False, look_for_keys=False)
    try:
        _, out, _ = client.exec_command(command + " 2>&1", timeout=timeout)
        text = out.read().decode("utf-8", "replace")
        return out.channel.recv_exit_status(), text
    finally:
        client.close()


def wait_for_boot(info: HostInfo, boots: int, timeout: float = 30) -> None:
    """Wait until the host has booted ``boots`` times and sshd answers again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if info.state().get("boots", 0) >= boots:
            try:
                with socket.create_connection((info.host, info.port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                pass
        time.sleep(0.1)
    raise AssertionError(f"{info.id} did not come back from reboot in {timeout}s")
