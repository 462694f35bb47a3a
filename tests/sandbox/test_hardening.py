"""Secrets and hostile input on sandbox hosts: `authorize` with a password once, tokens pushed
masked and forgotten, hostile values that reach a shell leave the host unharmed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Hosts, gpu_provision
from tests.sandbox import harness

pytestmark = pytest.mark.sandbox


def test_authorize_installs_the_key_with_the_password_once(hosts: Hosts, gp_home: Path,
                                                           tmp_path: Path) -> None:
    password = "pa ss'wo\"rd $(reboot)"
    info = hosts.fresh("cpu-only", password=password)
    try:
        key = tmp_path / "laptop_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me@laptop", "-f",
                        str(key)], check=True)
        target = f"root@{info.host}:{info.port}"
        before = gpu_provision("-H", target, "-i", str(key), "facts", home=gp_home, cwd=tmp_path)
        assert before.returncode == 1 and "auth refused" in before.stderr

        r = gpu_provision("-H", target, "-i", str(key), "authorize", "--password-env", "PW",
                          home=gp_home, cwd=tmp_path, env={"PW": password})
        assert r.returncode == 0, r.stderr
        assert "key login works, the password is no longer needed" in r.stdout
        keys = info.path("/root/.ssh/authorized_keys").read_text().splitlines()
        assert keys.count((tmp_path / "laptop_key.pub").read_text().strip()) == 1
        assert (info.path("/root/.ssh/authorized_keys").stat().st_mode & 0o777) == 0o600

        after = gpu_provision("-H", target, "-i", str(key), "facts", "--json", home=gp_home,
                              cwd=tmp_path)
        assert after.returncode == 0, after.stderr  # by key alone: no password given
        facts = json.loads(after.stdout)
        assert (facts["os"]["id"], facts["root"], facts["home"]) == ("ubuntu", True, "/root")
        again = gpu_provision("-H", target, "-i", str(key), "authorize", "--password-env", "PW",
                              home=gp_home, cwd=tmp_path, env={"PW": password})
        assert again.returncode == 0 and "already works; nothing changed" in again.stdout
        assert len(info.path("/root/.ssh/authorized_keys").read_text().splitlines()) == len(keys)

        wrong = gpu_provision("-H", target, "-i", str(tmp_path / "none"), "authorize",
                              home=gp_home, cwd=tmp_path)
        # a key file that is not there: a usage error, named before anything connects
        assert wrong.returncode == 2 and "cannot read the public key" not in wrong.stderr
        assert wrong.stderr == (f"error: -i {tmp_path / 'none'}: no such key file (give the "
                                "private key to log in with)\n")
        logs = "".join(p.read_text() for p in tmp_path.rglob("*.log"))
        assert password not in logs + r.stdout + r.stderr
    finally:
        harness.stop(info.id)


def test_password_login_from_the_prompt(hosts: Hosts, gp_home: Path, tmp_path: Path) -> None:
    """--prompt-for-login-password: the password is asked for once (a line of stdin when it is
    not a terminal), used for every connection of the run, and shown nowhere; a wrong one is
    auth refused in one line; verify on this never-bootstrapped host says so in one line."""
    password = "pa ss'wo\"rd $(reboot)"
    info = hosts.fresh("cpu-only", password=password)
    target = f"root@{info.host}:{info.port}"
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    env.update(GPU_PROVISION_HOME=str(gp_home), HOME=str(tmp_path), COLUMNS="200")

    def run(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "provision", "--prompt-for-login-password",
                               "-H", target, *args], input=stdin, capture_output=True,
                              text=True, cwd=tmp_path, env=env, timeout=300,
                              start_new_session=True)  # no terminal to ask on: stdin it is
    try:
        r = run("facts", "--json", stdin=password + "\n")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["boot_id"]
        assert password not in r.stdout + r.stderr + "".join(
            p.read_text(errors="replace") for p in tmp_path.rglob("*.log"))

        wrong = run("facts", stdin="not the password\n")
        assert wrong.returncode == 1
        assert wrong.stderr.splitlines()[-1] == (
            f"error: {target}: auth refused: root@{info.host} refused the agent's and "
            f"~/.ssh/id_* keys and the password: pass the right key with -i KEY (or fix "
            f"`key:`/`password_env:` in the inventory), or install your key with the password "
            f"once: gpu-provision -H {target} authorize")

        never = run("verify", stdin=password + "\n")
        assert never.returncode == 1
        assert never.stderr.splitlines()[-1] == (
            f"error: {target}: this host was never bootstrapped by gpu-provision (no "
            "~/.gpu-provision/expected.json), so there is nothing to verify; run: gpu-provision "
            f"-H {target} bootstrap")
        # no JUnit file for a suite that never ran (in our folder, $GPU_PROVISION_HOME, or here)
        assert not list(tmp_path.rglob("verify-*.xml"))
    finally:
        harness.stop(info.id)


HOSTILE_TOKEN = "hf_'; touch /tmp/PWNED; echo '$(touch /tmp/PWNED2)`id`\n\"✓ 令牌\" \\ $HOME"
HOSTILE_DIR = "/root/data dir/$(touch /tmp/PWNED3);`touch /tmp/PWNED4` 'q' ✓"


def test_tokens_are_pushed_masked_and_forgotten(hosts: Hosts, gp_home: Path,
                                                tmp_path: Path) -> None:
    """push_env tokens with hostile values reach a 0600 file unchanged and appear in no output,
    log or report; a hostile data_dir is only ever a quoted value; forget-secrets removes them."""
    info = hosts.fresh("cpu-only")
    try:
        inv = info.inventory_with(tmp_path / "tokens.yaml", push_env=["HF_TOKEN", "WANDB_API_KEY"],
                                  data_dir=HOSTILE_DIR)
        env = {"HF_TOKEN": HOSTILE_TOKEN, "WANDB_API_KEY": "wandb-0123456789abcdef"}
        missing = gpu_provision("-H", inv, "plan", home=gp_home, cwd=tmp_path,
                                env={"HF_TOKEN": "x"})
        assert missing.returncode == 1
        assert "push_env: WANDB_API_KEY is not set in this shell" in missing.stderr

        r = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "secrets: push HF_TOKEN WANDB_API_KEY" in r.stdout
        assert "verdict: PASS" in r.stdout
        seen = r.stdout + r.stderr + "".join(
            p.read_text(errors="replace") for d in ("logs", "reports")
            for p in (tmp_path / d).rglob("*") if p.is_file())
        for value in env.values():
            assert value not in seen
            for line in value.splitlines():
                assert line not in seen
        assert "HF_TOKEN" in seen  # the names are shown, only the values are masked

        env_file = info.path("/root/.gpu-provision/env")
        assert env_file.stat().st_mode & 0o777 == 0o600
        dump = subprocess.run(["bash", "-c", f'. "{env_file}"; printf "%s\\0" "$HF_TOKEN" '
                               '"$WANDB_API_KEY"'], capture_output=True, text=True)
        assert dump.stdout.split("\0")[:-1] == [env["HF_TOKEN"], env["WANDB_API_KEY"]]
        assert "gpu-provision tokens" in info.path("/root/.bashrc").read_text()
        for canary in ("PWNED", "PWNED2", "PWNED3", "PWNED4"):
            assert not info.path(f"/tmp/{canary}").exists(), canary

        again = gpu_provision("-H", inv, "bootstrap", home=gp_home, cwd=tmp_path, env=env)
        assert again.returncode == 0 and "secrets: nothing to do" in again.stdout

        gone = gpu_provision("-H", inv, "forget-secrets", home=gp_home, cwd=tmp_path)
        assert gone.returncode == 0, gone.stderr
        assert "removed HF_TOKEN WANDB_API_KEY from the host" in gone.stdout
        assert not env_file.exists()
        assert "gpu-provision tokens" not in info.path("/root/.bashrc").read_text()
        steps = {p.stem for p in info.path("/root/.gpu-provision/steps").glob("*.json")}
        assert "secrets" not in steps
        journal = json.dumps([json.loads(info.path(f"/root/.gpu-provision/steps/{s}.json")
                                         .read_text()) for s in steps])
        assert env["WANDB_API_KEY"] not in journal
    finally:
        harness.stop(info.id)
