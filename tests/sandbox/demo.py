"""``make demo``: a CPU-only sandbox host and the local mirror, the main job against it, cleanup.

Uses the real program (``fab`` from the checkout) exactly as a user would against a rental.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from . import harness

REPO = Path(__file__).resolve().parents[2]


STEPS = (["facts"], ["plan"], ["bootstrap"])


def main() -> int:
    problem = harness.why_unavailable()
    if problem:
        print(f"demo needs the sandbox: {problem}", file=sys.stderr)
        return 1
    info = harness.start("cpu-only")
    try:
        return run(info, STEPS)
    finally:
        harness.stop_all()


def run(info: harness.HostInfo, steps: Sequence[list[str]]) -> int:
    fab = str(Path(sys.executable).with_name("fab"))
    env = dict(os.environ, GPU_PROVISION_HOME=str(harness.sandbox_dir() / "demo-home"))
    # the host is new on every run, but its inventory's path is the last run's: the pin that run
    # left would read as "host key changed". Forgotten first, as a user would after a rebuild.
    subprocess.run([fab, "-H", info.inventory, "forget-host-key"], cwd=REPO, env=env,
                   stdout=subprocess.DEVNULL)
    print(f"sandbox host {info.id} at {info.user}@{info.host}:{info.port} "
          f"(mirror {info.mirror['url']})\n", flush=True)
    for step in steps:
        print("$ fab -H <sandbox inventory> " + " ".join(step), flush=True)
        r = subprocess.run([fab, "-H", info.inventory, *step], cwd=REPO, env=env)
        if r.returncode != 0:
            print(f"demo: {' '.join(step)} exited {r.returncode}")
            return r.returncode
    print(f"\n{len(info.sessions())} remote executions in all; run it again and bootstrap "
          "changes nothing in one (validation is redone once something it checks changes, "
          "or with `validate`).")
    return 0

if __name__ == "__main__":
    sys.exit(main())
