#!/usr/bin/python3 -I
"""Stand-ins for an NVSwitch board's fabric manager, which a sandbox host cannot run:
``systemctl`` (the nvidia-fabricmanager unit), ``journalctl`` and ``nv-fabricmanager``
(``apt-cache madison`` is standin.py's). One multi-call script beside standin.py, sharing its
state file and call log; each answer replays a captured real output (tests/fixtures/fabric,
cited in SOURCES.md).

Which fabric manager is installed follows the package stand-ins' record of what was installed
(apt-get installs the build asked for from the captured madison listing); the profile says what the
board had before (``fabric_manager.installed``). Like the real service, it starts only when its
version is exactly the loaded driver's; then the GPUs' fabric state turns Completed.
``nv-fabricmanager`` is always on PATH here: without the package it answers as the shell does
for a missing command.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = "/var/lib/gpu-sandbox"
UNIT = "nvidia-fabricmanager"
TOOLS = ("systemctl", "journalctl", "nv-fabricmanager")  # apt-cache: standin.py
FM_PACKAGE = re.compile(r"^(?P<name>nvidia-fabric-?manager(?:-\d+)?)(?:[=-](?P<ver>\d+\.\d+(?:\.\d+)?)"
                        r"(?:-\S*)?)?$")


def fixture(name: str) -> str:
    with open(f"{ROOT}/fixtures/{name}", encoding="utf-8") as f:
        return f.read()


def installed(st: dict[str, Any]) -> str | None:
    """The fabric manager version on the host: the newest a package tool installed, else what
    the board came with."""
    fab = st["fabric"]
    db = st.get("pkgdb", {}).get("installed", {})
    found = [p["version"].split("-")[0] for name, p in db.items() if FM_PACKAGE.match(name)]
    if found:
        return max(found, key=lambda v: tuple(int(p) for p in v.split(".")))
    return fab.get("installed")


def set_fabric(st: dict[str, Any], state: str, status: str) -> None:
    for row in st["gpu"]["rows"]:
        row["fabric.state"], row["fabric.status"] = state, status


def systemctl(args: list[str], st: dict[str, Any]) -> int:
    verb = next((a for a in args if not a.startswith("-")), "")
    units = [a.removesuffix(".service") for a in args[args.index(verb) + 1:] if not a.startswith("-")] \
        if verb else []
    fab = st["fabric"]
    version = installed(st)
    for unit in units or [""]:
        known = unit == UNIT and version is not None
        if verb == "is-active":
            word = fab.get("active") if known else "inactive"
            print(word or "inactive")
            return 0 if word == "active" else 3
        if verb == "is-enabled":
            if not known:  # fabric/systemctl-is-enabled-missing-unit-cis.txt
                print(fixture("systemctl-is-enabled-missing-unit-cis.txt").strip()
                      .replace("autofs", unit), file=sys.stderr)
                return 1
            print("enabled" if fab.get("enabled") else "disabled")
            return 0 if fab.get("enabled") else 1
        if not known and verb in ("start", "restart", "stop"):
            # fabric/systemctl-start-fm-unit-not-found.txt
            print(fixture("systemctl-start-fm-unit-not-found.txt").strip()
                  .replace("start", verb, 1).replace(UNIT, unit), file=sys.stderr)
            return 5
        if not known or verb not in ("enable", "disable", "stop", "start", "restart", "status"):
            print(f"sandbox: `systemctl {' '.join(args)}` is not replayed", file=sys.stderr)
            return 1
        if verb == "enable":
            fab["enabled"] = True
        elif verb == "disable":
            fab["enabled"] = False
        elif verb == "stop":
            fab["active"] = "inactive"
        elif verb in ("start", "restart"):
            loaded = st["driver"]["loaded"]
            if version != loaded:  # it refuses to run beside another driver version
                fab["active"] = "failed"
                fab["journal"] = (fixture("journal-fm-mismatch-595.71.05-vs-loaded-590.48.01-start-sh.txt")
                                  .replace("595.71.05", version or "").replace("590.48.01", loaded or ""))
                print(fixture("systemctl-restart-fm-failed-h20-ppcie-nvtrust.txt"), end="",
                      file=sys.stderr)
                return 1
            fab["active"] = "active"
            fab["journal"] = fixture("journalctl-u-fm-started-p5-h100-570.133.20-rhel9.txt")
            set_fabric(st, "Completed", "Success")  # about a minute later on a real board
        elif verb == "status":
            if fab.get("active") == "active":
                print(fixture("systemctl-status-fm-active-590.48.01-start-sh-sxid-nonfatal.txt")
                      .replace("590.48.01", version or ""), end="")
                return 0
            print(fab.get("journal") or "", end="")
            return 3
    return 0


def journalctl(args: list[str], st: dict[str, Any]) -> int:
    if UNIT in " ".join(args):
        print(st["fabric"].get("journal") or "-- No entries --", end="\n" if not
              st["fabric"].get("journal") else "")
    return 0


def nv_fabricmanager(args: list[str], st: dict[str, Any]) -> int:
    version = installed(st)
    if version is None:
        print("bash: nv-fabricmanager: command not found", file=sys.stderr)
        return 127
    print(fixture("nv-fabricmanager-version-450.102.04.txt").replace("450.102.04", version), end="")
    return 0


def main() -> int:
    sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
    from standin import State, log_call  # the shared state file and call log

    tool = os.path.basename(sys.argv[0])
    log_call(tool, sys.argv[1:])
    st = State()
    try:
        rc = {"systemctl": systemctl, "journalctl": journalctl,
              "nv-fabricmanager": nv_fabricmanager}[tool](sys.argv[1:], st.data)
        st.save()
        return rc
    finally:
        st.close()


def prepare(upper: Path, lib: Path, state: dict[str, Any], spec: dict[str, Any],
            fixtures: Path) -> None:
    """Set a sandbox host up as an NVSwitch board: these stand-ins on PATH, their captures, the
    fabric manager the board came with, and the GPUs' fabric state to match."""
    here = Path(__file__).resolve()
    target = upper / "usr/local/lib/gpu-sandbox/standin_fabric.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(here, target)
    target.chmod(0o755)
    for tool in TOOLS:
        link = upper / "usr/local/bin" / tool
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("/usr/local/lib/gpu-sandbox/standin_fabric.py")
    for f in (fixtures / "fabric").iterdir():
        shutil.copy(f, lib / "fixtures" / f.name)
    madison = {name: Path(path).name for name, path in (spec.get("madison") or {}).items()}
    running = bool(spec.get("installed")) and spec.get("installed") == state["driver"]["loaded"]
    state["fabric"] = {"installed": spec.get("installed"), "madison": madison,
                       "active": "active" if running else "inactive", "enabled": running,
                       "journal": None}
    set_fabric(state, "Completed" if running else "In Progress", "Success" if running else "N/A")
    # the replayed tables name the loaded driver's CUDA: this driver is not a stand-in branch
    sys.path.insert(0, str(here.parent.parent.parent))
    from provision.wheels.data import dotted, load_compat
    driver = state["driver"]["loaded"]
    cuda = load_compat().max_cuda_for_driver(dotted(driver)) if driver else None
    if driver and cuda:
        state.setdefault("driver_cuda", {})[driver] = ".".join(map(str, cuda[:2]))


if __name__ == "__main__":
    sys.exit(main())
