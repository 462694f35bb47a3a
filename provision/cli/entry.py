"""The program's entry point: ``--version`` answers before anything else is imported (Invoke
alone costs several times a bare interpreter's start); a command that a warm server can take
goes there (``warm.py``); everything else goes to cli.main, here."""

from __future__ import annotations

import sys


def main() -> None:
    argv = sys.argv[1:]
    if argv in (["--version"], ["-V"]):
        from .. import __version__
        print(f"gpu-provision {__version__}")
        return
    from . import warm
    path = warm.socket_for(argv)
    if path is not None:
        try:
            code = warm.run_warm(path, argv)
        except (KeyboardInterrupt, warm.Abandoned):  # before the command started: only the exit
            sys.exit(130)
        if code is not None:
            sys.exit(code)
    from .main import main as run
    try:
        run()
    finally:
        if path is not None:
            warm.start_server(path)
