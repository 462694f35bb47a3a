"""The command line as people type it, made into what Invoke's parser reads (pure).

- ``TASK -h`` / ``TASK --help``: Invoke would take ``-h`` as the value of a required positional
  argument (``sync -h`` said "did not receive required positional arguments"); it becomes
  ``--help TASK``, the task's help, for every task.
- ``--json`` (or ``-j``) before the task's name: the program has no ``--json`` of its own (it
  answered "did you mean --version?"); it is the task's, and moves after the task's name.
- ``forward 8888 6006:7000``: Invoke reads one positional value; the ports become one.
- ``sync up SRC DEST`` (the scp and rsync habit): the third word becomes ``--dest DEST``.

Only what comes before ``--`` is looked at: what follows is a command's own words.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence

# program-wide flags that take a value (cli/main.py's core_args and Invoke's)
VALUE_FLAGS = frozenset({"-f", "--config", "-D", "--list-depth", "-F", "--list-format",
                         "--print-completion-script", "-H", "--hosts", "-i", "--identity",
                         "-S", "--ssh-config", "-t", "--connect-timeout", "--workdir"})
HELP = ("-h", "--help")
PORT = re.compile(r"\d+(:\d+)?")


def task_index(argv: Sequence[str], tasks: Collection[str]) -> int | None:
    """Where the first task's name is (``argv[0]`` is the program)."""
    i = 1
    while i < len(argv) and argv[i] != "--":
        token = argv[i]
        if token in VALUE_FLAGS:
            i += 2
            continue
        if token in tasks:
            return i
        i += 1
    return None


def _bare(out: Sequence[str], start: int, end: int, takes_value: Collection[str]) -> list[int]:
    """Indexes of the words between ``start`` and ``end`` that are neither an option nor an
    option's value."""
    found = []
    i = start
    while i < end:
        token = out[i]
        if token.startswith("-"):
            i += 2 if token in takes_value else 1
            continue
        found.append(i)
        i += 1
    return found


def rewrite(argv: Sequence[str], tasks: Collection[str],
            value_flags: Callable[[str], Collection[str]] = lambda task: ()) -> list[str]:
    """``value_flags(task)``: that task's options that take a value (``--dest``)."""
    out = list(argv)
    at = task_index(out, tasks)
    if at is None:
        return out
    end = out.index("--") if "--" in out else len(out)
    task = out[at]
    if any(t in HELP for t in out[at + 1:end]):
        return [*out[:at], "--help", task]
    moved = [t for t in out[1:at] if t in ("--json", "-j")]
    if moved:
        head = [t for t in out[1:at] if t not in ("--json", "-j")]
        out = [out[0], *head, task, "--json", *out[at + 1:]]
        at = len(head) + 1
        end = out.index("--") if "--" in out else len(out)
    if task == "sync":
        bare = _bare(out, at + 1, end, value_flags(task))
        if len(bare) == 3:
            out[bare[2]:bare[2] + 1] = ["--dest", out[bare[2]]]
    if task == "forward":
        ports = [i for i in range(at + 1, end) if PORT.fullmatch(out[i]) and
                 not out[i - 1].startswith("--")]
        if len(ports) > 1:
            joined = ",".join(out[i] for i in ports)
            out = [t for i, t in enumerate(out) if i not in ports[1:]]
            out[ports[0]] = joined
    return out
