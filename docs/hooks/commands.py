"""mkdocs hook: the command reference (docs/commands.md, at its `<!-- tasks -->` mark) is each
task's own help, as `gpu-provision TASK -h` prints it, so the page cannot drift from the code."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

MARK = "<!-- tasks -->"


def _help(*args: str) -> str:
    # cli.main itself (not the entry point, which may hand a command to a warm server)
    code = "import sys; from provision.cli.main import main; sys.argv[0] = 'gpu-provision'; main()"
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       timeout=60, env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"})
    if r.returncode != 0:
        raise RuntimeError(f"gpu-provision {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r.stdout.rstrip()


def _tasks() -> list[str]:
    from provision.cli.main import namespace
    return sorted(ctx.name for ctx in namespace.to_contexts())


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != "commands.md" or MARK not in markdown:
        return markdown
    parts = []
    for name in _tasks():
        parts.append(f"### {name}\n\n```text\n{_help('-h', name)}\n```\n")
    return markdown.replace(MARK, "\n".join(parts))
