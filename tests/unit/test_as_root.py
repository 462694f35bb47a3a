"""A step that needs root, rendered and run by real bash here: as root its body runs as it is;
a login without root or passwordless sudo is refused before the lock, the log or the journal
are touched, in one line naming the login and what sudo said (the sudo path itself runs on the
sandbox hosts: tests/sandbox/test_logins.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from shlex import quote

import pytest

from provision.errors import ProvisionError
from provision.remote.runtime import (
    NO_ROOT,
    detached_script,
    foreground_script,
    root_script,
    split_result,
)

BODY = 'echo "uid $(id -u)"; printf \'{"uid": %s}\\n\' "$(id -u)" > "$RESULT"'


def _run(script: str, home: Path, user: str | None = None) -> subprocess.CompletedProcess[str]:
    """The script on bash's stdin, as root or as ``user`` (su sets HOME: it is set again)."""
    argv = ["bash"] if user is None else \
        ["su", user, "-s", "/bin/bash", "-c", f"HOME={quote(str(home))} exec bash"]
    return subprocess.run(argv, input=script, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(home)})


def test_as_root_the_body_runs_as_it_is(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs as root")
    r = _run(detached_script("driver", BODY, needs_root=True), tmp_path)
    assert r.returncode == 0, r.stderr
    log, line = split_result(r.stdout)
    assert line is not None and line["result"] == {"uid": 0}
    assert "uid 0" in log
    fg = _run(foreground_script("x", BODY, needs_root=True), tmp_path)
    assert split_result(fg.stdout)[1] == {"exit": 0, "size": 0, "result": {"uid": 0}}
    assert _run(root_script("id -u"), tmp_path).stdout.strip() == "0"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("su"), reason="needs root and su")
def test_a_login_without_sudo_is_refused_before_anything_changes() -> None:
    """nobody has no sudoers entry: sudo -n answers "a password is required" (or sudo is not
    installed); the step exits NO_ROOT and leaves no lock owner, no log, no journal entry."""
    with tempfile.TemporaryDirectory(prefix="gp-as-root-") as top:
        Path(top).chmod(0o755)
        home = Path(top) / "home"
        home.mkdir()
        shutil.chown(home, "nobody")
        _refused(home)


def _refused(home: Path) -> None:
    for script in (detached_script("driver", BODY, needs_root=True), root_script("reboot")):
        r = _run(script, home, user="nobody")
        assert r.returncode == NO_ROOT, r.stdout + r.stderr
        line = r.stderr.strip().splitlines()[-1]
        assert line.startswith("gpu-provision-noroot: login nobody is not root and has no "
                               "passwordless sudo ("), line
        assert "a password is required" in line or "sudo is not installed" in line
    state = home / ".gpu-provision"
    assert not (state / "locks/host.owner").exists() and not (state / "logs/driver.log").exists()
    assert not (state / "steps/driver.json").exists()
    # a body that needs no root runs for the same login
    r = _run(detached_script("env", BODY), home, user="nobody")
    assert r.returncode == 0 and split_result(r.stdout)[1]["result"] == {"uid": 65534}  # type: ignore[index]


def test_the_refusal_is_one_line_naming_host_step_and_fix() -> None:
    from provision.remote import runtime

    class Ex:
        host, secrets, log_dir = "gpu1", (), None
    with pytest.raises(ProvisionError) as e:
        runtime._finish(Ex(), "driver", "", "gpu-provision-noroot: login alice is not root and "  # type: ignore[arg-type]
                        "has no passwordless sudo (sudo: a password is required)\n", NO_ROOT,
                        0.1, "bootstrap")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == ("gpu1: step 'driver' needs root and the login alice is not root and has no "
                   "passwordless sudo (sudo: a password is required): nothing was changed; log "
                   "in as root or as a user with passwordless sudo (NOPASSWD in "
                   "/etc/sudoers.d), or have an admin run it")
