"""Print the ``expect`` block the planner gives a case file, to write or review one:
``python -m tests.cases.plan_case tests/cases/plan/NAME.yaml``. Read it before you paste it: the
case file is the decision table a reviewer checks, not a recording."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tests.cases import case_plan, expectation


def main() -> int:
    for arg in sys.argv[1:]:
        _, plan = case_plan(Path(arg))
        print(f"# {arg}")
        print(yaml.safe_dump({"expect": expectation(plan)}, sort_keys=False, width=100,
                             allow_unicode=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
