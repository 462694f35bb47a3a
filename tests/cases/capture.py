"""Capture the raw facts (the facts script's JSON, probes and all) of sandbox hosts, and the
inventory settings each was given, for the plan case files:
``python -m tests.cases.capture PROFILE[:STATE] ... [--out tests/cases/facts]``.

STATE ``bootstrapped`` runs a real bootstrap on the host first (Miniconda, env, torch, the
journal), so the capture is what a re-run sees; ``driver`` runs the driver task (install,
reboot, hold), so the capture is what the engine sees after the driver step settled.
Needs what the sandbox needs (root, sshd).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import paramiko
import yaml

from provision.config.recipes import all_platforms
from provision.facts.gather import data_dirs, facts_script
from provision.remote.command import bash_script
from tests.sandbox import harness, mirror

OUT = Path(__file__).resolve().parent / "facts"


def raw_facts(info: harness.HostInfo) -> dict[str, object]:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # sandbox hosts only
    client.connect(info.host, port=info.port, username=info.user, key_filename=info.key,
                   timeout=10, allow_agent=False, look_for_keys=False)
    try:
        platforms = all_platforms()
        script = facts_script(platforms, data_dirs(platforms))
        _, out, _ = client.exec_command(bash_script(script).render(), timeout=120)
        return json.loads(out.read().decode())  # type: ignore[no-any-return]
    finally:
        client.close()


# The local mirror listens on this port while capturing, so that case files do not change with
# the port a mirror happened to get (its URLs are in hashes the host's journal keeps).
MIRROR_PORT = "8080"


def provision(info: harness.HostInfo, task: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GPU_PROVISION_HOME=tmp)
        r = subprocess.run([sys.executable, "-m", "provision", "-H", info.inventory, task],
                           cwd=tmp, env=env, capture_output=True, text=True, timeout=1800)
        # a GPU profile's verdict is FAIL here (no GPU on this machine): the state is still real
        if r.returncode != 0 and "validation verdict FAIL" not in r.stderr:
            raise SystemExit(f"{task} on {info.id} failed:\n{r.stdout}\n{r.stderr}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("specs", nargs="+", help="PROFILE, PROFILE:bootstrapped or PROFILE:driver")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    mirror.stop()  # started again on MIRROR_PORT by the first host
    os.environ["GPU_SANDBOX_MIRROR_PORT"] = MIRROR_PORT
    for spec in a.specs:
        profile, _, state = spec.partition(":")
        info = harness.start(profile)
        try:
            if state:
                provision(info, {"bootstrapped": "bootstrap", "driver": "driver"}[state])
            doc = raw_facts(info)
            name = f"{profile}{'-' + state if state else ''}"
            (a.out / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            # the settings it was provisioned with (not where it listened): a case that uses
            # them sees the host as its own last run left it
            inventory = yaml.safe_load(Path(info.inventory).read_text())
            for key in ("host", "port", "user", "key", "notes"):
                inventory.pop(key, None)
            (a.out / f"{name}.inventory.yaml").write_text(yaml.safe_dump(inventory))
            print(f"wrote {a.out / name}.json and .inventory.yaml")
        finally:
            harness.stop(info.id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
