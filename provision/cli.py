"""The ``gpu-provision`` console script: a Fabric program carrying the project's tasks."""

from __future__ import annotations

from fabric import Config
from fabric.main import Fab
from invoke.collection import Collection

from . import __version__, tasks
from .parallel import ParallelExecutor

namespace = Collection.from_module(tasks)

program = Fab(name="gpu-provision", version=__version__, namespace=namespace,
              executor_class=ParallelExecutor, config_class=Config)


def main() -> None:
    program.run()
