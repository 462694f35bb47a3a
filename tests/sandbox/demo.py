"""``make demo``: a CPU-only sandbox host and the local mirror, the main job against it, cleanup.

Uses the real program (``fab`` from the checkout) exactly as a user would against a rental.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from . import harness

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    problem = harness.why_unavailable()
    if problem:
        print(f"demo needs the sandbox: {problem}", file=sys.stderr)
        return 1
    fab = str(Path(sys.executable).with_name("fab"))
    env = dict(os.environ, GPU_PROVISION_HOME=str(harness.sandbox_dir() / "demo-home"))
    info = harness.start("cpu-only")
    try:
        print(f"sandbox host {info.id} at {info.user}@{info.host}:{info.port} "
              f"(mirror {info.mirror['url']})\n", flush=True)
        for step in (["facts"], ["plan"], ["bootstrap"]):
            print("$ fab -H <sandbox inventory> " + " ".join(step), flush=True)
            r = subprocess.run([fab, "-H", info.inventory, *step], cwd=REPO, env=env)
            if r.returncode != 0:
                print(f"demo: {' '.join(step)} exited {r.returncode}")
                return r.returncode
        print(f"\n{len(info.sessions())} remote executions in all; run it again and bootstrap "
              "changes nothing in one (validation is redone once something it checks changes, "
              "or with `validate`).")
        return 0
    finally:
        harness.stop_all()


if __name__ == "__main__":
    sys.exit(main())
