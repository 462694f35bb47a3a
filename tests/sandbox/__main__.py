"""``python -m tests.sandbox start <profile> [--json]`` / ``stop <id|--all>`` / ``list``."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from . import harness


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sandbox",
                                 description="Sandbox hosts for trying gpu-provision locally.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("start", help="start one host of a profile (and the local mirror)")
    st.add_argument("profile", choices=harness.profiles())
    st.add_argument("--json", action="store_true")
    st.add_argument("--password", help="also allow root login with this password")
    sp = sub.add_parser("stop", help="stop a host, or --all hosts and the mirror")
    sp.add_argument("id", nargs="?")
    sp.add_argument("--all", action="store_true")
    sub.add_parser("list", help="running hosts")
    sub.add_parser("profiles", help="available profiles")
    sub.add_parser("demo", help="the main job against a CPU-only sandbox host, then stop")
    a = ap.parse_args(argv)
    if a.cmd == "start":
        info = harness.start(a.profile, password=a.password)
        if a.json:
            print(json.dumps(asdict(info), indent=1))
        else:
            print(f"host      {info.id}: {info.user}@{info.host}:{info.port}\nkey       {info.key}\n"
                  f"inventory {info.inventory}\nmirror    {info.mirror['url']}\n"
                  f"try       fab -H {info.inventory} facts")
    elif a.cmd == "stop":
        if a.all:
            ids = [info.id for info in harness.running()]
            harness.stop_all()
            print(f"stopped {', '.join(ids) if ids else 'no host'} and the mirror "
                  f"({harness.sandbox_dir()})")
        elif a.id:
            harness.stop(a.id)
            print(f"stopped {a.id}")
        else:
            ap.error("stop needs an id or --all")
    elif a.cmd == "list":
        for info in harness.running():
            print(f"{info.id}\t{info.user}@{info.host}:{info.port}\t{info.inventory}")
    elif a.cmd == "demo":
        from .demo import main as demo
        return demo()
    elif a.cmd == "profiles":
        for p in harness.profiles():
            print(f"{p}\t{harness.load_profile(p)['description'].strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
