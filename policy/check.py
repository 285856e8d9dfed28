"""Run the platform rules over a rendered plan offline.

Usage: python -m policy.check out/dev/plan.json
"""

import json
import sys

from policy.rules import evaluate, from_plan


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m policy.check PLAN_JSON", file=sys.stderr)
        return 2
    with open(argv[0]) as fh:
        violations = evaluate(from_plan(json.load(fh)))
    for v in violations:
        print(f"{v.rule}: {v.urn}: {v.message}")
    print(f"policy: {len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
