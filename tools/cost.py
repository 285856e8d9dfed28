"""What a stack costs per hour at its configured sizes (config/costs.py, prices in config/prices.yaml).

Usage: python -m tools.cost --stack dev   (make cost STACK=dev); reads Pulumi.<stack>.yaml, needs no
AWS account. Bad config: one line per problem, exit 2.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from config import costs
from config.schema import PROJECT, ConfigError, ConfigErrors
from config.settings import load_settings
from config.stack_file import StackFileError, load_stack_file

ROOT = pathlib.Path(__file__).resolve().parent.parent


def estimate_for(stack: str, root: pathlib.Path = ROOT) -> costs.Estimate:
    cfg = load_stack_file(root / f"Pulumi.{stack}.yaml").get("config") or {}
    raw = {k.split(":", 1)[1]: v for k, v in cfg.items() if k.startswith(f"{PROJECT}:")}
    return costs.estimate(load_settings(raw, stack=stack, region=str(cfg.get("aws:region", ""))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    ap.add_argument("--stack", default="dev")
    args = ap.parse_args(argv)
    try:
        est = estimate_for(args.stack)
    except StackFileError as err:
        print(f"cost: {args.stack}: {err}", file=sys.stderr)
        return 2
    except ConfigError as err:
        for problem in err.errors if isinstance(err, ConfigErrors) else [err]:
            print(f"cost: {args.stack}: {problem}", file=sys.stderr)
        return 2
    print(costs.render(est))
    return 0


if __name__ == "__main__":
    sys.exit(main())
