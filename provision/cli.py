"""The ``gpu-provision`` console script: a Fabric program carrying the project's tasks."""

from __future__ import annotations

from fabric import Config, Executor
from fabric.main import Fab
from invoke.collection import Collection

from . import __version__, tasks

namespace = Collection.from_module(tasks)

program = Fab(name="gpu-provision", version=__version__, namespace=namespace,
              executor_class=Executor, config_class=Config)


def main() -> None:
    program.run()
