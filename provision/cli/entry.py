"""The program's entry point: ``--version`` answers before anything else is imported (Invoke
alone costs several times a bare interpreter's start), everything else goes to cli.main."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:] in (["--version"], ["-V"]):
        from .. import __version__
        print(f"gpu-provision {__version__}")
        return
    from .main import main as run
    run()
