"""The config reference (docs/reference.md), generated from the settings classes (the single source of
defaults, types and descriptions). ``--check`` fails when docs/reference.md is out of date.

Usage: python -m tools.config_docs [--write | --check] [docs/reference.md]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from config.schema import PROJECT
from config.schema_docs import describe
from config.settings import SECTIONS

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def table() -> str:
    lines = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    for section, cls in SECTIONS.items():
        for key, typ, default, doc in describe(cls, prefix=f"{section}."):
            lines.append(f"| `{PROJECT}:{key}` | {typ} | `{default}` | {doc.replace('|', '/')} |")
    return "\n".join(lines)


def render(readme: str) -> str:
    head, _, rest = readme.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("readme", nargs="?", default="docs/reference.md")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    path = pathlib.Path(args.readme)
    text = path.read_text()
    if START not in text or END not in text:
        print(f"{path}: no {START} ... {END} block", file=sys.stderr)
        return 2
    new = render(text)
    if args.write:
        path.write_text(new)
        return 0
    if args.check and new != text:
        print(f"{path}: config reference is out of date; run make docs", file=sys.stderr)
        return 1
    if not args.check:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
