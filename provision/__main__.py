"""``python -m provision`` is the ``gpu-provision`` program."""

from .cli.main import main

main()
