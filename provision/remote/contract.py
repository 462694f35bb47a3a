"""The host contract: what we keep on a host and how both sides name it, spelled here once.

Everything of ours on a host lives in ``~/.gpu-provision`` (``STATE``) of the login:

- ``steps/<name>.json``: the journal, one entry per step (``JOURNAL``, written by the one
  writer in ``templates/remote/_journal.sh.j2``); ``steps/<name>.{pid,rc,result,waiter}``: a
  running step's runtime files (a pid file without an rc file: the step was killed before it
  ended, and the next run redoes it); ``steps/<name>.cancelled``: who stopped it (``cancel``);
- ``logs/<name>.log``: each step's log; ``locks/<lock>`` (+ ``.owner``): the locks (``Locks``);
- ``jobs/<id>/``: one folder per job (provision/jobs); ``autostop/``: the watchdog's state
  (where the platform has persistent storage, ``<storage>/.gpu-provision/hosts/<hostname>/
  autostop`` instead, named by ``autostop-dir``: provision/money/autostop.py);
- ``tools/``: our uv, and the programs a recipe's ``tools:`` unpacks (``tools/ollama/``);
  ``bin/``: links to those programs, on PATH in logins, ``shell`` and jobs; ``index/``: what
  the mirrors served; ``env``: pushed tokens (0600); ``expected.json``: what ``verify`` checks
  the host against; ``venv/``: a venv over the image's system python, where its torch is used
  as it is (ops/layout.py).

Python code builds paths with ``rel`` (relative to the home, for commands and SFTP) and
``shown`` (``~/...``, for messages); templates receive ``host`` (``CONTRACT``) when rendered
(provision/remote/templating.py) and write ``"$HOME"/{{ host.state | q }}`` instead of the name.
"""

from __future__ import annotations

from dataclasses import dataclass

STATE = ".gpu-provision"  # under the login's $HOME


@dataclass(frozen=True)
class Locks:
    """The lock files under ``locks/``. ``host`` is taken exclusively by every step that changes
    the host (bootstrap's steps) and shared by ``run`` while it starts a job, so a job never
    starts in the middle of an install; ``jobs`` makes job starts one at a time; ``autostop``
    keeps one watchdog."""

    host: str = "host"
    jobs: str = "jobs"
    autostop: str = "autostop"


@dataclass(frozen=True)
class Contract:
    """What every template is rendered with, as ``host``."""

    state: str = STATE
    steps: str = f"{STATE}/steps"
    logs: str = f"{STATE}/logs"
    locks_dir: str = f"{STATE}/locks"
    jobs: str = f"{STATE}/jobs"
    autostop: str = f"{STATE}/autostop"
    tools: str = f"{STATE}/tools"
    bin: str = f"{STATE}/bin"
    index: str = f"{STATE}/index"
    env_file: str = f"{STATE}/env"
    expected: str = f"{STATE}/expected.json"
    view: str = f"{STATE}/venv"  # a venv of ours over the image's system python (ops/layout.py)
    locks: Locks = Locks()
    marker: str = "GPU_PROVISION_RESULT"  # the step script's one result line starts with it
    heartbeat: str = "gpu-provision-heartbeat "  # stderr, every 2 s while a body runs
    notice: str = "gpu-provision: "  # stderr: re-attaching, shown as it comes
    # stderr: why the step did not run or end (the lock refused, cancelled): the error says it
    refused: str = "gpu-provision-refused: "
    locked: int = 75  # a step's exit code when another run holds its lock
    cancelled: int = 130  # ... when it was stopped on the host (`cancel`, a second Ctrl-C)


CONTRACT = Contract()

# The journal entry every step leaves in steps/<name>.json (one JSON object a file):
# step, inputs (the hash a re-run compares), result ("ok" | "failed" | a verdict), exit,
# seconds, at (epoch seconds), run (the laptop's run id: its logs and reports carry the same).
JOURNAL = ("step", "inputs", "result", "exit", "seconds", "at", "run")


def rel(*parts: str) -> str:
    """A path of ours relative to the login's home: ``rel("logs", "torch.log")``."""
    return "/".join((STATE, *parts))


def shown(*parts: str) -> str:
    """The same path as a user reads it: ``~/.gpu-provision/logs/torch.log``."""
    return "~/" + rel(*parts)
