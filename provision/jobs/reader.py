"""``logs``: where the reader of a job's log is, kept on the laptop, so a re-run after an SSH drop,
Ctrl-C or a killed laptop process resumes without repeating or losing lines.

The position is a byte offset (exact: the host's own count, from the last complete read) plus
the whole lines printed since (newlines survive decoding and masking; bytes might not). The
host turns it back into a byte offset. It lives in ``<root>/logs/<host>/jobs/<JOB>.pos`` and is
rewritten in place after every printed line; a reader that saw a job's end removes it, so the
next ``logs`` prints the whole log again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..store import Store, host_dir
from .remote import JOB_HEADER, is_result_line

WIDTH = 200  # bytes of the position file: rewritten in place, never shorter


@dataclass(frozen=True)
class Position:
    job: str  # the id it belongs to ("" when not known yet)
    offset: int = 0
    lines: int = 0


def position_path(store: Store, host: str, ref: str) -> Path:
    return store.root / "logs" / host_dir(host) / "jobs" / f"{ref}.pos"


def load(path: Path) -> Position:
    try:
        doc = json.loads(path.read_text())
        return Position(str(doc["job"]), int(doc["offset"]), int(doc["lines"]))
    except (OSError, ValueError, KeyError, TypeError):
        return Position("")


class Reader:
    """Prints a followed log's lines (never the runtime's result line, nor the one blank line
    that comes with it), counts them and keeps the position on disk as it goes."""

    def __init__(self, path: Path, start: Position, emit: Callable[[str], None]):
        self.path, self.start, self.emit = path, start, emit
        self.job = start.job
        self.lines = start.lines
        self.blanks = 0  # blank lines held back: the last one may be the result line's
        self.fd: int | None = None
        self.header = False

    def on_line(self, line: str) -> None:
        if not self.header and line.startswith(JOB_HEADER):
            # the stream's first line names the job the host found for the JOB asked for
            self.header = True
            self.on_job(line.removeprefix(JOB_HEADER).strip())
            return
        if is_result_line(line):
            return
        if line == "":
            self.blanks += 1
            return
        for _ in range(self.blanks):
            self._print("")
        self.blanks = 0
        self._print(line)

    def on_job(self, job: str) -> None:
        """The job the host streams; a position kept for another job (an older one of the same
        name) does not apply: the host starts it from 0, and so does the count."""
        if job != self.start.job:
            self.start = Position(job)
            self.lines = 0
        self.job = job

    def _print(self, line: str) -> None:
        self.emit(line)
        self.lines += 1
        self._save(Position(self.job, self.start.offset, self.lines))

    def _save(self, pos: Position) -> None:
        text = json.dumps({"job": pos.job, "offset": pos.offset, "lines": pos.lines})
        if self.fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        os.pwrite(self.fd, text.ljust(WIDTH).encode(), 0)

    def finished(self, size: int, ended: bool) -> None:
        """The host's stream ended: the blank lines held back were real but the last, the
        position is the host's byte count; none is kept once the job has ended."""
        for _ in range(max(0, self.blanks - 1)):
            self.emit("")
        self.blanks = 0
        if ended:
            self.close()
            self.path.unlink(missing_ok=True)
        else:
            self.start = Position(self.job, size, 0)
            self.lines = 0
            self._save(self.start)
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
