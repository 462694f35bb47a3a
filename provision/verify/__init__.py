"""The shipped pytest-testinfra suite that checks a provisioned host (see test_host.py)."""

from pathlib import Path

SUITE = Path(__file__).parent
