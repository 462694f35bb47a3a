"""``python -m provision`` is the ``gpu-provision`` program."""

from .cli import main

main()
