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


# the demo's own sandbox: the hosts and the mirror a user started (in $GPU_SANDBOX_DIR, by
# default /tmp/gpu-sandbox) are left alone, and only what the demo started is stopped
DEMO_DIR = "/tmp/gpu-sandbox-demo"


def main() -> int:
    yours = harness.sandbox_dir()
    os.environ["GPU_SANDBOX_DIR"] = DEMO_DIR
    problem = harness.why_unavailable()
    if problem:
        print(f"demo needs the sandbox: {problem}", file=sys.stderr)
        return 1
    info = harness.start("cpu-only")
    try:
        return run(info, STEPS)
    finally:
        from . import mirror
        harness.stop(info.id)
        mirror.stop()
        print(f"\nstopped the demo's host {info.id} and its mirror ({DEMO_DIR}); sandbox hosts of "
              f"yours in {yours} are left as they were. To keep a host to try things on: "
              ".venv/bin/python -m tests.sandbox start cpu-only (README: Try it)")


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
    print(f"\n{len(info.sessions())} remote executions in all. On a host of your own, a second "
          "bootstrap changes nothing, in one remote execution.")
    return 0

if __name__ == "__main__":
    sys.exit(main())
