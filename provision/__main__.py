"""``python -m provision`` is the ``gpu-provision`` program."""

from .cli.entry import main

main()
