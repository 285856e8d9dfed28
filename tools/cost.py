"""What a stack costs per hour at its configured sizes (config/costs.py, prices in config/prices.yaml).

Usage: python -m tools.cost --stack dev   (make cost STACK=dev); reads Pulumi.<stack>.yaml, needs no
AWS account. Bad config: one line per problem, exit 2. ``--write README.md`` puts the output between
the file's ``<!-- cost:<stack>:start -->`` and ``<!-- cost:<stack>:end -->`` markers (make docs).
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


def markers(stack: str) -> tuple[str, str]:
    return f"<!-- cost:{stack}:start -->", f"<!-- cost:{stack}:end -->"


def with_block(text: str, stack: str, block: str) -> str:
    """``text`` with the stack's cost block replaced by ``block`` (as a code block)."""
    start, end = markers(stack)
    head, found, rest = text.partition(start)
    _, found_end, tail = rest.partition(end)
    if not (found and found_end):
        raise ValueError(f"no {start} ... {end} markers")
    return f"{head}{start}\n```text\n{block}\n```\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    ap.add_argument("--stack", default="dev")
    ap.add_argument("--write", metavar="FILE", help="put the output between the file's cost markers of the stack")
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
    if args.write:
        path = pathlib.Path(args.write)
        path.write_text(with_block(path.read_text(), args.stack, costs.render(est)))
        return 0
    print(costs.render(est))
    return 0


if __name__ == "__main__":
    sys.exit(main())
